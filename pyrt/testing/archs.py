"""Small random-init models of real architectures (Hugging Face ``transformers``), built in code.

For export tests and benchmarks: no downloads, a few hundred KiB of weights each,
the same operator mix as the full-size models. Each model takes one tensor and
returns one tensor (logits or the last hidden state), so it exports as it is.

>>> import pyrt.testing.archs as archs
>>> sorted(archs.NAMES)
['bert', 'gpt2', 'llama', 'resnet', 'vit']
>>> model, x = archs.build("bert")                        # doctest: +SKIP
>>> archs.dynamic_shapes("bert")                          # doctest: +SKIP
({0: Dim('batch', min=1, max=4), 1: Dim('seq', min=2, max=32)},)
"""

from __future__ import annotations

import functools
from typing import Any

from pyrt.errors import PyrtError

NAMES = ("gpt2", "llama", "bert", "vit", "resnet")
TOKENS = ("gpt2", "llama", "bert")  # models that take token ids (batch, seq); the others images
VOCAB = 100


def build(name: str, layers: int = 2, seed: int = 0) -> tuple[Any, Any]:
    """(model in eval mode, an example input) for architecture ``name``."""
    import torch

    if name not in NAMES:
        raise PyrtError(f"architecture {name!r} is not one of {', '.join(NAMES)}")
    torch.manual_seed(seed)
    model = _single_class()(_MAKERS[name](layers), name).eval()
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


def _gpt2(layers: int) -> Any:
    import transformers as tf

    return tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=layers, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=64,
                                            bos_token_id=0, eos_token_id=0))


def _llama(layers: int) -> Any:
    import transformers as tf

    return tf.LlamaForCausalLM(tf.LlamaConfig(
        num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1, hidden_size=32, intermediate_size=64,
        vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=0, eos_token_id=0, pad_token_id=0))


def _bert(layers: int) -> Any:
    import transformers as tf

    return tf.BertModel(tf.BertConfig(num_hidden_layers=layers, num_attention_heads=2, hidden_size=32,
                                      intermediate_size=64, vocab_size=VOCAB, max_position_embeddings=64),
                        add_pooling_layer=False)


def _vit(layers: int) -> Any:
    import transformers as tf

    return tf.ViTModel(tf.ViTConfig(num_hidden_layers=layers, num_attention_heads=2, hidden_size=32,
                                    intermediate_size=64, image_size=32, patch_size=8, num_channels=3),
                       add_pooling_layer=False)


def _resnet(layers: int) -> Any:
    import transformers as tf

    return tf.ResNetModel(tf.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32][:max(layers, 1)],
                                          depths=[1] * max(layers, 1), num_channels=3))


_MAKERS = {"gpt2": _gpt2, "llama": _llama, "bert": _bert, "vit": _vit, "resnet": _resnet}


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


def greedy(step: Any, prompt: list[int], new_tokens: int) -> list[int]:
    """Greedy decoding: ``step(tokens [1, T], pos [T]) -> logits``; prefill, then one token at a time."""
    import numpy as np
    import torch

    logits = step(torch.tensor([prompt]), torch.arange(len(prompt)))
    out: list[int] = []
    for i in range(new_tokens):
        token = int(np.asarray(logits)[0, -1].argmax())
        out.append(token)
        if i + 1 < new_tokens:
            logits = step(torch.tensor([[token]]), torch.tensor([len(prompt) + i]))
    return out


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
