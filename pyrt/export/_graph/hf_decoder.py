"""Hugging Face causal LMs as ExecuTorch LLM ``forward(tokens, input_pos) -> logits`` modules.

Two routes build the module that ``torch.export`` sees:

- ``"upstream"``: ``transformers.integrations.executorch`` (``TorchExportableModuleWithStaticCache``),
  the route the ecosystem documents. Under torch 2.13 a dynamic-length export of it fails in
  ``run_decompositions`` ("expected compiled_fn to be GraphModule"), so it serves fixed shapes only.
- ``"pyrt"``: :class:`DecoderModule`, pyrt's own wrapper: the model's forward with a
  ``transformers.StaticCache`` whose key/value tensors are registered buffers, written with
  ``index_copy_`` at ``input_pos`` (no position counter in the graph), so prefill and decode are
  one method and the sequence length may be dynamic.

Both take ``tokens [batch, seq] int64`` and ``input_pos [seq] int64`` and return logits
``[batch, seq, vocab]``; the cache lives in the program's state between calls.
"""

from __future__ import annotations

import functools
import mmap
from typing import Any

import torch

from pyrt.errors import ExportError


def text_config(model: Any) -> Any:
    """The decoder's config (``model.config``, or its text part for multimodal configs)."""
    config = getattr(model, "config", None)
    if config is None:
        raise ExportError(f"model {type(model).__name__} has no .config: pass a Hugging Face causal LM "
                          "(a transformers PreTrainedModel with a language-model head)")
    getter = getattr(config, "get_text_config", None)
    return getter() if callable(getter) else config


def untouched_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: Any = "cpu") -> torch.Tensor:
    """Zeros that take no memory until written: on the CPU, a tensor over an anonymous mapping whose pages
    the kernel supplies zeroed on first touch (``torch.zeros`` writes every byte, so a KV cache of
    gigabytes would be resident for the whole export although only its shape and zeros are needed).

    >>> untouched_zeros((2, 3), torch.float16).sum().item()
    0.0
    """
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    count = 1
    for d in shape:
        count *= d
    size = count * torch.empty((), dtype=dtype).element_size()
    if size == 0:
        return torch.zeros(shape, dtype=dtype)
    return torch.frombuffer(mmap.mmap(-1, size), dtype=dtype).view(shape)


@functools.cache
def _position_layer_class() -> Any:
    from transformers.cache_utils import StaticLayer

    class PositionLayer(StaticLayer):
        """A static layer that writes new keys/values at explicit positions (``self.position``)."""

        position: torch.Tensor
        keys: Any
        values: Any

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
                   ) -> tuple[torch.Tensor, torch.Tensor]:
            self.keys.index_copy_(2, self.position, key_states)
            self.values.index_copy_(2, self.position, value_states)
            return self.keys, self.values

        def get_seq_length(self) -> Any:
            """Tokens before this call: the first new position (the mask's query offset)."""
            return self.position[0]

    return PositionLayer


class DecoderModule(torch.nn.Module):
    """pyrt's route: ``forward(tokens [B, T] int64, input_pos [T] int64) -> logits [B, T, vocab]``.

    The cache tensors are registered (non-persistent) buffers named ``key_cache_N`` /
    ``value_cache_N``; ``torch.export`` turns them into mutable program state.
    """

    def __init__(self, model: Any, max_seq_len: int, batch_size: int = 1) -> None:
        super().__init__()
        from transformers import StaticCache
        from transformers.configuration_utils import get_head_shapes

        config = text_config(model)
        self.model = model
        self.cache = StaticCache(max_cache_len=max_seq_len, config=config)
        layer_class = _position_layer_class()
        self.layers: list[Any] = [layer_class(max_seq_len) for _ in self.cache.layers]
        self.cache.layers[:] = self.layers
        heads, head_dim = get_head_shapes(config)
        first = next(model.parameters())
        self.cache.early_initialization(batch_size, heads, head_dim, first.dtype, first.device)
        for i, layer in enumerate(self.layers):
            layer.keys = untouched_zeros(tuple(layer.keys.shape), layer.keys.dtype, layer.keys.device)
            layer.values = untouched_zeros(tuple(layer.values.shape), layer.values.dtype, layer.values.device)
            self.register_buffer(f"key_cache_{i}", layer.keys, persistent=False)
            self.register_buffer(f"value_cache_{i}", layer.values, persistent=False)

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):  # the buffers, as export lifted them
            layer.keys, layer.values = getattr(self, f"key_cache_{i}"), getattr(self, f"value_cache_{i}")
            layer.position = input_pos
        position_ids = input_pos.unsqueeze(0).expand(tokens.shape[0], -1)
        out = self.model(input_ids=tokens, position_ids=position_ids, cache=self.cache, use_cache=True)
        return out.logits


class UpstreamModule(torch.nn.Module):
    """The upstream route, with the convention's positional inputs: ``forward(tokens, input_pos)``."""

    def __init__(self, model: Any, max_seq_len: int, batch_size: int = 1) -> None:
        super().__init__()
        from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

        generation = getattr(model, "generation_config", None)
        saved = None if generation is None else (generation.cache_implementation, generation.use_cache)
        try:  # the recipe insists on a static-cache generation config; the caller's model keeps its own
            if generation is not None:
                generation.cache_implementation, generation.use_cache = "static", True
            self.inner = TorchExportableModuleWithStaticCache(model, batch_size, max_seq_len)
        finally:
            if generation is not None and saved is not None:
                generation.cache_implementation, generation.use_cache = saved

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.inner(input_ids=tokens, cache_position=input_pos)
        return logits


def wrap(route: str, model: Any, max_seq_len: int, batch_size: int) -> torch.nn.Module:
    """The module for ``route`` ("upstream" or "pyrt"); transformers' errors become ExportError."""
    try:
        if route == "upstream":
            return UpstreamModule(model, max_seq_len, batch_size).eval()
        return DecoderModule(model, max_seq_len, batch_size).eval()
    except ExportError:
        raise
    except Exception as exc:  # transformers raises many types for models it cannot cache
        raise ExportError(f"route {route!r}: wrapping {type(model).__name__} with a static cache failed: "
                          f"{type(exc).__name__}: {exc}") from exc


def export(module: torch.nn.Module, route: str, batch_size: int, max_seq_len: int, dynamic: bool
           ) -> torch.export.ExportedProgram:
    """torch.export the wrapped decoder; ``dynamic``: the sequence length runs 1..max_seq_len."""
    seq = 2 if dynamic else 1
    example = (torch.zeros(batch_size, seq, dtype=torch.long), torch.arange(seq, dtype=torch.long))
    shapes = None
    if dynamic:
        dim = torch.export.Dim("seq", min=1, max=max_seq_len)
        shapes = ({1: dim}, {0: dim})
    try:
        with torch.no_grad():
            return torch.export.export(module, example, dynamic_shapes=shapes, strict=route == "upstream")
    except Exception as exc:  # torch.export raises many error types
        raise ExportError(f"route {route!r}: torch.export of the decoder failed: {type(exc).__name__}: {exc}"
                          ) from exc

