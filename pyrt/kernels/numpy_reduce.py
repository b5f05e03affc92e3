"""numpy kernels, reductions: sums, means, extremes and their indices, variance, top-k, softmax.

>>> import numpy as np
>>> from pyrt.kernels.numpy_base import _OPS
>>> _OPS["aten::sum.IntList_out"].fn(np.ones((2, 3)), [1], False, None).tolist()
[3.0, 3.0]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pyrt.errors import InputError
from pyrt.kernels.numpy_base import _axes, _dt, _float, op


@op("aten::sum.IntList_out", n_in=4)
def _sum(a: Any, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Any:
    return np.sum(a, axis=_axes(dim, a.ndim), keepdims=bool(keepdim), dtype=_dt(dtype))


@op("aten::mean.out", n_in=4)
def _mean(a: Any, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Any:
    dt = _dt(dtype) or _float(a).dtype
    return np.mean(a, axis=_axes(dim, a.ndim), keepdims=bool(keepdim), dtype=np.float64).astype(dt)


@op("aten::amax.out", n_in=3)
def _amax(a: Any, dim: Any = (), keepdim: bool = False) -> Any:
    return np.amax(a, axis=_axes(dim, a.ndim), keepdims=bool(keepdim))


@op("aten::amin.out", n_in=3)
def _amin(a: Any, dim: Any = (), keepdim: bool = False) -> Any:
    return np.amin(a, axis=_axes(dim, a.ndim), keepdims=bool(keepdim))


@op("aten::argmax.out", n_in=3)
def _argmax(a: Any, dim: Any = None, keepdim: bool = False) -> Any:
    return np.argmax(a, axis=None if dim is None else dim % max(a.ndim, 1), keepdims=bool(keepdim))


@op("aten::argmin.out", n_in=3)
def _argmin(a: Any, dim: Any = None, keepdim: bool = False) -> Any:
    return np.argmin(a, axis=None if dim is None else dim % max(a.ndim, 1), keepdims=bool(keepdim))


@op("aten::max.dim_max", n_in=3, n_out=2)
def _max_dim(a: Any, dim: int, keepdim: bool = False) -> tuple[Any, Any]:
    d = dim % max(a.ndim, 1)
    return np.amax(a, axis=d, keepdims=bool(keepdim)), np.argmax(a, axis=d, keepdims=bool(keepdim))


@op("aten::min.dim_min", n_in=3, n_out=2)
def _min_dim(a: Any, dim: int, keepdim: bool = False) -> tuple[Any, Any]:
    d = dim % max(a.ndim, 1)
    return np.amin(a, axis=d, keepdims=bool(keepdim)), np.argmin(a, axis=d, keepdims=bool(keepdim))


@op("aten::var.correction_out", n_in=4)
def _var(a: Any, dim: Any = None, correction: Any = None, keepdim: bool = False) -> Any:
    ddof = 1 if correction is None else correction
    return np.var(a.astype(np.float64), axis=_axes(dim, a.ndim), ddof=ddof, keepdims=bool(keepdim))


@op("aten::prod.int_out", n_in=4)
def _prod(a: Any, dim: int, keepdim: bool = False, dtype: Any = None) -> Any:
    return np.prod(a, axis=dim % max(a.ndim, 1), keepdims=bool(keepdim), dtype=_dt(dtype))


@op("aten::any.all_out", n_in=1)
def _any(a: Any) -> Any:
    return np.any(a)


@op("aten::any.out", "aten::any.dims_out", n_in=3)
def _any_dim(a: Any, dim: Any, keepdim: bool = False) -> Any:
    return np.any(a, axis=_axes(dim, a.ndim), keepdims=bool(keepdim))


@op("aten::cumsum.out", n_in=3)
def _cumsum(a: Any, dim: int, dtype: Any = None) -> Any:
    return np.cumsum(a, axis=dim % max(a.ndim, 1), dtype=_dt(dtype))


@op("aten::_softmax.out", n_in=3)
def _softmax(a: Any, dim: int, half_to_float: Any = False) -> Any:
    x = _float(a).astype(np.float32) if a.dtype == np.float16 else _float(a)
    e = np.exp(x - np.amax(x, axis=dim, keepdims=True))
    return e / np.sum(e, axis=dim, keepdims=True)


@op("aten::_log_softmax.out", n_in=3)
def _log_softmax(a: Any, dim: int, half_to_float: Any = False) -> Any:
    x = _float(a)
    shifted = x - np.amax(x, axis=dim, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=dim, keepdims=True))


@op("aten::mean.dtype_out", n_in=2)
def _mean_all(a: Any, dtype: Any = None) -> Any:
    dt = _dt(dtype) or _float(a).dtype
    return np.mean(a, dtype=np.float64).astype(dt)


@op("aten::max.unary_out", n_in=1)
def _max_all(a: Any) -> Any:
    return np.amax(a)


@op("aten::min.unary_out", n_in=1)
def _min_all(a: Any) -> Any:
    return np.amin(a)


@op("aten::prod.out", n_in=2)
def _prod_all(a: Any, dtype: Any = None) -> Any:
    return np.prod(a, dtype=_dt(dtype))


@op("aten::var.out", n_in=4)
def _var_unbiased(a: Any, dim: Any = None, unbiased: bool = True, keepdim: bool = False) -> Any:
    return np.var(a.astype(np.float64), axis=_axes(dim, a.ndim), ddof=int(bool(unbiased)), keepdims=bool(keepdim))


@op("aten::var_mean.correction_out", n_in=4, n_out=2)
def _var_mean(a: Any, dim: Any = None, correction: Any = None, keepdim: bool = False) -> tuple[Any, Any]:
    ddof = 1 if correction is None else correction
    axes, x = _axes(dim, a.ndim), a.astype(np.float64)
    return np.var(x, axis=axes, ddof=ddof, keepdims=bool(keepdim)), np.mean(x, axis=axes, keepdims=bool(keepdim))


@op("aten::topk.values", n_in=5, n_out=2)
def _topk(a: Any, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> tuple[Any, Any]:
    d = dim % max(a.ndim, 1)
    if not 0 <= k <= a.shape[d]:
        raise InputError(f"topk: k={k} is out of range for dimension {d} of size {a.shape[d]}")
    key = -a if largest else a
    idx = np.take(np.argsort(key, axis=d, kind="stable"), np.arange(k), axis=d)
    return np.take_along_axis(a, idx, axis=d), idx.astype(np.int64)
