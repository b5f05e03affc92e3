"""numpy kernels, elementwise: arithmetic, unary math, activations, comparisons, fills by mask.

>>> import numpy as np
>>> from pyrt.kernels.numpy_base import OPS
>>> OPS["aten::add.out"].fn(np.ones(2), np.full(2, 2.0), 3).tolist()
[7.0, 7.0]
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from pyrt.errors import InputError
from pyrt.kernels.numpy_base import OPS, Operand, Out, Scalar, as_float, op


def _bin(f: Callable[[Operand, Operand], Out]) -> Callable[[Operand, Operand, Scalar], Out]:
    def run(a: Operand, b: Operand, alpha: Scalar = 1) -> Out:
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
def _rsub(a: np.ndarray, b: Operand, alpha: Scalar = 1) -> Out:
    return np.subtract(b, a if alpha == 1 else a * alpha)


@op("aten::div.out", "aten::div.Scalar_out", n_in=2)
def _div(a: np.ndarray, b: Operand) -> Out:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.true_divide(as_float(np.asarray(a)), b)


@op("aten::div.out_mode", "aten::div.Scalar_mode_out", n_in=3)
def _div_mode(a: np.ndarray, b: Operand, mode: str | None) -> Out:
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
def _pow(a: Operand, b: Operand) -> Out:
    return np.power(a, b)


for _name, _fn in {
    "neg": np.negative, "abs": np.abs, "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "sin": np.sin,
    "cos": np.cos, "floor": np.floor, "ceil": np.ceil, "sign": np.sign, "log2": np.log2, "log1p": np.log1p,
    "expm1": np.expm1, "logical_not": np.logical_not, "bitwise_not": np.invert, "trunc": np.trunc,
    "round": np.round, "isnan": np.isnan, "tan": np.tan, "atan": np.arctan,
}.items():
    op(f"aten::{_name}.out", n_in=1)(lambda a, _f=_fn: _f(a))


@op("aten::reciprocal.out", n_in=1)
def _reciprocal(a: np.ndarray) -> Out:
    with np.errstate(divide="ignore"):
        return np.reciprocal(as_float(np.asarray(a)))


@op("aten::rsqrt.out", n_in=1)
def _rsqrt(a: np.ndarray) -> Out:
    with np.errstate(divide="ignore", invalid="ignore"):
        return 1.0 / np.sqrt(as_float(np.asarray(a)))


@op("aten::relu.out", n_in=1)
def _relu(a: np.ndarray) -> Out:
    return np.where(a > 0, a, np.zeros((), dtype=a.dtype)) if a.dtype != np.bool_ else a


@op("aten::sigmoid.out", n_in=1)
def _sigmoid(a: np.ndarray) -> np.ndarray:
    x = as_float(a)
    e = np.exp(-np.abs(x))  # in (0, 1]: never overflows, for either sign of x
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype, copy=False)


@op("aten::tanh.out", n_in=1)
def _tanh(a: np.ndarray) -> Out:
    return np.tanh(as_float(a))


_erf = np.vectorize(math.erf, otypes=[np.float64])


@op("aten::gelu.out", n_in=2)
def _gelu(a: np.ndarray, approximate: str = "none") -> Out:
    x = as_float(a).astype(np.float64)
    if approximate == "tanh":
        y = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    else:
        y = 0.5 * x * (1 + _erf(x / math.sqrt(2)))
    return y.astype(as_float(a).dtype)


@op("aten::silu.out", n_in=1)
def _silu(a: np.ndarray) -> Out:
    return a * _sigmoid(a)


@op("aten::hardtanh.out", n_in=3)
def _hardtanh(a: np.ndarray, lo: Scalar, hi: Scalar) -> Out:
    return np.clip(a, lo, hi)


@op("aten::leaky_relu.out", n_in=2)
def _leaky_relu(a: np.ndarray, slope: Scalar) -> Out:
    return np.where(a > 0, a, a * slope)


@op("aten::hardswish.out", n_in=1)
def _hardswish(a: np.ndarray) -> Out:
    return a * np.clip(a + 3, 0, 6) / 6


@op("aten::hardsigmoid.out", n_in=1)
def _hardsigmoid(a: np.ndarray) -> Out:
    return np.clip(a + 3, 0, 6) / 6


@op("aten::clamp.out", "aten::clamp.Tensor_out", n_in=3)
def _clamp(a: np.ndarray, lo: Operand | None, hi: Operand | None) -> Out:
    out = a
    if lo is not None:
        out = np.maximum(out, lo)
    if hi is not None:
        out = np.minimum(out, hi)
    return out


@op("aten::where.self_out", n_in=3)
def _where(cond: np.ndarray, a: np.ndarray, b: np.ndarray) -> Out:
    return np.where(cond, a, b)


for _name, _fn in {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
                   "ge": np.greater_equal, "logical_and": np.logical_and, "logical_or": np.logical_or,
                   "logical_xor": np.logical_xor, "bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or,
                   "bitwise_xor": np.bitwise_xor}.items():
    op(f"aten::{_name}.Scalar_out", f"aten::{_name}.Tensor_out", n_in=2)(lambda a, b, _f=_fn: _f(a, b))
for _name in ("logical_and", "logical_or", "logical_xor"):  # torch has only the tensor overload, named .out
    OPS[f"aten::{_name}.out"] = OPS.pop(f"aten::{_name}.Tensor_out")
    del OPS[f"aten::{_name}.Scalar_out"]


for _name, _fn in {
    "acos": np.arccos, "asin": np.arcsin, "acosh": np.arccosh, "asinh": np.arcsinh, "atanh": np.arctanh,
    "sinh": np.sinh, "cosh": np.cosh, "log10": np.log10, "isinf": np.isinf,
}.items():
    op(f"aten::{_name}.out", n_in=1)(lambda a, _f=_fn: _f(as_float(np.asarray(a)) if _f is not np.isinf else a))


@op("aten::erf.out", n_in=1)
def _erf_out(a: np.ndarray) -> Out:
    x = as_float(np.asarray(a))
    return _erf(x).astype(x.dtype)


@op("aten::floor_divide.out", n_in=2)
def _floor_divide(a: np.ndarray, b: np.ndarray) -> Out:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.floor_divide(a, b)


@op("aten::elu.out", n_in=4)
def _elu(a: np.ndarray, alpha: Scalar = 1, scale: Scalar = 1, input_scale: Scalar = 1) -> Out:
    x = as_float(np.asarray(a))
    return np.where(x > 0, x * scale, (np.exp(x * input_scale) - 1) * alpha * scale).astype(x.dtype)


@op("aten::glu.out", n_in=2)
def _glu(a: np.ndarray, dim: int = -1) -> Out:
    first, second = np.split(a, 2, axis=dim % a.ndim)
    return first * _sigmoid(second)


@op("aten::logit.out", n_in=2)
def _logit(a: np.ndarray, eps: float | None = None) -> Out:
    x = as_float(np.asarray(a))
    if eps is not None:
        x = np.clip(x, eps, 1 - eps)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(x / (1 - x))


@op("aten::masked_fill.Scalar_out", n_in=3)
def _masked_fill(a: np.ndarray, mask: np.ndarray, value: Scalar) -> Out:
    return np.where(mask, np.asarray(value).astype(a.dtype), a)


@op("aten::fill.Scalar_out", "aten::fill.Tensor_out", n_in=2)
def _fill(a: np.ndarray, value: Operand) -> Out:
    return np.full(a.shape, np.asarray(value).item() if np.ndim(value) == 0 else value, dtype=a.dtype)
