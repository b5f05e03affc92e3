"""numpy kernels, neural-network layers: matrix products, normalization, convolution, pooling, resampling.

>>> import numpy as np
>>> from pyrt.kernels.numpy_base import Dims, Out, Scalar, OPS
>>> OPS["aten::addmm.out"].fn(np.ones(2), np.eye(2), np.full((2, 2), 3.0), 1, 2).tolist()
[[7.0, 7.0], [7.0, 7.0]]
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from pyrt.errors import InputError, UnsupportedOperatorError
from pyrt.kernels.base import KernelSite
from pyrt.kernels.numpy_base import Out, Scalar, as_float, op

# -- linear algebra --------------------------------------------------------------------------------

op("aten::mm.out", "aten::bmm.out", n_in=2)(np.matmul)


@op("aten::addmm.out", n_in=5)
def _addmm(bias: np.ndarray, a: np.ndarray, b: np.ndarray, beta: Scalar = 1, alpha: Scalar = 1) -> Out:
    prod = np.matmul(a, b)
    if alpha != 1:
        prod = prod * alpha
    return prod + (bias if beta == 1 else bias * beta) if beta != 0 else prod


@op("aten::baddbmm.out", n_in=5)
def _baddbmm(bias: np.ndarray, a: np.ndarray, b: np.ndarray, beta: Scalar = 1, alpha: Scalar = 1) -> Out:
    return _addmm(bias, a, b, beta, alpha)


@op("aten::linear.out", n_in=3)
def _linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> Out:
    y = np.matmul(x, np.swapaxes(w, -1, -2))
    return y if b is None else y + b


@op("aten::native_dropout.out", n_in=3, n_out=2)
def _dropout(a: np.ndarray, p: float, train: bool | None) -> tuple[Out, Out]:
    if train and p > 0:
        raise InputError(f"native_dropout: training-mode dropout (p={p}) is not in the numpy kernels")
    return a, np.ones(a.shape, dtype=np.bool_)


# -- normalization -----------------------------------------------------------------------------------


@op("aten::_native_batch_norm_legit_no_training.out", n_in=7, n_out=3)
def _batch_norm(x: np.ndarray, w: np.ndarray | None, b: np.ndarray | None, mean: np.ndarray, var: np.ndarray,
                momentum: float, eps: float) -> tuple[Out, Out, Out]:
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps)
    if w is not None:
        y = y * w.reshape(shape)
    if b is not None:
        y = y + b.reshape(shape)
    empty = np.zeros((0,), dtype=x.dtype)
    return y, empty, empty


@op("aten::native_layer_norm.out", n_in=5, n_out=3)
def _layer_norm(x: np.ndarray, shape: Sequence[int], w: np.ndarray | None, b: np.ndarray | None,
                eps: float) -> tuple[Out, Out, Out]:
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


# -- normalization -------------------------------------------------------------------------------------


@op("aten::native_group_norm.out", n_in=8, n_out=3)
def _group_norm(x: np.ndarray, w: np.ndarray | None, b: np.ndarray | None, n: int, c: int, hxw: int, group: int,
                eps: float) -> tuple[Out, Out, Out]:
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


def _batch_stats(x: np.ndarray, w: np.ndarray | None, b: np.ndarray | None, eps: float) -> tuple[Out, Out, Out]:
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
def _batch_norm_no_stats(x: np.ndarray, w: np.ndarray | None, b: np.ndarray | None, training: bool, momentum: float,
                         eps: float) -> tuple[Out, Out, Out]:
    return _batch_stats(x, w, b, eps)


@op("aten::_native_batch_norm_legit.out", n_in=8, n_out=3)
def _batch_norm_legit(x: np.ndarray, w: np.ndarray | None, b: np.ndarray | None, running_mean: np.ndarray,
                      running_var: np.ndarray, training: bool, momentum: float, eps: float) -> tuple[Out, Out, Out]:
    if training:
        return _batch_stats(x, w, b, eps)
    return _batch_norm(x, w, b, running_mean, running_var, momentum, eps)


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
def _convolution(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, stride: Sequence[int],
                 padding: Sequence[int], dilation: Sequence[int], transposed: bool,
                 output_padding: Sequence[int], groups: int) -> Out:
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


def _pool_windows(x: np.ndarray, kernel: Sequence[int], stride: Sequence[int], padding: Sequence[int],
                  dilation: Sequence[int], ceil_mode: bool,
                  fill: float) -> tuple[np.ndarray, tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
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
def _max_pool(x: np.ndarray, kernel: Sequence[int], stride: Sequence[int], padding: Sequence[int],
              dilation: Sequence[int], ceil_mode: bool) -> tuple[Out, Out]:
    fill = -np.inf if np.issubdtype(x.dtype, np.floating) else np.iinfo(x.dtype).min
    win, k, s, p, d = _pool_windows(x, kernel, stride, padding, dilation, ceil_mode, fill)
    flat = win.reshape(*win.shape[:-2], -1)
    arg = np.argmax(flat, axis=-1)
    values = np.take_along_axis(flat, arg[..., None], axis=-1)[..., 0]
    oh = np.arange(win.shape[-4])[:, None] * s[0] - p[0] + (arg // k[1]) * d[0]
    ow = np.arange(win.shape[-3])[None, :] * s[1] - p[1] + (arg % k[1]) * d[1]
    return values, (oh * x.shape[-1] + ow).astype(np.int64)


@op("aten::avg_pool2d.out", n_in=7)
def _avg_pool(x: np.ndarray, kernel: Sequence[int], stride: Sequence[int], padding: Sequence[int],
              ceil_mode: bool = False, count_include_pad: bool = True, divisor_override: int | None = None) -> Out:
    xf = as_float(x)
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


def _factors(scales: Sequence[float] | None, what: str) -> Sequence[float]:
    """The scale factors of an upsample call given no output size; InputError when it gives neither."""
    if scales is None:
        raise InputError(f"{what}: the call gives neither an output size nor scale factors")
    return scales


@op("aten::upsample_nearest2d.vec_out", n_in=3)
def _upsample_nearest(x: np.ndarray, output_size: Sequence[int] | None, scales: Sequence[float] | None) -> Out:
    """torch's "nearest": source index = floor(dst * in / out), or floor(dst / scale) with scales."""
    index = []
    for axis, size in enumerate(x.shape[-2:]):
        if output_size is not None:
            out = int(output_size[axis])
            step = size / out
        else:
            factors = _factors(scales, "upsample_nearest2d")
            out = int(math.floor(size * float(factors[axis])))
            step = 1.0 / float(factors[axis])
        index.append(np.minimum(np.floor(np.arange(out) * step).astype(np.int64), size - 1))
    return x[..., index[0][:, None], index[1][None, :]]


# -- pooling and resampling ------------------------------------------------------------------------------


@op("aten::_adaptive_avg_pool2d.out", n_in=2)
def _adaptive_avg_pool(a: np.ndarray, output_size: Sequence[int]) -> Out:
    x = as_float(a)
    oh, ow = (int(s) for s in output_size)
    h, w = x.shape[-2:]
    rows = [x[..., (i * h) // oh: -(-((i + 1) * h) // oh), :].mean(axis=-2) for i in range(oh)]
    out = np.stack(rows, axis=-2)
    cols = [out[..., (j * w) // ow: -(-((j + 1) * w) // ow)].mean(axis=-1) for j in range(ow)]
    return np.stack(cols, axis=-1)


def _linear_source(out: int, size: int, align: bool, scale: float | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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
def _upsample_bilinear(a: np.ndarray, output_size: Sequence[int] | None, align_corners: bool,
                       scales: Sequence[float] | None) -> Out:
    x = as_float(a)
    h, w = x.shape[-2:]
    if output_size is not None:
        oh, ow = (int(s) for s in output_size)
        sh = sw = None
    else:
        factors = _factors(scales, "upsample_bilinear2d")
        oh, ow = int(math.floor(h * float(factors[0]))), int(math.floor(w * float(factors[1])))
        sh, sw = factors
    y0, y1, fy = _linear_source(oh, h, bool(align_corners), sh)
    x0, x1, fx = _linear_source(ow, w, bool(align_corners), sw)
    top = x[..., y0, :] * (1 - fy)[:, None] + x[..., y1, :] * fy[:, None]
    return top[..., x0] * (1 - fx) + top[..., x1] * fx
