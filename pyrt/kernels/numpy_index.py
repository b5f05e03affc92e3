"""numpy kernels, indexing: gathers by index or mask, and the scatter and index writes.

>>> import numpy as np
>>> from pyrt.kernels.numpy_base import _OPS
>>> _OPS["aten::index_select.out"].fn(np.arange(4.0), 0, np.array([3, 0])).tolist()
[3.0, 0.0]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pyrt.errors import InputError
from pyrt.kernels.numpy_base import _clip_slice, op


@op("aten::index.Tensor_out", n_in=2)
def _index(a: Any, indices: Sequence[Any]) -> Any:
    idx = tuple(slice(None) if i is None else (i.astype(bool) if i.dtype == np.bool_ else i) for i in indices)
    try:
        return a[idx]
    except IndexError as exc:
        raise InputError(f"index: {exc}") from None


@op("aten::index_select.out", n_in=3)
def _index_select(a: Any, dim: int, index: Any) -> Any:
    return np.take(a, index, axis=dim % max(a.ndim, 1))


@op("aten::embedding.out", n_in=5)
def _embedding(weight: Any, indices: Any, padding_idx: Any = -1, scale: Any = False, sparse: Any = False) -> Any:
    return weight[indices]


@op("aten::gather.out", n_in=4)
def _gather(a: Any, dim: int, index: Any, sparse_grad: Any = False) -> Any:
    return np.take_along_axis(a, index, axis=dim % a.ndim)


@op("aten::nonzero.out", n_in=1)
def _nonzero(a: Any) -> Any:
    return np.argwhere(a).astype(np.int64)


@op("aten::masked_select.out", n_in=2)
def _masked_select(a: Any, mask: Any) -> Any:
    a, mask = np.broadcast_arrays(a, mask)
    return a[mask.astype(bool)]


# -- scatter and index writes ----------------------------------------------------------------------------


def _scatter_index(a: Any, dim: int, index: Any) -> tuple[Any, ...]:
    d = dim % max(a.ndim, 1)
    grids = list(np.indices(index.shape, sparse=True))
    bound = a.shape[d]
    if index.size and (index.min() < -bound or index.max() >= bound):
        raise InputError(f"scatter: index out of range for dimension {d} of size {bound}")
    grids[d] = index
    return tuple(grids)


@op("aten::scatter.src_out", n_in=4)
def _scatter_src(a: Any, dim: int, index: Any, src: Any) -> Any:
    out = a.copy()
    out[_scatter_index(a, dim, index)] = src[tuple(slice(0, n) for n in index.shape)]
    return out


@op("aten::scatter.value_out", n_in=4)
def _scatter_value(a: Any, dim: int, index: Any, value: Any) -> Any:
    out = a.copy()
    out[_scatter_index(a, dim, index)] = value
    return out


@op("aten::scatter_add.out", n_in=4)
def _scatter_add(a: Any, dim: int, index: Any, src: Any) -> Any:
    out = a.copy()
    np.add.at(out, _scatter_index(a, dim, index), src[tuple(slice(0, n) for n in index.shape)])
    return out


@op("aten::index_put.out", n_in=4)
def _index_put(a: Any, indices: Sequence[Any], values: Any, accumulate: bool = False) -> Any:
    idx: Any = tuple(slice(None) if i is None else (i.astype(bool) if i.dtype == np.bool_ else i) for i in indices)
    out = a.copy()
    try:
        if accumulate:
            np.add.at(out, idx, values)
        else:
            out[idx] = values
    except IndexError as exc:
        raise InputError(f"index_put: {exc}") from None
    return out


@op("aten::slice_scatter.out", n_in=6)
def _slice_scatter(a: Any, src: Any, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> Any:
    d = dim % a.ndim
    index = [slice(None)] * a.ndim
    index[d] = _clip_slice(a.shape[d], start, end, int(step))
    out = a.copy()
    out[tuple(index)] = src
    return out


@op("aten::select_scatter.out", n_in=4)
def _select_scatter(a: Any, src: Any, dim: int, index: int) -> Any:
    d = dim % a.ndim
    if not -a.shape[d] <= index < a.shape[d]:
        raise InputError(f"select_scatter index {index} out of range for dimension {d} of size {a.shape[d]}")
    out = a.copy()
    sel: list[Any] = [slice(None)] * a.ndim
    sel[d] = index
    out[tuple(sel)] = src
    return out
