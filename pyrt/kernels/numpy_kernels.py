"""A numpy core set of ATen out-variant kernels, for machines without torch.

Each operator is a plain function of its input arguments (schema order, out
arguments excluded) returning the result array(s); the step writes results
into the out tensors the plan built (casting to the out dtype, as the
out-variants do), resizing dynamic outputs within their memory-planned bound.
Coverage: elementwise arithmetic and comparisons, activations (relu, sigmoid,
tanh, gelu, silu, hardtanh, ...), mm/addmm/bmm, layout ops (permute, view,
expand, cat, slice, select, split, squeeze, transpose, index, pad, ...),
reductions (sum, mean, amax, amin, argmax, var, ...), softmax/log_softmax,
layer/batch norm, 1-D/2-D convolution, max/avg pooling and nearest upsampling;
:mod:`pyrt.kernels.numpy_more` adds the rest of the portable set real models use
(any.dim, as_strided_copy, group norm, scatter/index_put, topk, padding, bilinear, ...).
Argument values the set cannot honour (a transposed convolution) are rejected
at load with :class:`~pyrt.errors.UnsupportedOperatorError`.

>>> import numpy as np
>>> _OPS["aten::addmm.out"].fn(np.ones(2), np.eye(2), np.full((2, 2), 3.0), 1, 2).tolist()
[[7.0, 7.0], [7.0, 7.0]]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pyrt.errors import InputError, UnsupportedOperatorError
from pyrt.format.dtypes import ScalarType
from pyrt.kernels.base import KernelSite, Step
from pyrt.memory.layout import numpy_dtype


@dataclass(frozen=True)
class NpOp:
    """``fn(*args[:n_in]) -> result(s)`` written to ``args[n_in:n_in + n_out]``."""

    fn: Callable[..., Any]
    n_in: int
    n_out: int = 1
    check: Callable[[KernelSite], None] | None = None


_OPS: dict[str, NpOp] = {}


def op(*names: str, n_in: int, n_out: int = 1, check: Callable[[KernelSite], None] | None = None) -> Callable:
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        for name in names:
            _OPS[name] = NpOp(fn, n_in, n_out, check)
        return fn

    return register


# -- step construction -----------------------------------------------------------------------------


def _build(spec: NpOp, site: KernelSite) -> Step:
    site.require_args(spec.n_in + spec.n_out)
    if spec.check is not None:
        spec.check(site)
    _reject_device(site, spec.n_in + spec.n_out)
    getters = [site.getter(k) for k in range(spec.n_in)]
    writers = [_writer(site, spec.n_in + j) for j in range(spec.n_out)]
    fn, where = spec.fn, site.where
    if spec.n_out == 1:
        (write,) = writers
        if all(site.is_const(k) for k in range(spec.n_in)):
            args = [g() for g in getters]
            return lambda: write(fn(*args))
        return lambda: write(fn(*[g() for g in getters]))

    def step() -> None:
        results = fn(*[g() for g in getters])
        if len(results) != len(writers):
            raise InputError(f"{where}: kernel produced {len(results)} results for {len(writers)} outputs")
        for w, r in zip(writers, results, strict=True):
            w(r)

    return step


def _reject_device(site: KernelSite, n: int) -> None:
    for k in range(n):
        idxs = [site.args[k]]
        if site.kind(k) in ("TensorList", "OptionalTensorList"):
            idxs = [j for j in site.table.items[site.args[k]] if j >= 0]
        for j in idxs:
            info = site.table.infos.get(j)
            if info is not None and info.device is not None:
                raise UnsupportedOperatorError(f"{site.where}: value {j} lives in CUDA memory")


def _writer(site: KernelSite, k: int) -> Callable[[Any], None]:
    """Store a result into out argument ``k`` (a tensor or a tensor list)."""
    table, where = site.table, site.where
    if site.kind(k) == "TensorList":
        item_writers = [_tensor_writer(table, j, where) for j in table.items[site.args[k]]]

        def write_list(results: Sequence[Any]) -> None:
            if len(results) != len(item_writers):
                raise InputError(f"{where}: {len(results)} results for {len(item_writers)} outputs")
            for w, r in zip(item_writers, results, strict=True):
                w(r)

        return write_list
    return _tensor_writer(table, site.args[k], where)


def _tensor_writer(table: Any, i: int, where: str) -> Callable[[Any], None]:
    info = table.infos.get(i)
    if info is None:
        raise UnsupportedOperatorError(f"{where}: out value {i} is a {table.kinds[i]}, not a tensor")
    vals = table.vals
    if not info.dynamic:
        def write_static(r: Any) -> None:
            out = vals[i]
            if np.shape(r) != out.shape:
                raise InputError(f"{where}: result shape {np.shape(r)} does not match the planned {out.shape}")
            np.copyto(out, r, casting="unsafe")

        return write_static

    def write_dynamic(r: Any) -> None:
        out = table.resize(i, np.shape(r))
        np.copyto(out, r, casting="unsafe")

    return write_dynamic


# -- helpers ---------------------------------------------------------------------------------------


def _dt(v: Any) -> np.dtype | None:
    return None if v is None else numpy_dtype(ScalarType(int(v)))


def _axes(dim: Any, ndim: int) -> tuple[int, ...] | None:
    """torch reduction dims: None or [] reduce everything."""
    if dim is None:
        return None
    dims = [int(dim)] if isinstance(dim, (int, np.integer)) else list(dim)
    if not dims:
        return None
    return tuple(d % max(ndim, 1) for d in dims)


def _float(x: np.ndarray) -> np.ndarray:
    return x if np.issubdtype(x.dtype, np.floating) else x.astype(np.float32)


def _bin(f: Callable[[Any, Any], Any]) -> Callable[..., Any]:
    def run(a: Any, b: Any, alpha: Any = 1) -> Any:
        return f(a, b if alpha == 1 else b * alpha)

    return run


# -- elementwise -----------------------------------------------------------------------------------

op("aten::add.out", "aten::add.Scalar_out", n_in=3)(_bin(np.add))
op("aten::sub.out", "aten::sub.Scalar_out", n_in=3)(_bin(np.subtract))
op("aten::mul.out", "aten::mul.Scalar_out", n_in=2)(lambda a, b: np.multiply(a, b))
op("aten::maximum.out", n_in=2)(np.maximum)
op("aten::minimum.out", n_in=2)(np.minimum)
op("aten::remainder.Tensor_out", "aten::remainder.Scalar_out", n_in=2)(np.mod)
op("aten::fmod.Tensor_out", "aten::fmod.Scalar_out", n_in=2)(np.fmod)
op("aten::atan2.out", n_in=2)(np.arctan2)


@op("aten::rsub.Scalar_out", n_in=3)
def _rsub(a: Any, b: Any, alpha: Any = 1) -> Any:
    return np.subtract(b, a if alpha == 1 else a * alpha)


@op("aten::div.out", "aten::div.Scalar_out", n_in=2)
def _div(a: Any, b: Any) -> Any:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.true_divide(_float(np.asarray(a)), b)


@op("aten::div.out_mode", "aten::div.Scalar_mode_out", n_in=3)
def _div_mode(a: Any, b: Any, mode: Any) -> Any:
    with np.errstate(divide="ignore", invalid="ignore"):
        if mode is None:
            return _div(a, b)
        if mode == "trunc":
            q = np.true_divide(a, b)
            return np.trunc(q) if np.issubdtype(np.asarray(q).dtype, np.floating) else q
        if mode == "floor":
            return np.floor_divide(a, b)
    raise InputError(f"div rounding_mode {mode!r} is not 'trunc', 'floor' or None")


@op("aten::pow.Tensor_Scalar_out", "aten::pow.Tensor_Tensor_out", "aten::pow.Scalar_out", n_in=2)
def _pow(a: Any, b: Any) -> Any:
    return np.power(a, b)


for _name, _fn in {
    "neg": np.negative, "abs": np.abs, "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "sin": np.sin,
    "cos": np.cos, "floor": np.floor, "ceil": np.ceil, "sign": np.sign, "log2": np.log2, "log1p": np.log1p,
    "expm1": np.expm1, "logical_not": np.logical_not, "bitwise_not": np.invert, "trunc": np.trunc,
    "round": np.round, "isnan": np.isnan, "tan": np.tan, "atan": np.arctan,
}.items():
    op(f"aten::{_name}.out", n_in=1)(lambda a, _f=_fn: _f(a))


@op("aten::reciprocal.out", n_in=1)
def _reciprocal(a: Any) -> Any:
    with np.errstate(divide="ignore"):
        return np.reciprocal(_float(np.asarray(a)))


@op("aten::rsqrt.out", n_in=1)
def _rsqrt(a: Any) -> Any:
    with np.errstate(divide="ignore", invalid="ignore"):
        return 1.0 / np.sqrt(_float(np.asarray(a)))


@op("aten::relu.out", n_in=1)
def _relu(a: Any) -> Any:
    return np.where(a > 0, a, np.zeros((), dtype=a.dtype)) if a.dtype != np.bool_ else a


@op("aten::sigmoid.out", n_in=1)
def _sigmoid(a: Any) -> Any:
    x = _float(a)
    e = np.exp(-np.abs(x))  # in (0, 1]: never overflows, for either sign of x
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype, copy=False)


@op("aten::tanh.out", n_in=1)
def _tanh(a: Any) -> Any:
    return np.tanh(_float(a))


_erf = np.vectorize(math.erf, otypes=[np.float64])


@op("aten::gelu.out", n_in=2)
def _gelu(a: Any, approximate: Any = "none") -> Any:
    x = _float(a).astype(np.float64)
    if approximate == "tanh":
        y = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    else:
        y = 0.5 * x * (1 + _erf(x / math.sqrt(2)))
    return y.astype(_float(a).dtype)


@op("aten::silu.out", n_in=1)
def _silu(a: Any) -> Any:
    return a * _sigmoid(a)


@op("aten::hardtanh.out", n_in=3)
def _hardtanh(a: Any, lo: Any, hi: Any) -> Any:
    return np.clip(a, lo, hi)


@op("aten::leaky_relu.out", n_in=2)
def _leaky_relu(a: Any, slope: Any) -> Any:
    return np.where(a > 0, a, a * slope)


@op("aten::hardswish.out", n_in=1)
def _hardswish(a: Any) -> Any:
    return a * np.clip(a + 3, 0, 6) / 6


@op("aten::hardsigmoid.out", n_in=1)
def _hardsigmoid(a: Any) -> Any:
    return np.clip(a + 3, 0, 6) / 6


@op("aten::clamp.out", "aten::clamp.Tensor_out", n_in=3)
def _clamp(a: Any, lo: Any, hi: Any) -> Any:
    out = a
    if lo is not None:
        out = np.maximum(out, lo)
    if hi is not None:
        out = np.minimum(out, hi)
    return out


@op("aten::where.self_out", n_in=3)
def _where(cond: Any, a: Any, b: Any) -> Any:
    return np.where(cond, a, b)


for _name, _fn in {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
                   "ge": np.greater_equal, "logical_and": np.logical_and, "logical_or": np.logical_or,
                   "logical_xor": np.logical_xor, "bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or,
                   "bitwise_xor": np.bitwise_xor}.items():
    op(f"aten::{_name}.Scalar_out", f"aten::{_name}.Tensor_out", n_in=2)(lambda a, b, _f=_fn: _f(a, b))
for _name in ("logical_and", "logical_or", "logical_xor"):  # torch has only the tensor overload, named .out
    _OPS[f"aten::{_name}.out"] = _OPS.pop(f"aten::{_name}.Tensor_out")
    del _OPS[f"aten::{_name}.Scalar_out"]


# -- linear algebra --------------------------------------------------------------------------------

op("aten::mm.out", "aten::bmm.out", n_in=2)(np.matmul)


@op("aten::addmm.out", n_in=5)
def _addmm(bias: Any, a: Any, b: Any, beta: Any = 1, alpha: Any = 1) -> Any:
    prod = np.matmul(a, b)
    if alpha != 1:
        prod = prod * alpha
    return prod + (bias if beta == 1 else bias * beta) if beta != 0 else prod


@op("aten::baddbmm.out", n_in=5)
def _baddbmm(bias: Any, a: Any, b: Any, beta: Any = 1, alpha: Any = 1) -> Any:
    return _addmm(bias, a, b, beta, alpha)


@op("aten::linear.out", n_in=3)
def _linear(x: Any, w: Any, b: Any) -> Any:
    y = np.matmul(x, np.swapaxes(w, -1, -2))
    return y if b is None else y + b


# -- layout ------------------------------------------------------------------------------------------


@op("aten::permute_copy.out", n_in=2)
def _permute(a: Any, dims: Sequence[int]) -> Any:
    return np.transpose(a, [d % max(a.ndim, 1) for d in dims])


@op("aten::view_copy.out", "aten::_unsafe_view.out", n_in=2)
def _view(a: Any, size: Sequence[int]) -> Any:
    return np.reshape(a, [int(s) for s in size])


@op("aten::expand_copy.out", n_in=3)
def _expand(a: Any, size: Sequence[int], implicit: Any = False) -> Any:
    lead = len(size) - a.ndim
    shape = [a.shape[i - lead] if s == -1 else s for i, s in enumerate(size)]
    return np.broadcast_to(a, shape)


@op("aten::cat.out", n_in=2)
def _cat(tensors: Sequence[Any], dim: int = 0) -> Any:
    parts = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]  # torch skips legacy empties
    if not parts:
        return tensors[0]
    return np.concatenate(parts, axis=dim % parts[0].ndim)


@op("aten::stack.out", n_in=2)
def _stack(tensors: Sequence[Any], dim: int = 0) -> Any:
    return np.stack(list(tensors), axis=dim % (tensors[0].ndim + 1))


def _clip_slice(n: int, start: Any, end: Any, step: int) -> slice:
    start = 0 if start is None else int(start)
    end = n if end is None else int(end)
    start = max(start + n, 0) if start < 0 else min(start, n)
    end = max(end + n, 0) if end < 0 else min(end, n)
    return slice(start, max(end, start), step)


@op("aten::slice_copy.Tensor_out", n_in=5)
def _slice(a: Any, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> Any:
    d = dim % a.ndim
    index = [slice(None)] * a.ndim
    index[d] = _clip_slice(a.shape[d], start, end, int(step))
    return a[tuple(index)]


@op("aten::select_copy.int_out", n_in=3)
def _select(a: Any, dim: int, index: int) -> Any:
    d = dim % a.ndim
    if not -a.shape[d] <= index < a.shape[d]:
        raise InputError(f"select index {index} out of range for dimension {d} of size {a.shape[d]}")
    return np.take(a, index, axis=d)


@op("aten::unsqueeze_copy.out", n_in=2)
def _unsqueeze(a: Any, dim: int) -> Any:
    return np.expand_dims(a, dim % (a.ndim + 1))


@op("aten::squeeze_copy.dim_out", "aten::squeeze_copy.dims_out", n_in=2)
def _squeeze_dims(a: Any, dims: Any) -> Any:
    ds = [dims] if isinstance(dims, (int, np.integer)) else list(dims)
    ds = [d % max(a.ndim, 1) for d in ds if a.ndim and a.shape[d % a.ndim] == 1]
    return np.squeeze(a, axis=tuple(ds)) if ds else a


@op("aten::squeeze_copy.out", n_in=1)
def _squeeze(a: Any) -> Any:
    return np.squeeze(a)


@op("aten::transpose_copy.int_out", n_in=3)
def _transpose(a: Any, d0: int, d1: int) -> Any:
    return np.swapaxes(a, d0, d1)


@op("aten::t_copy.out", n_in=1)
def _t(a: Any) -> Any:
    return a.T


@op("aten::clone.out", n_in=2)
def _clone(a: Any, memory_format: Any = None) -> Any:
    return a


@op("aten::_to_copy.out", n_in=3)
def _to_copy(a: Any, non_blocking: Any = False, memory_format: Any = None) -> Any:
    return a


@op("aten::alias_copy.out", "aten::lift_fresh_copy.out", "aten::detach_copy.out", n_in=1)
def _identity(a: Any) -> Any:
    return a


@op("aten::split_with_sizes_copy.out", n_in=3)
def _split_sizes(a: Any, sizes: Sequence[int], dim: int = 0) -> list[Any]:
    return np.split(a, np.cumsum([int(s) for s in sizes])[:-1], axis=dim % a.ndim)


@op("aten::split_copy.Tensor_out", n_in=3)
def _split(a: Any, size: int, dim: int = 0) -> list[Any]:
    d = dim % a.ndim
    return np.split(a, list(range(size, a.shape[d], size)), axis=d)


@op("aten::unbind_copy.int_out", n_in=2)
def _unbind(a: Any, dim: int = 0) -> list[Any]:
    d = dim % a.ndim
    return [np.take(a, i, axis=d) for i in range(a.shape[d])]


@op("aten::full.out", n_in=2)
def _full(size: Sequence[int], value: Any) -> Any:
    return np.full([int(s) for s in size], value)


@op("aten::full_like.out", n_in=3)
def _full_like(a: Any, value: Any, memory_format: Any = None) -> Any:
    return np.full(a.shape, value)


@op("aten::zeros.out", n_in=1)
def _zeros(size: Sequence[int]) -> Any:
    return np.zeros([int(s) for s in size])


@op("aten::ones.out", n_in=1)
def _ones(size: Sequence[int]) -> Any:
    return np.ones([int(s) for s in size])


@op("aten::scalar_tensor.out", n_in=1)
def _scalar_tensor(s: Any) -> Any:
    return np.asarray(s)


@op("aten::arange.out", n_in=1)
def _arange(end: Any) -> Any:
    return np.arange(end)


@op("aten::arange.start_out", n_in=3)
def _arange_start(start: Any, end: Any, step: Any = 1) -> Any:
    return np.arange(start, end, step)


@op("aten::repeat.out", n_in=2)
def _repeat(a: Any, repeats: Sequence[int]) -> Any:
    lead = len(repeats) - a.ndim
    return np.tile(a.reshape((1,) * lead + a.shape), repeats)


@op("aten::constant_pad_nd.out", n_in=3)
def _pad(a: Any, pad: Sequence[int], value: Any = 0) -> Any:
    widths = [(0, 0)] * a.ndim
    for i in range(len(pad) // 2):
        widths[a.ndim - 1 - i] = (int(pad[2 * i]), int(pad[2 * i + 1]))
    if any(lo < 0 or hi < 0 for lo, hi in widths):
        raise InputError(f"constant_pad_nd: negative padding {pad} is not supported by the numpy kernels")
    return np.pad(a, widths, constant_values=value)


@op("aten::flip.out", n_in=2)
def _flip(a: Any, dims: Sequence[int]) -> Any:
    return np.flip(a, axis=tuple(dims))


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


# -- reductions --------------------------------------------------------------------------------------


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


# -- normalization -----------------------------------------------------------------------------------


@op("aten::_native_batch_norm_legit_no_training.out", n_in=7, n_out=3)
def _batch_norm(x: Any, w: Any, b: Any, mean: Any, var: Any, momentum: Any, eps: float) -> tuple[Any, Any, Any]:
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps)
    if w is not None:
        y = y * w.reshape(shape)
    if b is not None:
        y = y + b.reshape(shape)
    empty = np.zeros((0,), dtype=x.dtype)
    return y, empty, empty


@op("aten::native_layer_norm.out", n_in=5, n_out=3)
def _layer_norm(x: Any, shape: Sequence[int], w: Any, b: Any, eps: float) -> tuple[Any, Any, Any]:
    axes = tuple(range(x.ndim - len(shape), x.ndim))
    xf = x.astype(np.float64)
    mean = xf.mean(axis=axes, keepdims=True)
    var = xf.var(axis=axes, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    y = (xf - mean) * rstd
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y, mean, rstd


# -- convolution and pooling ---------------------------------------------------------------------------


def _spatial(values: Sequence[int], n: int) -> tuple[int, ...]:
    vals = [int(v) for v in values]
    return tuple(vals * n if len(vals) == 1 else vals)


def _check_conv(site: KernelSite) -> None:
    if site.is_const(6) and site.value(6):
        raise UnsupportedOperatorError(f"{site.where}: the numpy kernels have no transposed convolution")
    info = site.info(0)
    if info is not None and len(info.sizes) not in (3, 4):
        raise UnsupportedOperatorError(f"{site.where}: the numpy kernels support 1-D and 2-D convolution only")


@op("aten::convolution.out", n_in=9, check=_check_conv)
def _convolution(x: Any, w: Any, bias: Any, stride: Any, padding: Any, dilation: Any, transposed: Any,
                 output_padding: Any, groups: int) -> Any:
    if transposed:
        raise UnsupportedOperatorError("aten::convolution.out: transposed convolution is not in the numpy set")
    one_d = x.ndim == 3
    if one_d:
        x, w = x[:, :, None, :], w[:, :, None, :]
    n = 2
    (sh, sw), (ph, pw), (dh, dw) = (_spatial(v, n) if not one_d else (1, *_spatial(v, 1))
                                    for v in (stride, padding, dilation))
    if one_d:
        ph = 0
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    kh, kw = w.shape[2], w.shape[3]
    win = np.lib.stride_tricks.sliding_window_view(xp, ((kh - 1) * dh + 1, (kw - 1) * dw + 1), axis=(2, 3))
    win = win[:, :, ::sh, ::sw, ::dh, ::dw]  # N, C, OH, OW, kh, kw
    N, C, OH, OW = win.shape[:4]
    g = int(groups)
    OC = w.shape[0]
    win = win.reshape(N, g, C // g, OH, OW, kh, kw)
    wg = w.reshape(g, OC // g, C // g, kh, kw)
    y = np.einsum("ngchwij,gocij->ngohw", win, wg, optimize=True).reshape(N, OC, OH, OW)
    if bias is not None:
        y = y + bias.reshape(1, -1, 1, 1)
    return y[:, :, 0, :] if one_d else y


def _pool_windows(x: Any, kernel: Any, stride: Any, padding: Any, dilation: Any, ceil_mode: Any,
                  fill: float) -> tuple[Any, tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    k = _spatial(kernel, 2)
    s = _spatial(stride, 2) if len(stride) else k
    p = _spatial(padding, 2)
    d = _spatial(dilation, 2)
    H, W = x.shape[-2:]
    out = []
    extra = []
    # The parameters come from the program unchecked; only their first two (spatial) entries count.
    for size, kk, ss, pp, dd in zip((H, W), k, s, p, d, strict=False):
        span = size + 2 * pp - dd * (kk - 1) - 1
        o = (-(-span // ss) if ceil_mode else span // ss) + 1
        if ceil_mode and (o - 1) * ss >= size + pp:
            o -= 1
        out.append(o)
        extra.append(max((o - 1) * ss + dd * (kk - 1) + 1 - (size + 2 * pp), 0))
    widths = [(0, 0)] * (x.ndim - 2) + [(p[0], p[0] + extra[0]), (p[1], p[1] + extra[1])]
    xp = np.pad(x, widths, constant_values=fill)
    win = np.lib.stride_tricks.sliding_window_view(xp, ((k[0] - 1) * d[0] + 1, (k[1] - 1) * d[1] + 1), axis=(-2, -1))
    win = win[..., : out[0] * s[0]: s[0], : out[1] * s[1]: s[1], :: d[0], :: d[1]]
    return win, k, s, p, d


@op("aten::max_pool2d_with_indices.out", n_in=6, n_out=2)
def _max_pool(x: Any, kernel: Any, stride: Any, padding: Any, dilation: Any, ceil_mode: Any) -> tuple[Any, Any]:
    fill = -np.inf if np.issubdtype(x.dtype, np.floating) else np.iinfo(x.dtype).min
    win, k, s, p, d = _pool_windows(x, kernel, stride, padding, dilation, ceil_mode, fill)
    flat = win.reshape(*win.shape[:-2], -1)
    arg = np.argmax(flat, axis=-1)
    values = np.take_along_axis(flat, arg[..., None], axis=-1)[..., 0]
    oh = np.arange(win.shape[-4])[:, None] * s[0] - p[0] + (arg // k[1]) * d[0]
    ow = np.arange(win.shape[-3])[None, :] * s[1] - p[1] + (arg % k[1]) * d[1]
    return values, (oh * x.shape[-1] + ow).astype(np.int64)


@op("aten::avg_pool2d.out", n_in=7)
def _avg_pool(x: Any, kernel: Any, stride: Any, padding: Any, ceil_mode: Any = False,
              count_include_pad: Any = True, divisor_override: Any = None) -> Any:
    xf = _float(x)
    win, k, s, p, _ = _pool_windows(xf, kernel, stride, padding, (1, 1), ceil_mode, 0.0)
    total = win.sum(axis=(-2, -1))
    if divisor_override:
        return total / divisor_override
    ones = np.ones(x.shape[-2:], dtype=xf.dtype)
    inside = _pool_windows(ones, kernel, stride, padding, (1, 1), ceil_mode, 0.0)[0].sum(axis=(-2, -1))
    if count_include_pad:
        H, W = x.shape[-2:]
        hs = np.arange(win.shape[-4]) * s[0] - p[0]
        ws = np.arange(win.shape[-3]) * s[1] - p[1]
        h_cnt = np.minimum(hs + k[0], H + p[0]) - hs
        w_cnt = np.minimum(ws + k[1], W + p[1]) - ws
        return total / (h_cnt[:, None] * w_cnt[None, :])
    return total / inside


@op("aten::upsample_nearest2d.vec_out", n_in=3)
def _upsample_nearest(x: Any, output_size: Any, scales: Any) -> Any:
    """torch's "nearest": source index = floor(dst * in / out), or floor(dst / scale) with scales."""
    index = []
    for axis, size in enumerate(x.shape[-2:]):
        if output_size is not None:
            out = int(output_size[axis])
            step = size / out
        else:
            out = int(math.floor(size * float(scales[axis])))
            step = 1.0 / float(scales[axis])
        index.append(np.minimum(np.floor(np.arange(out) * step).astype(np.int64), size - 1))
    return x[..., index[0][:, None], index[1][None, :]]
