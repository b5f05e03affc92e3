"""Out-variants torch computes through a clone of ``self``, written straight into ``out`` instead.

ATen's functional ``copy``, ``slice_scatter``, ``select_scatter`` and ``diagonal_scatter`` start
from ``clone_preserve_strides(self)``: a copy of the whole storage behind ``self``. pyrt's
tensors are views of a memory-planned arena, so each call would copy the arena (megabytes)
only to overwrite one slice of the copy (``index_put`` clones only ``self``, then copies the
clone into ``out``: a KV-cache update copied twice). These entry points write ``self`` then
``src`` into ``out`` (the bytes ATen's out wrapper writes) and raise TypeError, before writing
anything, where they do not apply (``out`` not of ``self``'s dtype and shape, ``src`` not
of the slice's shape): :class:`~pyrt.kernels.torch_kernels.TorchLibrary` then calls
``torch.ops``, which writes or raises as ATen does. Host tensors only, as every torch kernel.

>>> import torch
>>> out = torch.empty(2, 3)
>>> slice_scatter(torch.zeros(2, 3), torch.ones(2, 1), 1, 2, None, 1, out=out).tolist()
[[0.0, 0.0, 1.0], [0.0, 0.0, 1.0]]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def _like(out: torch.Tensor, x: torch.Tensor, what: str) -> None:
    if out.dtype != x.dtype or out.shape != x.shape:
        raise TypeError(f"{what}: out differs from self in dtype or shape")


def fill_like(x: torch.Tensor, fill_value: float, *, memory_format: torch.memory_format | None = None,
              out: torch.Tensor) -> torch.Tensor:
    """``full_like.out`` as ``out.fill_``: the same bytes where out has ``x``'s dtype and shape."""
    _like(out, x, "full_like")
    return out.fill_(fill_value)


def copy_into(x: torch.Tensor, src: torch.Tensor, non_blocking: bool = False, *, out: torch.Tensor) -> torch.Tensor:
    """``copy.out``: ``src`` broadcast to ``x``'s shape in ``x``'s dtype (``copy_`` converts and broadcasts)."""
    _like(out, x, "copy")
    return out.copy_(src)


def _scatter(part: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, src: torch.Tensor, out: torch.Tensor,
             what: str) -> torch.Tensor:
    _like(out, x, what)
    target = part(out)
    if target.shape != src.shape:
        raise TypeError(f"{what}: src's shape is not the slice's")
    out.copy_(x)
    target.copy_(src)
    return out


def slice_scatter(x: torch.Tensor, src: torch.Tensor, dim: int = 0, start: Any = None, end: Any = None,
                  step: int = 1, *, out: torch.Tensor) -> torch.Tensor:
    """``slice_scatter.out``."""
    import torch

    return _scatter(lambda t: torch.ops.aten.slice.Tensor(t, dim, start, end, step), x, src, out, "slice_scatter")


def select_scatter(x: torch.Tensor, src: torch.Tensor, dim: int, index: int, *, out: torch.Tensor) -> torch.Tensor:
    """``select_scatter.out``."""
    return _scatter(lambda t: t.select(dim, index), x, src, out, "select_scatter")


def diagonal_scatter(x: torch.Tensor, src: torch.Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1, *,
                     out: torch.Tensor) -> torch.Tensor:
    """``diagonal_scatter.out``."""
    return _scatter(lambda t: t.diagonal(offset, dim1, dim2), x, src, out, "diagonal_scatter")


def index_put_into(x: torch.Tensor, indices: list[torch.Tensor | None], values: torch.Tensor,
                   accumulate: bool = False, *, out: torch.Tensor) -> torch.Tensor:
    """``index_put.out``: ``self`` copied into ``out``, then ``index_put_`` there (bad indices raise as ATen's)."""
    import torch

    _like(out, x, "index_put")
    out.copy_(x)
    return torch.ops.aten.index_put_.default(out, indices, values, accumulate)


ENTRY_POINTS: dict[str, Callable[..., Any]] = {
    "aten::full_like.out": fill_like,
    "aten::copy.out": copy_into,
    "aten::slice_scatter.out": slice_scatter,
    "aten::select_scatter.out": select_scatter,
    "aten::diagonal_scatter.out": diagonal_scatter,
    "aten::index_put.out": index_put_into,
}
