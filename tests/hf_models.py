"""Real architectures from ``transformers``, tiny random-init configs built in code (no downloads).

Each builder returns ``(model, example_inputs)``; :func:`export_pte` writes the
ExecuTorch program (``torch.export`` + ``to_edge`` + ``to_executorch``) that the
numpy-kernel tests and ``benchmarks/bench_models.py`` run with pyrt and with
ExecuTorch's own runtime.

>>> sorted(BUILDERS)[:3]                                              # doctest: +SKIP
['bert', 'gpt2', 'llama']
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


class _Logits(torch.nn.Module):
    """Wrap a transformers model so export sees tensors in, one tensor out."""

    def __init__(self, model: torch.nn.Module, field: str = "logits") -> None:
        super().__init__()
        self.model, self.field = model, field

    def forward(self, *args: Any) -> Any:
        return getattr(self.model(*args), self.field)


def _tokens(vocab: int, seq: int = 8) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return (torch.randint(0, vocab, (1, seq), generator=g),)


def _image(size: int) -> torch.Tensor:
    return torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(0))


def gpt2() -> tuple[torch.nn.Module, tuple[Any, ...]]:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    return _Logits(GPT2LMHeadModel(cfg)), _tokens(96)


def bert() -> tuple[torch.nn.Module, tuple[Any, ...]]:
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=32)
    return _Logits(BertForSequenceClassification(cfg)), _tokens(96)


def llama() -> tuple[torch.nn.Module, tuple[Any, ...]]:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    return _Logits(LlamaForCausalLM(cfg)), _tokens(96)


def vit() -> tuple[torch.nn.Module, tuple[Any, ...]]:
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=2, intermediate_size=64, num_labels=5)
    return _Logits(ViTForImageClassification(cfg)), (_image(16),)


def resnet() -> tuple[torch.nn.Module, tuple[Any, ...]]:
    from transformers import ResNetConfig, ResNetForImageClassification

    cfg = ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=5)
    return _Logits(ResNetForImageClassification(cfg)), (_image(32),)


def swin() -> tuple[torch.nn.Module, tuple[Any, ...]]:
    from transformers import SwinConfig, SwinForImageClassification

    cfg = SwinConfig(image_size=32, patch_size=4, num_channels=3, embed_dim=16, depths=[1, 1], num_heads=[2, 2],
                     window_size=4, num_labels=5)
    return _Logits(SwinForImageClassification(cfg)), (_image(32),)


def wav2vec2() -> tuple[torch.nn.Module, tuple[Any, ...]]:
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

    cfg = Wav2Vec2Config(vocab_size=16, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64, conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3),
                         num_conv_pos_embeddings=4, num_conv_pos_embedding_groups=2, do_stable_layer_norm=False)
    return _Logits(Wav2Vec2ForCTC(cfg)), (torch.randn(1, 400, generator=torch.Generator().manual_seed(0)),)


def lstm() -> tuple[torch.nn.Module, tuple[Any, ...]]:
    class Tagger(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = torch.nn.LSTM(8, 16, num_layers=1, batch_first=True)
            self.head = torch.nn.Linear(16, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.rnn(x)[0])

    return Tagger(), (torch.randn(1, 5, 8, generator=torch.Generator().manual_seed(0)),)


BUILDERS: dict[str, Callable[[], tuple[torch.nn.Module, tuple[Any, ...]]]] = {
    "gpt2": gpt2, "bert": bert, "llama": llama, "vit": vit, "resnet": resnet,
    "swin": swin, "wav2vec2": wav2vec2, "lstm": lstm,
}


def export_pte(name: str, path: Path, *, dynamic_seq: bool = False) -> tuple[Any, ...]:
    """Export model ``name`` to ``path``; returns its example inputs.

    ``dynamic_seq``: the token models' sequence dim is dynamic (bound 16).
    """
    from executorch.exir import to_edge

    torch.manual_seed(0)
    model, inputs = BUILDERS[name]()
    model.eval()
    shapes = None
    if dynamic_seq:
        shapes = (({1: torch.export.Dim("seq", min=2, max=16)},),)  # forward(*args): one tuple of args
    with torch.no_grad():
        ep = torch.export.export(model, inputs, dynamic_shapes=shapes)
    prog = to_edge(ep).to_executorch()
    Path(path).write_bytes(prog.buffer)
    return inputs
