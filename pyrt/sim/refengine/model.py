"""The reference engine's graph model: inputs and outputs, weights, nodes and their argument
kinds, the dtypes it knows, and the errors the format and the executor raise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pyrt.errors import EngineError
from pyrt.format.dtypes import itemsize_of

# dtype name -> bytes per element; numpy cannot hold bfloat16 (torch can).
DTYPES: dict[str, int] = {
    name: itemsize_of(name)
    for name in ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool")
}


class RefEngineFormatError(EngineError, ValueError):
    """Bytes claiming to be a reference engine are malformed."""


class RefEngineExecutionError(EngineError):
    """A reference graph could not run (bad shapes, wrong output dtype, ...)."""


# -- the graph model ---------------------------------------------------------
@dataclass(frozen=True)
class Ref:
    """An argument naming a graph input, a weight or an earlier node output."""

    name: str


@dataclass(frozen=True)
class DType:
    """An argument that is a dtype (e.g. ``_to_copy``'s ``dtype=``)."""

    name: str


@dataclass(frozen=True)
class MemoryFormat:
    """An argument that is a ``torch.memory_format`` (e.g. ``clone``'s ``memory_format=``)."""

    name: str


@dataclass(frozen=True)
class RefTensor:
    """A graph input or output; -1 marks a dynamic dim (inputs then need min/max)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    min_shape: tuple[int, ...] | None = None
    max_shape: tuple[int, ...] | None = None

    def profile(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(min_shape, max_shape); a static input's are its shape."""
        return tuple(self.min_shape or self.shape), tuple(self.max_shape or self.shape)


@dataclass(frozen=True)
class RefProfile:
    """One optimization profile: ``shapes`` maps each dynamic input to (min, opt, max); static
    inputs may be left out (their shape is all three). ``device_memory``: the activation bytes an
    execution context needs with this profile (TensorRT's ``get_device_memory_size_for_profile_v2``).
    """

    shapes: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = field(default_factory=dict)
    device_memory: int = 0

    def bounds(self, t: RefTensor) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """(min, opt, max) of input ``t`` under this profile."""
        if t.name in self.shapes:
            lo, opt, hi = self.shapes[t.name]
            return tuple(lo), tuple(opt), tuple(hi)
        lo, hi = t.profile()
        return lo, hi, hi


@dataclass(frozen=True)
class RefWeight:
    """A constant: raw little-endian bytes of a C-contiguous tensor."""

    dtype: str
    shape: tuple[int, ...]
    data: memoryview

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    @classmethod
    def of(cls, value: Any, *, copy: bool = True) -> RefWeight:
        """From a numpy array or a torch tensor (copied to contiguous CPU bytes).

        ``copy=False`` views the bytes instead where they already are contiguous CPU
        memory, so the weight changes with ``value``.
        """
        if isinstance(value, RefWeight):
            return value
        if hasattr(value, "detach"):  # a torch tensor: bfloat16 survives as raw bytes
            t = value.detach().cpu().contiguous()
            raw = t.reshape(-1).view(__import__("torch").uint8).numpy()
            dtype, shape = str(t.dtype).removeprefix("torch."), tuple(t.shape)
        else:
            raw = np.asarray(value, order="C")  # (ascontiguousarray would make 0-d arrays 1-d)
            dtype, shape = raw.dtype.name, tuple(raw.shape)
        return cls(dtype, shape, memoryview(raw.tobytes() if copy else raw.reshape(-1).view(np.uint8)))


@dataclass(frozen=True)
class RefNode:
    """One op call: ``target`` like ``aten::mm`` or ``aten::add.Tensor``; one output name per result."""

    target: str
    args: list[Any]
    kwargs: dict[str, Any]
    outputs: list[str]

