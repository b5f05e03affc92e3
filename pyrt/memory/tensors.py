"""The tensors a value slot holds: device tensors, and the ``HostTensor``/``Value`` types.

Device memory is a :class:`DeviceTensor`: a typed window into a
:class:`pyrt.cuda.DeviceAllocation` that exports ``__cuda_array_interface__``;
:class:`OwnedDeviceTensor` frees its allocation when collected and :class:`OutputTensor`
is the one-step constructor used per output per graph replay. Host tensors (numpy arrays
or torch tensors) come from the backends of :mod:`pyrt.memory.host`; caller inputs and
outputs are converted by :mod:`pyrt.memory.interop`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeAlias, Union

import numpy as np

from pyrt.errors import InputError
from pyrt.format.dtypes import ScalarType
from pyrt.memory.layout import dim_order_strides, is_contiguous_order, numpy_dtype

if TYPE_CHECKING:  # annotations only: the runtime path never imports torch itself
    import torch

class DeviceTensor:
    """A typed, resizable window ``[offset, offset + capacity bytes)`` of device memory.

    ``shape`` may change between runs within ``capacity`` elements (dynamic
    shapes); ``ptr`` is the device address. Exports ``__cuda_array_interface__``
    (v3), so torch / cupy can wrap it without a copy.
    """

    __slots__ = ("allocation", "offset", "scalar_type", "shape", "capacity", "dim_order", "keepalive", "stream")

    def __init__(self, allocation: Any, offset: int, scalar_type: ScalarType, shape: tuple[int, ...],
                 capacity: int, dim_order: tuple[int, ...] = (), keepalive: Any = None) -> None:
        self.allocation = allocation
        self.offset = offset
        self.scalar_type = scalar_type
        self.shape = tuple(shape)
        self.capacity = capacity
        self.dim_order = dim_order or tuple(range(len(shape)))
        self.keepalive = keepalive
        self.stream: int | None = None  # the stream that last wrote it, when consumers must wait

    @property
    def device(self) -> int:
        return int(self.allocation.device)

    @property
    def ptr(self) -> int:
        return int(self.allocation.ptr) + self.offset

    @property
    def dtype(self) -> str:
        return self.scalar_type.dtype_name

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.scalar_type.itemsize

    def resize(self, shape: Sequence[int], what: str) -> None:
        shape = tuple(int(d) for d in shape)
        if math.prod(shape) > self.capacity:
            raise InputError(f"{what}: shape {shape} needs {math.prod(shape)} elements, "
                             f"more than its memory-planned bound of {self.capacity}")
        self.shape = shape

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        dtype = numpy_dtype(self.scalar_type)
        strides = None
        if not is_contiguous_order(self.dim_order):
            strides = tuple(s * dtype.itemsize for s in dim_order_strides(self.shape, self.dim_order))
        cai = {"shape": self.shape, "typestr": dtype.str, "data": (self.ptr, False), "version": 3,
               "strides": strides}
        if self.stream:
            cai["stream"] = self.stream
        return cai

    def __repr__(self) -> str:
        return f"DeviceTensor(shape={self.shape}, dtype={self.dtype}, device=cuda:{self.device}, ptr={self.ptr:#x})"


class OwnedDeviceTensor(DeviceTensor):
    """A device tensor that owns its allocation and frees it when garbage-collected."""

    __slots__ = ()

    def __del__(self) -> None:
        try:
            self.allocation.free()
        except Exception:  # interpreter shutdown or a closed fake driver: nothing to report to
            pass


class OutputTensor(OwnedDeviceTensor):
    """An owned device tensor made positionally, in one step: one per output per graph replay.

    ``OutputTensor(allocation, scalar_type, shape, capacity, dim_order, stream)`` takes the
    fields as they are (a planned output's, already normalised) at offset 0 of ``allocation``.
    """

    __slots__ = ()

    def __init__(self, allocation: Any, scalar_type: ScalarType, shape: tuple[int, ...],
                 capacity: int, dim_order: tuple[int, ...], stream: int | None) -> None:
        self.allocation = allocation
        self.offset = 0
        self.scalar_type = scalar_type
        self.shape = shape
        self.capacity = capacity
        self.dim_order = dim_order
        self.keepalive = None
        self.stream = stream


# -- what a value slot holds ----------------------------------------------------------------------

# A host tensor: a numpy array, or a torch tensor when torch kernels run (torch named in annotations only).
HostTensor: TypeAlias = Union[np.ndarray, "torch.Tensor"]
# One slot of a method's value table (``ValueTable.vals``): a host or device tensor, a scalar, a
# string, None (unset, or an absent optional), or a list of those (int/bool/double/tensor lists).
Value: TypeAlias = HostTensor | DeviceTensor | int | float | bool | str | None | list["Value"]
