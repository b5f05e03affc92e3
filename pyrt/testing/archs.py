"""Small random-init models of real architectures (Hugging Face ``transformers``), built in code.

For export tests, runtime tests and benchmarks: no downloads, a few hundred KiB of
weights each, the same operator mix as the full-size models. Each architecture has
one builder; the sizes its uses need differ, so a builder takes the ``variant``:

* ``export`` (:func:`build`): one tensor in, one tensor out (logits, else the last
  hidden state), vocabulary :data:`VOCAB`, dynamic batch and sequence
  (:func:`dynamic_shapes`); the export tests and benchmarks;
* ``runtime`` (:func:`runtime_model`, :func:`export_pte`): the models with their task
  heads (classifiers, LM heads), vocabulary 96, exported by ExecuTorch's own lowering
  for the runtime tests and benchmarks, together with Swin, Wav2Vec2 and an LSTM;
* ``llm`` (:func:`causal_lm`): causal LMs of eight families with bos 1, eos 2 and
  pad 0, for ``decoder_to_pte`` and ``pyrt.generate``; ``llm_small`` is the same with
  hidden size 256 and vocabulary 2048 (``benchmarks/bench_llm.py --size small``).

The same seed gives the same weights every time, so tests may compare outputs bitwise.

>>> import pyrt.testing.archs as archs
>>> sorted(archs.NAMES)
['bert', 'gpt2', 'llama', 'resnet', 'vit']
>>> model, x = archs.build("bert")                        # doctest: +SKIP
>>> archs.dynamic_shapes("bert")                          # doctest: +SKIP
({0: Dim('batch', min=1, max=4), 1: Dim('seq', min=2, max=32)},)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyrt.errors import PyrtError

NAMES = ("gpt2", "llama", "bert", "vit", "resnet")
TOKENS = ("gpt2", "llama", "bert")  # models that take token ids (batch, seq); the others images
VOCAB = 100
POSITIONS = 64
VARIANTS = ("export", "runtime", "llm", "llm_small")
# The runtime set, in the order the benchmarks' tables list them.
RUNTIME = ("gpt2", "bert", "llama", "vit", "resnet", "swin", "wav2vec2", "lstm")
LLM_FAMILIES = ("llama", "qwen2", "mistral", "gemma", "phi3", "gpt2", "gpt_neox", "opt")
_LLM_COMMON: dict[str, Any] = {"vocab_size": VOCAB, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}


def build(name: str, layers: int = 2, seed: int = 0) -> tuple[Any, Any]:
    """(model in eval mode, an example input) for architecture ``name``: its ``export`` variant."""
    import torch

    if name not in NAMES:
        raise PyrtError(f"architecture {name!r} is not one of {', '.join(NAMES)}")
    torch.manual_seed(seed)
    model = _single_class()(_ARCHS[name]("export", layers), name).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    if name in TOKENS:
        return model, torch.randint(0, VOCAB, (2, 8), generator=generator)
    return model, torch.randn(2, 3, 32, 32, generator=generator)


def example(name: str, size: tuple[int, ...], seed: int = 0) -> Any:
    """An input of ``size`` for ``name``: token ids or an image batch."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    if name in TOKENS:
        return torch.randint(0, VOCAB, size, generator=generator)
    return torch.randn(size, generator=generator)


def dynamic_shapes(name: str) -> tuple[dict[int, Any]]:
    """torch.export dynamic shapes: batch 1..4, and sequence 2..32 for token models."""
    from torch.export import Dim

    batch = Dim("batch", min=1, max=4)
    if name in TOKENS:
        return ({0: batch, 1: Dim("seq", min=2, max=32)},)
    return ({0: batch},)


def sizes(name: str) -> list[tuple[int, ...]]:
    """Input sizes inside :func:`dynamic_shapes`' range, its corners included."""
    if name in TOKENS:
        return [(2, 8), (1, 2), (4, 32), (3, 5)]
    return [(2, 3, 32, 32), (1, 3, 32, 32), (4, 3, 32, 32)]


@functools.cache
def _single_class() -> Any:
    """The wrapper module class (defined on first use: this module imports torch lazily)."""
    import torch

    class Single(torch.nn.Module):
        """One tensor in, one tensor out: logits, else the last hidden state."""

        def __init__(self, model: torch.nn.Module, name: str) -> None:
            super().__init__()
            self.model, self.causal = model, name in ("gpt2", "llama")

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = self.model(x, use_cache=False) if self.causal else self.model(x)
            return out.logits if hasattr(out, "logits") else out.last_hidden_state

    return Single


def _pick(name: str, variant: str, table: dict[str, Any]) -> Any:
    """``table[variant]``, or a PyrtError naming the variants ``name`` has."""
    if variant not in table:
        raise PyrtError(f"{name} has no variant {variant!r} (it has {', '.join(table)})")
    return table[variant]


# -- one builder per architecture ------------------------------------------------------------------


def gpt2(variant: str = "export", layers: int = 2) -> Any:
    """GPT-2 with its LM head: 2 heads, width 32 (``llm_small``: 4 heads, width 256)."""
    import transformers as tf

    config = _pick("gpt2", variant, {
        "export": {"vocab_size": VOCAB, "n_positions": POSITIONS, "bos_token_id": 0, "eos_token_id": 0},
        "runtime": {"vocab_size": 96, "n_positions": 32},
        "llm": {"n_positions": POSITIONS, **_LLM_COMMON},
        "llm_small": {"n_head": 4, "n_embd": 256, "n_positions": 256, "vocab_size": 2048, "bos_token_id": 1,
                      "eos_token_id": 2},
    })
    return tf.GPT2LMHeadModel(tf.GPT2Config(**{"n_layer": layers, "n_head": 2, "n_embd": 32, **config}))


def llama(variant: str = "export", layers: int = 2) -> Any:
    """Llama with its LM head; grouped-query attention in every variant."""
    import transformers as tf

    if variant in ("llm", "llm_small"):
        config = decoder_config(variant, layers, num_key_value_heads=2)
    else:
        config = {"num_hidden_layers": layers, "hidden_size": 32, "intermediate_size": 64, **_pick("llama", variant, {
            "export": {"num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": VOCAB,
                       "max_position_embeddings": POSITIONS, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0},
            "runtime": {"num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 96,
                        "max_position_embeddings": 32},
        })}
    return tf.LlamaForCausalLM(tf.LlamaConfig(**config))


def bert(variant: str = "export", layers: int = 2) -> Any:
    """BERT: the encoder without pooler (``export``) or a sequence classifier (``runtime``)."""
    import transformers as tf

    words: dict[str, Any] = _pick("bert", variant, {
        "export": {"vocab_size": VOCAB, "max_position_embeddings": POSITIONS},
        "runtime": {"vocab_size": 96, "max_position_embeddings": 32}})
    config = tf.BertConfig(num_hidden_layers=layers, num_attention_heads=2, hidden_size=32, intermediate_size=64,
                           **words)
    if variant == "runtime":
        return tf.BertForSequenceClassification(config)
    return tf.BertModel(config, add_pooling_layer=False)


def vit(variant: str = "export", layers: int = 2) -> Any:
    """ViT: 32x32 images in 8x8 patches without pooler (``export``), or a 5-class classifier of 16x16 in 4x4."""
    import transformers as tf

    images: dict[str, Any] = _pick("vit", variant, {"export": {"image_size": 32, "patch_size": 8},
                                                    "runtime": {"image_size": 16, "patch_size": 4, "num_labels": 5}})
    config = tf.ViTConfig(num_hidden_layers=layers, num_attention_heads=2, hidden_size=32, intermediate_size=64,
                          num_channels=3, **images)
    if variant == "runtime":
        return tf.ViTForImageClassification(config)
    return tf.ViTModel(config, add_pooling_layer=False)


def resnet(variant: str = "export", layers: int = 2) -> Any:
    """ResNet of ``layers`` stages, one block each: width 16 (``export``), or a 5-class classifier of width 8."""
    import transformers as tf

    width, labels = _pick("resnet", variant, {"export": (16, {}), "runtime": (8, {"num_labels": 5})})
    stages = max(layers, 1)
    config = tf.ResNetConfig(embedding_size=width, hidden_sizes=[width, 2 * width][:stages], depths=[1] * stages,
                             num_channels=3, **labels)
    if variant == "runtime":
        return tf.ResNetForImageClassification(config)
    return tf.ResNetModel(config)


def swin() -> Any:
    """Swin (``runtime`` only): its windows lower to ``as_strided_copy``."""
    import transformers as tf

    config: dict[str, Any] = {"image_size": 32, "patch_size": 4, "num_channels": 3, "embed_dim": 16, "depths": [1, 1],
                              "num_heads": [2, 2], "window_size": 4, "num_labels": 5}
    return tf.SwinForImageClassification(tf.SwinConfig(**config))


def wav2vec2() -> Any:
    """Wav2Vec2 for CTC (``runtime`` only): ``native_group_norm`` in its feature encoder."""
    import transformers as tf

    return tf.Wav2Vec2ForCTC(tf.Wav2Vec2Config(
        vocab_size=16, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=4,
        num_conv_pos_embedding_groups=2, do_stable_layer_norm=False))


def lstm() -> Any:
    """A one-layer LSTM tagger (``runtime`` only): 8 features in, 4 tags out per step."""
    import torch

    class Tagger(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = torch.nn.LSTM(8, 16, num_layers=1, batch_first=True)
            self.head = torch.nn.Linear(16, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.rnn(x)[0])

    return Tagger()


def decoder_config(variant: str = "llm", layers: int = 2, **extra: Any) -> dict[str, Any]:
    """The config arguments the ``llm`` decoder families share (``extra`` added or replacing)."""
    return {"num_hidden_layers": layers, **_pick("decoder", variant, {
        "llm": {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4,
                "max_position_embeddings": POSITIONS, **_LLM_COMMON},
        "llm_small": {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4,
                      "num_key_value_heads": 2, "vocab_size": 2048, "max_position_embeddings": 256,
                      "bos_token_id": 1, "eos_token_id": 2},
    }), **extra}


def qwen2(variant: str = "llm", layers: int = 2) -> Any:
    import transformers as tf

    return tf.Qwen2ForCausalLM(tf.Qwen2Config(**decoder_config(variant, layers, num_key_value_heads=2)))


def mistral(variant: str = "llm", layers: int = 2) -> Any:
    import transformers as tf

    return tf.MistralForCausalLM(tf.MistralConfig(**decoder_config(variant, layers, num_key_value_heads=2,
                                                                   sliding_window=None)))


def gemma(variant: str = "llm", layers: int = 2) -> Any:
    import transformers as tf

    return tf.GemmaForCausalLM(tf.GemmaConfig(**decoder_config(variant, layers, num_key_value_heads=1, head_dim=8)))


def phi3(variant: str = "llm", layers: int = 2) -> Any:
    import transformers as tf

    config = tf.Phi3Config(**decoder_config(variant, layers, num_key_value_heads=2,
                                            original_max_position_embeddings=POSITIONS))
    return tf.Phi3ForCausalLM(config)


def gpt_neox(variant: str = "llm", layers: int = 2) -> Any:
    import transformers as tf

    return tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(**decoder_config(variant, layers)))


def opt(variant: str = "llm", layers: int = 2) -> Any:
    import transformers as tf

    _pick("opt", variant, {"llm": None})
    return tf.OPTForCausalLM(tf.OPTConfig(num_hidden_layers=layers, hidden_size=32, ffn_dim=64, num_attention_heads=2,
                                          word_embed_proj_dim=32, max_position_embeddings=POSITIONS, **_LLM_COMMON))


_ARCHS: dict[str, Callable[..., Any]] = {
    "gpt2": gpt2, "llama": llama, "bert": bert, "vit": vit, "resnet": resnet, "swin": swin, "wav2vec2": wav2vec2,
    "lstm": lstm, "qwen2": qwen2, "mistral": mistral, "gemma": gemma, "phi3": phi3, "gpt_neox": gpt_neox, "opt": opt,
}


# -- the runtime set: ExecuTorch-exported programs -------------------------------------------------


@functools.cache
def _logits_class() -> Any:
    """Wraps a transformers model so export sees tensors in, one tensor out."""
    import torch

    class _Logits(torch.nn.Module):
        def __init__(self, model: torch.nn.Module, field: str = "logits") -> None:
            super().__init__()
            self.model, self.field = model, field

        def forward(self, *args: Any) -> Any:
            return getattr(self.model(*args), self.field)

    return _Logits


def runtime_model(name: str) -> tuple[Any, tuple[Any, ...]]:
    """(model, example inputs) for ``name`` in :data:`RUNTIME`: its ``runtime`` variant, inputs of batch 1.

    The model's weights come from torch's global generator (seed it first); the inputs have their own.
    """
    import torch

    if name not in RUNTIME:
        raise PyrtError(f"architecture {name!r} is not one of {', '.join(RUNTIME)}")
    generator = torch.Generator().manual_seed(0)
    if name == "lstm":
        return lstm(), (torch.randn(1, 5, 8, generator=generator),)
    model = _logits_class()(_ARCHS[name]() if name in ("swin", "wav2vec2") else _ARCHS[name]("runtime"))
    if name in TOKENS:
        return model, (torch.randint(0, 96, (1, 8), generator=generator),)
    if name == "wav2vec2":
        return model, (torch.randn(1, 400, generator=generator),)
    side = 16 if name == "vit" else 32
    return model, (torch.randn(1, 3, side, side, generator=generator),)


def export_pte(name: str, path: Path, *, dynamic_seq: bool = False) -> tuple[Any, ...]:
    """Export :func:`runtime_model` ``name`` (seed 0) to ``path`` with ExecuTorch; returns its example inputs.

    ``dynamic_seq``: the token models' sequence dim is dynamic (bound 16).

    >>> sorted(RUNTIME)[:3]                                              # doctest: +SKIP
    ['bert', 'gpt2', 'llama']
    """
    import torch
    from executorch.exir import to_edge

    torch.manual_seed(0)
    model, inputs = runtime_model(name)
    model.eval()
    shapes = None
    if dynamic_seq:
        shapes = (({1: torch.export.Dim("seq", min=2, max=16)},),)  # forward(*args): one tuple of args
    with torch.no_grad():
        ep = torch.export.export(model, inputs, dynamic_shapes=shapes)
    prog = to_edge(ep).to_executorch()
    Path(path).write_bytes(prog.buffer)
    return inputs


# -- causal LMs ------------------------------------------------------------------------------------


def causal_lm(name: str, seed: int = 0, variant: str = "llm", layers: int = 2) -> Any:
    """Family ``name``'s causal LM (``llm`` or ``llm_small``), random weights from ``seed``, in eval mode.

    >>> sorted(LLM_FAMILIES)                                                    # doctest: +SKIP
    ['gemma', 'gpt2', 'gpt_neox', 'llama', 'mistral', 'opt', 'phi3', 'qwen2']
    """
    import torch

    if name not in LLM_FAMILIES:
        raise PyrtError(f"family {name!r} is not one of {', '.join(LLM_FAMILIES)}")
    torch.manual_seed(seed)
    return _ARCHS[name](variant, layers).eval()


def kv_decoder(layers: int = 2, max_len: int = 64, seed: int = 0) -> Any:
    """A decoder with a static KV cache in registered buffers (``index_copy_`` at ``pos``).

    ``forward(tokens [1, T] int64, pos [T] int64) -> logits [1, T, VOCAB]`` writes the
    new keys and values at ``pos`` and attends over positions ``<= pos`` (a causal mask
    over the whole cache), so prefill (T > 1) and decode (T = 1) are one method.

    >>> import torch
    >>> model = kv_decoder()                                                   # doctest: +SKIP
    >>> model(torch.tensor([[5, 7]]), torch.tensor([0, 1])).shape              # doctest: +SKIP
    torch.Size([1, 2, 100])
    """
    import torch

    torch.manual_seed(seed)
    return _kv_class()(layers, max_len).eval()


def greedy(model: Any, prompt: list[int], new_tokens: int) -> list[int]:
    """Greedy decoding: ``new_tokens`` after ``prompt``, never stopping early (no EOS).

    ``model`` is a transformers causal LM, decoded by its own ``generate(do_sample=False)``
    (transformers' loop and cache: the reference an export is checked against), or a step
    ``step(tokens [1, T], pos [T]) -> logits``, called for the prompt, then one token at a time.
    """
    import numpy as np
    import torch

    if hasattr(model, "generate"):
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
        return [int(t) for t in out[0, len(prompt):]]
    logits = model(torch.tensor([prompt]), torch.arange(len(prompt)))
    tokens: list[int] = []
    for i in range(new_tokens):
        token = int(np.asarray(logits)[0, -1].argmax())
        tokens.append(token)
        if i + 1 < new_tokens:
            logits = model(torch.tensor([[token]]), torch.tensor([len(prompt) + i]))
    return tokens


@functools.cache
def _kv_class() -> Any:
    import torch
    from torch import nn

    class KVDecoder(nn.Module):
        """Llama-like blocks (RMSNorm, causal attention, SiLU MLP) over a static cache."""

        def __init__(self, layers: int, max_len: int, dim: int = 32, heads: int = 2) -> None:
            super().__init__()
            self.heads, self.head_dim, self.max_len = heads, dim // heads, max_len
            self.embed = nn.Embedding(VOCAB, dim)
            self.blocks = nn.ModuleList()
            for i in range(layers):
                block = nn.ModuleDict({"norm1": nn.RMSNorm(dim), "qkv": nn.Linear(dim, 3 * dim, bias=False),
                                       "out": nn.Linear(dim, dim, bias=False), "norm2": nn.RMSNorm(dim),
                                       "up": nn.Linear(dim, 2 * dim, bias=False),
                                       "down": nn.Linear(2 * dim, dim, bias=False)})
                self.blocks.append(block)
                self.register_buffer(f"k_cache_{i}", torch.zeros(1, heads, max_len, self.head_dim))
                self.register_buffer(f"v_cache_{i}", torch.zeros(1, heads, max_len, self.head_dim))
            self.norm = nn.RMSNorm(dim)
            self.head = nn.Linear(dim, VOCAB, bias=False)

        def forward(self, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
            x = self.embed(tokens)
            seq = tokens.shape[1]
            visible = torch.arange(self.max_len).unsqueeze(0) <= pos.unsqueeze(1)  # [T, max_len]
            mask = torch.zeros(seq, self.max_len).masked_fill(~visible, float("-inf"))
            blocks: Any = self.blocks  # ModuleDicts (a ModuleList types its items as Module)
            for i, block in enumerate(blocks):
                h = block["norm1"](x)
                q, k, v = block["qkv"](h).view(1, seq, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
                k_cache, v_cache = getattr(self, f"k_cache_{i}"), getattr(self, f"v_cache_{i}")
                k_cache.index_copy_(2, pos, k)
                v_cache.index_copy_(2, pos, v)
                scores = q @ k_cache.transpose(-1, -2) / self.head_dim ** 0.5 + mask
                att = torch.softmax(scores, -1) @ v_cache
                x = x + block["out"](att.transpose(1, 2).reshape(1, seq, -1))
                x = x + block["down"](torch.nn.functional.silu(block["up"](block["norm2"](x))))
            return self.head(self.norm(x))

    return KVDecoder
