"""More of ExecuTorch's portable set in numpy: what transformer, conv, RNN and audio models call.

Registered into :mod:`pyrt.kernels.numpy_kernels` (same calling convention: input
arguments in schema order, result arrays returned). Every registration is checked
against its operator's schema by ``tests/test_numpy_schemas.py``.

>>> import numpy as np
>>> from pyrt.kernels.numpy_kernels import _OPS
>>> _OPS["aten::as_strided_copy.out"].fn(np.arange(6.0), [2, 2], [1, 2], 1).tolist()
[[1.0, 3.0], [2.0, 4.0]]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from pyrt.errors import InputError
from pyrt.kernels.numpy_kernels import _axes, _clip_slice, _dt, _erf, _float, _sigmoid, op

# -- elementwise -------------------------------------------------------------------------------------

for _name, _fn in {
    "acos": np.arccos, "asin": np.arcsin, "acosh": np.arccosh, "asinh": np.arcsinh, "atanh": np.arctanh,
    "sinh": np.sinh, "cosh": np.cosh, "log10": np.log10, "isinf": np.isinf,
}.items():
    op(f"aten::{_name}.out", n_in=1)(lambda a, _f=_fn: _f(_float(np.asarray(a)) if _f is not np.isinf else a))


@op("aten::erf.out", n_in=1)
def _erf_out(a: Any) -> Any:
    x = _float(np.asarray(a))
    return _erf(x).astype(x.dtype)


@op("aten::floor_divide.out", n_in=2)
def _floor_divide(a: Any, b: Any) -> Any:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.floor_divide(a, b)


@op("aten::elu.out", n_in=4)
def _elu(a: Any, alpha: Any = 1, scale: Any = 1, input_scale: Any = 1) -> Any:
    x = _float(np.asarray(a))
    return np.where(x > 0, x * scale, (np.exp(x * input_scale) - 1) * alpha * scale).astype(x.dtype)


@op("aten::glu.out", n_in=2)
def _glu(a: Any, dim: int = -1) -> Any:
    first, second = np.split(a, 2, axis=dim % a.ndim)
    return first * _sigmoid(second)


@op("aten::logit.out", n_in=2)
def _logit(a: Any, eps: Any = None) -> Any:
    x = _float(np.asarray(a))
    if eps is not None:
        x = np.clip(x, eps, 1 - eps)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(x / (1 - x))


@op("aten::masked_fill.Scalar_out", n_in=3)
def _masked_fill(a: Any, mask: Any, value: Any) -> Any:
    return np.where(mask, np.asarray(value).astype(a.dtype), a)


@op("aten::fill.Scalar_out", "aten::fill.Tensor_out", n_in=2)
def _fill(a: Any, value: Any) -> Any:
    return np.full(a.shape, np.asarray(value).item() if np.ndim(value) == 0 else value, dtype=a.dtype)


@op("aten::empty.out", n_in=2)
def _empty(size: Sequence[int], memory_format: Any = None) -> Any:
    return np.zeros([int(s) for s in size])


@op("aten::tril.out", n_in=2)
def _tril(a: Any, diagonal: int = 0) -> Any:
    return np.tril(a, int(diagonal))


@op("aten::native_dropout.out", n_in=3, n_out=2)
def _dropout(a: Any, p: float, train: Any) -> tuple[Any, Any]:
    if train and p > 0:
        raise InputError(f"native_dropout: training-mode dropout (p={p}) is not in the numpy kernels")
    return a, np.ones(a.shape, dtype=np.bool_)


# -- reductions ----------------------------------------------------------------------------------------


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


@op("aten::nonzero.out", n_in=1)
def _nonzero(a: Any) -> Any:
    return np.argwhere(a).astype(np.int64)


@op("aten::masked_select.out", n_in=2)
def _masked_select(a: Any, mask: Any) -> Any:
    a, mask = np.broadcast_arrays(a, mask)
    return a[mask.astype(bool)]


# -- normalization -------------------------------------------------------------------------------------


@op("aten::native_group_norm.out", n_in=8, n_out=3)
def _group_norm(x: Any, w: Any, b: Any, n: int, c: int, hxw: int, group: int, eps: float) -> tuple[Any, Any, Any]:
    if group <= 0 or c % group or x.size != n * c * hxw:
        raise InputError(f"native_group_norm: input of shape {x.shape} does not split as N={n}, C={c}, "
                         f"HxW={hxw} into {group} groups")
    xf = x.astype(np.float64).reshape(n, group, -1)
    mean = xf.mean(axis=-1)
    rstd = 1.0 / np.sqrt(xf.var(axis=-1) + eps)
    y = ((xf - mean[..., None]) * rstd[..., None]).reshape(n, c, -1)
    if w is not None:
        y = y * w.reshape(1, c, 1)
    if b is not None:
        y = y + b.reshape(1, c, 1)
    return y.reshape(x.shape), mean, rstd


def _batch_stats(x: Any, w: Any, b: Any, eps: float) -> tuple[Any, Any, Any]:
    axes = (0, *range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    xf = x.astype(np.float64)
    mean = xf.mean(axis=axes)
    rstd = 1.0 / np.sqrt(xf.var(axis=axes) + eps)
    y = (xf - mean.reshape(shape)) * rstd.reshape(shape)
    if w is not None:
        y = y * w.reshape(shape)
    if b is not None:
        y = y + b.reshape(shape)
    return y, mean, rstd


@op("aten::_native_batch_norm_legit.no_stats_out", n_in=6, n_out=3)
def _batch_norm_no_stats(x: Any, w: Any, b: Any, training: Any, momentum: Any, eps: float) -> tuple[Any, Any, Any]:
    return _batch_stats(x, w, b, eps)


@op("aten::_native_batch_norm_legit.out", n_in=8, n_out=3)
def _batch_norm_legit(x: Any, w: Any, b: Any, running_mean: Any, running_var: Any, training: Any, momentum: Any,
                      eps: float) -> tuple[Any, Any, Any]:
    if training:
        return _batch_stats(x, w, b, eps)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y = (x - running_mean.reshape(shape)) / np.sqrt(running_var.reshape(shape) + eps)
    if w is not None:
        y = y * w.reshape(shape)
    if b is not None:
        y = y + b.reshape(shape)
    empty = np.zeros((0,), dtype=x.dtype)
    return y, empty, empty


# -- layout --------------------------------------------------------------------------------------------


@op("aten::as_strided_copy.out", n_in=4)
def _as_strided(a: Any, size: Sequence[int], stride: Sequence[int], storage_offset: Any = None) -> Any:
    """Elements of ``a``'s contiguous storage at ``offset + sum(i_k * stride_k)``; every index bounds-checked."""
    size, stride = [int(s) for s in size], [int(s) for s in stride]
    offset = int(storage_offset or 0)
    if len(size) != len(stride) or any(s < 0 for s in (*size, *stride)) or offset < 0:
        raise InputError(f"as_strided_copy: size {size}, stride {stride}, offset {offset} are not valid")
    flat = np.ascontiguousarray(a).reshape(-1)
    if math.prod(size) == 0:
        return np.zeros(size, dtype=a.dtype)
    last = offset + sum((n - 1) * st for n, st in zip(size, stride, strict=True))
    if last >= flat.size:
        raise InputError(f"as_strided_copy: size {size}, stride {stride}, offset {offset} reach element {last} "
                         f"of a {flat.size}-element tensor")
    return np.lib.stride_tricks.as_strided(flat[offset:], size, [s * flat.itemsize for s in stride],
                                           writeable=False).copy()


@op("aten::narrow_copy.out", n_in=4)
def _narrow(a: Any, dim: int, start: int, length: int) -> Any:
    d = dim % a.ndim
    start = start + a.shape[d] if start < 0 else start
    if not (0 <= start and 0 <= length and start + length <= a.shape[d]):
        raise InputError(f"narrow_copy: start {start} length {length} overrun dimension {d} of size {a.shape[d]}")
    return np.take(a, np.arange(start, start + length), axis=d)


@op("aten::diagonal_copy.out", n_in=4)
def _diagonal(a: Any, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Any:
    return np.diagonal(a, int(offset), dim1 % a.ndim, dim2 % a.ndim)


@op("aten::roll.out", n_in=3)
def _roll(a: Any, shifts: Sequence[int], dims: Sequence[int] = ()) -> Any:
    if not len(dims):
        return np.roll(a.reshape(-1), int(shifts[0])).reshape(a.shape)
    return np.roll(a, [int(s) for s in shifts], axis=[int(d) % a.ndim for d in dims])


@op("aten::pixel_shuffle.out", n_in=2)
def _pixel_shuffle(a: Any, r: int) -> Any:
    *lead, c, h, w = a.shape
    x = a.reshape(*lead, c // (r * r), r, r, h, w)
    n = len(lead)
    x = x.transpose(*range(n), n, n + 3, n + 1, n + 4, n + 2)
    return x.reshape(*lead, c // (r * r), h * r, w * r)


@op("aten::pixel_unshuffle.out", n_in=2)
def _pixel_unshuffle(a: Any, r: int) -> Any:
    *lead, c, h, w = a.shape
    n = len(lead)
    x = a.reshape(*lead, c, h // r, r, w // r, r)
    x = x.transpose(*range(n), n, n + 2, n + 4, n + 1, n + 3)
    return x.reshape(*lead, c * r * r, h // r, w // r)


def _pad_widths(a: Any, pad: Sequence[int], what: str) -> list[tuple[int, int]]:
    widths = [(0, 0)] * a.ndim
    for i in range(len(pad) // 2):
        widths[a.ndim - 1 - i] = (int(pad[2 * i]), int(pad[2 * i + 1]))
    if any(lo < 0 or hi < 0 for lo, hi in widths):
        raise InputError(f"{what}: negative padding {list(pad)} is not supported by the numpy kernels")
    return widths


for _dims in (1, 2, 3):
    op(f"aten::reflection_pad{_dims}d.out", n_in=2)(
        lambda a, pad: np.pad(a, _pad_widths(a, pad, "reflection_pad"), mode="reflect"))
    op(f"aten::replication_pad{_dims}d.out", n_in=2)(
        lambda a, pad: np.pad(a, _pad_widths(a, pad, "replication_pad"), mode="edge"))


@op("aten::unfold_copy.out", n_in=4)
def _unfold(a: Any, dim: int, size: int, step: int) -> Any:
    d = dim % max(a.ndim, 1)
    if size > a.shape[d] or step <= 0:
        raise InputError(f"unfold_copy: size {size} step {step} do not fit dimension {d} of size {a.shape[d]}")
    win = np.lib.stride_tricks.sliding_window_view(a, size, axis=d)
    return np.take(win, np.arange(0, a.shape[d] - size + 1, step), axis=d)


@op("aten::repeat_interleave.Tensor_out", n_in=2)
def _repeat_interleave(repeats: Any, output_size: Any = None) -> Any:
    return np.repeat(np.arange(repeats.shape[0]), repeats)


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


# -- pooling and resampling ------------------------------------------------------------------------------


@op("aten::_adaptive_avg_pool2d.out", n_in=2)
def _adaptive_avg_pool(a: Any, output_size: Sequence[int]) -> Any:
    x = _float(a)
    oh, ow = (int(s) for s in output_size)
    h, w = x.shape[-2:]
    rows = [x[..., (i * h) // oh: -(-((i + 1) * h) // oh), :].mean(axis=-2) for i in range(oh)]
    out = np.stack(rows, axis=-2)
    cols = [out[..., (j * w) // ow: -(-((j + 1) * w) // ow)].mean(axis=-1) for j in range(ow)]
    return np.stack(cols, axis=-1)


def _linear_source(out: int, size: int, align: bool, scale: Any) -> tuple[Any, Any, Any]:
    """Indices and weights of torch's bilinear sampling along one axis."""
    dst = np.arange(out, dtype=np.float64)
    if align:
        src = dst * ((size - 1) / (out - 1) if out > 1 else 0.0)
    else:
        ratio = 1.0 / float(scale) if scale else size / out
        src = np.maximum((dst + 0.5) * ratio - 0.5, 0.0)
    lo = np.minimum(np.floor(src).astype(np.int64), size - 1)
    hi = np.minimum(lo + 1, size - 1)
    return lo, hi, src - lo


@op("aten::upsample_bilinear2d.vec_out", n_in=4)
def _upsample_bilinear(a: Any, output_size: Any, align_corners: bool, scales: Any) -> Any:
    x = _float(a)
    h, w = x.shape[-2:]
    if output_size is not None:
        oh, ow = (int(s) for s in output_size)
        sh = sw = None
    else:
        oh, ow = int(math.floor(h * float(scales[0]))), int(math.floor(w * float(scales[1])))
        sh, sw = scales
    y0, y1, fy = _linear_source(oh, h, bool(align_corners), sh)
    x0, x1, fx = _linear_source(ow, w, bool(align_corners), sw)
    top = x[..., y0, :] * (1 - fy)[:, None] + x[..., y1, :] * fy[:, None]
    return top[..., x0] * (1 - fx) + top[..., x1] * fx
