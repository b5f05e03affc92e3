"""numpy kernels, indexing: gathers by index or mask, and the scatter and index writes.

>>> import numpy as np
>>> from pyrt.kernels.numpy_base import Operand, Out, Scalar, OPS
>>> OPS["aten::index_select.out"].fn(np.arange(4.0), 0, np.array([3, 0])).tolist()
[3.0, 0.0]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pyrt.errors import InputError
from pyrt.kernels.numpy_base import Operand, Out, Scalar, clip_slice, op


@op("aten::index.Tensor_out", n_in=2)
def _index(a: np.ndarray, indices: Sequence[np.ndarray | None]) -> Out:
    idx = tuple(slice(None) if i is None else (i.astype(bool) if i.dtype == np.bool_ else i) for i in indices)
    try:
        return a[idx]
    except IndexError as exc:
        raise InputError(f"index: {exc}") from None


@op("aten::index_select.out", n_in=3)
def _index_select(a: np.ndarray, dim: int, index: np.ndarray) -> Out:
    return np.take(a, index, axis=dim % max(a.ndim, 1))


@op("aten::embedding.out", n_in=5)
def _embedding(weight: np.ndarray, indices: np.ndarray, padding_idx: int = -1, scale: bool = False,
               sparse: bool = False) -> Out:
    return weight[indices]


@op("aten::gather.out", n_in=4)
def _gather(a: np.ndarray, dim: int, index: np.ndarray, sparse_grad: bool = False) -> Out:
    return np.take_along_axis(a, index, axis=dim % a.ndim)


@op("aten::nonzero.out", n_in=1)
def _nonzero(a: np.ndarray) -> Out:
    return np.argwhere(a).astype(np.int64)


@op("aten::masked_select.out", n_in=2)
def _masked_select(a: np.ndarray, mask: np.ndarray) -> Out:
    a, mask = np.broadcast_arrays(a, mask)
    return a[mask.astype(bool)]


# -- scatter and index writes ----------------------------------------------------------------------------


def _scatter_index(a: np.ndarray, dim: int, index: np.ndarray) -> tuple[np.ndarray, ...]:
    d = dim % max(a.ndim, 1)
    grids: list[np.ndarray] = list(np.indices(index.shape, sparse=True))
    bound = a.shape[d]
    if index.size and (index.min() < -bound or index.max() >= bound):
        raise InputError(f"scatter: index out of range for dimension {d} of size {bound}")
    grids[d] = index
    return tuple(grids)


@op("aten::scatter.src_out", n_in=4)
def _scatter_src(a: np.ndarray, dim: int, index: np.ndarray, src: np.ndarray) -> Out:
    out = a.copy()
    out[_scatter_index(a, dim, index)] = src[tuple(slice(0, n) for n in index.shape)]
    return out


@op("aten::scatter.value_out", n_in=4)
def _scatter_value(a: np.ndarray, dim: int, index: np.ndarray, value: Scalar) -> Out:
    out = a.copy()
    out[_scatter_index(a, dim, index)] = value
    return out


@op("aten::scatter_add.out", n_in=4)
def _scatter_add(a: np.ndarray, dim: int, index: np.ndarray, src: np.ndarray) -> Out:
    out = a.copy()
    np.add.at(out, _scatter_index(a, dim, index), src[tuple(slice(0, n) for n in index.shape)])
    return out


@op("aten::index_put.out", n_in=4)
def _index_put(a: np.ndarray, indices: Sequence[np.ndarray | None], values: Operand, accumulate: bool = False) -> Out:
    out = a.copy()
    put_into(out, indices, values, accumulate)
    return out


def put_into(a: np.ndarray, indices: Sequence[np.ndarray | None], values: Operand, accumulate: bool = False) -> None:
    """``a[indices] = values`` (or ``+=``, each index once per occurrence) in place, as ATen's ``index_put_``."""
    idx: tuple[slice | np.ndarray, ...] = tuple(
        slice(None) if i is None else (i.astype(bool) if i.dtype == np.bool_ else i) for i in indices)
    try:
        if accumulate:
            np.add.at(a, idx, values)  # type: ignore[arg-type]  # numpy's stub omits slices, ufunc.at takes them
        else:
            a[idx] = values
    except IndexError as exc:
        raise InputError(f"index_put: {exc}") from None


@op("aten::copy.out", n_in=3)
def _copy(a: np.ndarray, src: np.ndarray, non_blocking: bool = False) -> Out:
    """``src`` broadcast to ``a``'s shape in ``a``'s dtype; ``a``'s values are not read."""
    try:
        return np.broadcast_to(np.asarray(src).astype(a.dtype, copy=False), a.shape)
    except ValueError:
        raise InputError(f"copy: src of shape {np.shape(src)} does not broadcast to self's shape {a.shape}") from None


@op("aten::slice_scatter.out", n_in=6)
def _slice_scatter(a: np.ndarray, src: np.ndarray, dim: int = 0, start: int | None = None,
                   end: int | None = None, step: int = 1) -> Out:
    d = dim % a.ndim
    index = [slice(None)] * a.ndim
    index[d] = clip_slice(a.shape[d], start, end, int(step))
    out = a.copy()
    out[tuple(index)] = src
    return out


@op("aten::select_scatter.out", n_in=4)
def _select_scatter(a: np.ndarray, src: np.ndarray, dim: int, index: int) -> Out:
    d = dim % a.ndim
    if not -a.shape[d] <= index < a.shape[d]:
        raise InputError(f"select_scatter index {index} out of range for dimension {d} of size {a.shape[d]}")
    out = a.copy()
    sel: list[slice | int] = [slice(None)] * a.ndim
    sel[d] = index
    out[tuple(sel)] = src
    return out
