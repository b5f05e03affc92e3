"""Tensor layout facts: ExecuTorch scalar types as numpy/torch dtypes, dim-order strides, window records.

The lowest module of the memory layer: pure functions and type aliases that the device
tensors (:mod:`pyrt.memory.tensors`), the host backends (:mod:`pyrt.memory.host`) and caller
interop (:mod:`pyrt.memory.interop`) share. torch is imported only by :func:`torch_dtype`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from pyrt.errors import UnsupportedOperatorError
from pyrt.format.dtypes import ScalarType

_NUMPY_NAMES = {
    ScalarType.BYTE: "uint8", ScalarType.CHAR: "int8", ScalarType.SHORT: "int16", ScalarType.INT: "int32",
    ScalarType.LONG: "int64", ScalarType.HALF: "float16", ScalarType.FLOAT: "float32",
    ScalarType.DOUBLE: "float64", ScalarType.BOOL: "bool", ScalarType.UINT16: "uint16",
    ScalarType.UINT32: "uint32", ScalarType.UINT64: "uint64",
}
_TORCH_NAMES = {
    ScalarType.BYTE: "uint8", ScalarType.CHAR: "int8", ScalarType.SHORT: "int16", ScalarType.INT: "int32",
    ScalarType.LONG: "int64", ScalarType.HALF: "float16", ScalarType.FLOAT: "float32",
    ScalarType.DOUBLE: "float64", ScalarType.BOOL: "bool", ScalarType.BFLOAT16: "bfloat16",
    ScalarType.UINT16: "uint16", ScalarType.UINT32: "uint32", ScalarType.UINT64: "uint64",
    ScalarType.FLOAT8E5M2: "float8_e5m2", ScalarType.FLOAT8E4M3FN: "float8_e4m3fn",
}


def numpy_dtype(st: ScalarType) -> np.dtype:
    """The numpy dtype of an ExecuTorch scalar type (bfloat16 through ml_dtypes when installed)."""
    name = _NUMPY_NAMES.get(st)
    if name is not None:
        return np.dtype(name)
    if st == ScalarType.BFLOAT16:
        try:
            import ml_dtypes  # noqa: PLC0415 - optional

            return np.dtype(ml_dtypes.bfloat16)
        except ImportError:
            pass
    raise UnsupportedOperatorError(f"scalar type {st.name} has no numpy equivalent")


def scalar_type_of_numpy(dtype: np.dtype) -> ScalarType | None:
    for st, name in _NUMPY_NAMES.items():
        if dtype == np.dtype(name):
            return st
    return ScalarType.BFLOAT16 if dtype.name == "bfloat16" else None


def torch_dtype(st: ScalarType) -> Any:
    import torch

    name = _TORCH_NAMES.get(st)
    dtype = getattr(torch, name, None) if name else None
    if dtype is None:
        raise UnsupportedOperatorError(f"scalar type {st.name} has no torch equivalent")
    return dtype


def scalar_type_of_torch(dtype: Any) -> ScalarType | None:
    name = str(dtype).removeprefix("torch.")
    for st, tname in _TORCH_NAMES.items():
        if tname == name:
            return st
    return None


def dim_order_strides(sizes: Sequence[int], dim_order: Sequence[int]) -> tuple[int, ...]:
    """Element strides of a dense tensor laid out in ``dim_order`` (outermost first).

    >>> dim_order_strides((1, 3, 4, 4), (0, 2, 3, 1))
    (48, 1, 12, 3)
    """
    order = tuple(dim_order) or tuple(range(len(sizes)))
    strides = [0] * len(sizes)
    step = 1
    for d in reversed(order):
        strides[d] = step
        step *= max(sizes[d], 1)
    return tuple(strides)


@functools.lru_cache(maxsize=1024)
def strides_of(sizes: tuple[int, ...], dim_order: tuple[int, ...]) -> tuple[int, ...]:
    """:func:`dim_order_strides` of hashable arguments, remembered (a model repeats a few layouts)."""
    return dim_order_strides(sizes, dim_order)


# One window of a memory arena: (byte offset, scalar type, sizes, dim order), already validated.
Window = tuple[int, ScalarType, tuple[int, ...], tuple[int, ...]]
# One constant: (its bytes in the file, scalar type, sizes, dim order).
Constant = tuple[memoryview, ScalarType, tuple[int, ...], tuple[int, ...]]


def is_contiguous_order(dim_order: Sequence[int]) -> bool:
    return tuple(dim_order) == tuple(range(len(dim_order)))


def c_strides(shape: Sequence[int], itemsize: int) -> tuple[int, ...]:
    """Byte strides of a C-contiguous ``shape`` of ``itemsize``-byte elements (innermost last)."""
    out, step = [], itemsize
    for d in reversed(shape):
        out.append(step)
        step *= max(d, 1)
    return tuple(reversed(out))
