"""numpy kernels, reductions: sums, means, extremes and their indices, variance, top-k, softmax.

>>> import numpy as np
>>> from pyrt.kernels.numpy_base import Dims, Out, Scalar, OPS
>>> OPS["aten::sum.IntList_out"].fn(np.ones((2, 3)), [1], False, None).tolist()
[3.0, 3.0]
"""

from __future__ import annotations

import numpy as np

from pyrt.errors import InputError
from pyrt.kernels.numpy_base import Dims, Out, Scalar, as_float, op, optional_dtype, reduce_axes


@op("aten::sum.IntList_out", n_in=4)
def _sum(a: np.ndarray, dim: Dims = None, keepdim: bool = False, dtype: int | None = None) -> Out:
    return np.sum(a, axis=reduce_axes(dim, a.ndim), keepdims=bool(keepdim), dtype=optional_dtype(dtype))


@op("aten::mean.out", n_in=4)
def _mean(a: np.ndarray, dim: Dims = None, keepdim: bool = False, dtype: int | None = None) -> Out:
    dt = optional_dtype(dtype) or as_float(a).dtype
    return np.mean(a, axis=reduce_axes(dim, a.ndim), keepdims=bool(keepdim), dtype=np.float64).astype(dt)


@op("aten::amax.out", n_in=3)
def _amax(a: np.ndarray, dim: Dims = (), keepdim: bool = False) -> Out:
    return np.amax(a, axis=reduce_axes(dim, a.ndim), keepdims=bool(keepdim))


@op("aten::amin.out", n_in=3)
def _amin(a: np.ndarray, dim: Dims = (), keepdim: bool = False) -> Out:
    return np.amin(a, axis=reduce_axes(dim, a.ndim), keepdims=bool(keepdim))


@op("aten::argmax.out", n_in=3)
def _argmax(a: np.ndarray, dim: int | None = None, keepdim: bool = False) -> Out:
    return np.argmax(a, axis=None if dim is None else dim % max(a.ndim, 1), keepdims=bool(keepdim))


@op("aten::argmin.out", n_in=3)
def _argmin(a: np.ndarray, dim: int | None = None, keepdim: bool = False) -> Out:
    return np.argmin(a, axis=None if dim is None else dim % max(a.ndim, 1), keepdims=bool(keepdim))


@op("aten::max.dim_max", n_in=3, n_out=2)
def _max_dim(a: np.ndarray, dim: int, keepdim: bool = False) -> tuple[Out, Out]:
    d = dim % max(a.ndim, 1)
    return np.amax(a, axis=d, keepdims=bool(keepdim)), np.argmax(a, axis=d, keepdims=bool(keepdim))


@op("aten::min.dim_min", n_in=3, n_out=2)
def _min_dim(a: np.ndarray, dim: int, keepdim: bool = False) -> tuple[Out, Out]:
    d = dim % max(a.ndim, 1)
    return np.amin(a, axis=d, keepdims=bool(keepdim)), np.argmin(a, axis=d, keepdims=bool(keepdim))


@op("aten::var.correction_out", n_in=4)
def _var(a: np.ndarray, dim: Dims = None, correction: Scalar | None = None, keepdim: bool = False) -> Out:
    ddof = 1 if correction is None else correction
    return np.var(a.astype(np.float64), axis=reduce_axes(dim, a.ndim), ddof=ddof, keepdims=bool(keepdim))


@op("aten::prod.int_out", n_in=4)
def _prod(a: np.ndarray, dim: int, keepdim: bool = False, dtype: int | None = None) -> Out:
    return np.prod(a, axis=dim % max(a.ndim, 1), keepdims=bool(keepdim), dtype=optional_dtype(dtype))


@op("aten::any.all_out", n_in=1)
def _any(a: np.ndarray) -> Out:
    return np.any(a)


@op("aten::any.out", "aten::any.dims_out", n_in=3)
def _any_dim(a: np.ndarray, dim: Dims, keepdim: bool = False) -> Out:
    return np.any(a, axis=reduce_axes(dim, a.ndim), keepdims=bool(keepdim))


@op("aten::cumsum.out", n_in=3)
def _cumsum(a: np.ndarray, dim: int, dtype: int | None = None) -> Out:
    return np.cumsum(a, axis=dim % max(a.ndim, 1), dtype=optional_dtype(dtype))


@op("aten::_softmax.out", n_in=3)
def _softmax(a: np.ndarray, dim: int, half_to_float: bool = False) -> Out:
    x = as_float(a).astype(np.float32) if a.dtype == np.float16 else as_float(a)
    e = np.exp(x - np.amax(x, axis=dim, keepdims=True))
    return e / np.sum(e, axis=dim, keepdims=True)


@op("aten::_log_softmax.out", n_in=3)
def _log_softmax(a: np.ndarray, dim: int, half_to_float: bool = False) -> Out:
    x = as_float(a)
    shifted = x - np.amax(x, axis=dim, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=dim, keepdims=True))


@op("aten::mean.dtype_out", n_in=2)
def _mean_all(a: np.ndarray, dtype: int | None = None) -> Out:
    dt = optional_dtype(dtype) or as_float(a).dtype
    return np.mean(a, dtype=np.float64).astype(dt)


@op("aten::max.unary_out", n_in=1)
def _max_all(a: np.ndarray) -> Out:
    return np.amax(a)


@op("aten::min.unary_out", n_in=1)
def _min_all(a: np.ndarray) -> Out:
    return np.amin(a)


@op("aten::prod.out", n_in=2)
def _prod_all(a: np.ndarray, dtype: int | None = None) -> Out:
    return np.prod(a, dtype=optional_dtype(dtype))


@op("aten::var.out", n_in=4)
def _var_unbiased(a: np.ndarray, dim: Dims = None, unbiased: bool = True, keepdim: bool = False) -> Out:
    return np.var(a.astype(np.float64), axis=reduce_axes(dim, a.ndim), ddof=int(bool(unbiased)), keepdims=bool(keepdim))


@op("aten::var_mean.correction_out", n_in=4, n_out=2)
def _var_mean(a: np.ndarray, dim: Dims = None, correction: Scalar | None = None,
              keepdim: bool = False) -> tuple[Out, Out]:
    ddof = 1 if correction is None else correction
    axes, x = reduce_axes(dim, a.ndim), a.astype(np.float64)
    return np.var(x, axis=axes, ddof=ddof, keepdims=bool(keepdim)), np.mean(x, axis=axes, keepdims=bool(keepdim))


@op("aten::topk.values", n_in=5, n_out=2)
def _topk(a: np.ndarray, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> tuple[Out, Out]:
    d = dim % max(a.ndim, 1)
    if not 0 <= k <= a.shape[d]:
        raise InputError(f"topk: k={k} is out of range for dimension {d} of size {a.shape[d]}")
    key = -a if largest else a
    idx = np.take(np.argsort(key, axis=d, kind="stable"), np.arange(k), axis=d)
    return np.take_along_axis(a, idx, axis=d), idx.astype(np.int64)
