"""One method's values at run time, and what the plan knows about each slot.

:class:`ValueTable` is what kernels, delegates and the executor read and write
while a method runs (``vals``: one :data:`~pyrt.memory.tensors.Value` per
slot); :class:`TensorInfo` is a tensor value's validated declaration (dtype,
bound, dim order, where its memory lives). The plan
(:mod:`pyrt.runtime.plan`) builds both at load.

>>> import numpy as np
>>> from pyrt.format.dtypes import ScalarType
>>> from pyrt.memory.host import NumpyHost
>>> info = TensorInfo(0, ScalarType.FLOAT, (2, 3), (0, 1), True, UNPLANNED)
>>> table = ValueTable("forward", NumpyHost(), ["Tensor"], {}, {0: info}, [np.zeros((2, 3), np.float32)])
>>> table.resize(0, (1, 3)).shape
(1, 3)
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from pyrt.errors import InputError
from pyrt.format.dtypes import ScalarType
from pyrt.format.schema import ValueKind
from pyrt.memory.host import NumpyHost, TorchHost
from pyrt.memory.layout import dim_order_strides
from pyrt.memory.tensors import DeviceTensor, Value

if TYPE_CHECKING:  # annotations only
    import torch

    from pyrt.cuda import Cuda, DeviceAllocation, Stream

PLANNED, CONSTANT, UNPLANNED = "planned", "constant", "unplanned"
LIST_KINDS = ("IntList", "TensorList", "OptionalTensorList")


class DeviceStreams(Protocol):
    """What kernels use of a method's device context (the runtime's
    :class:`~pyrt.runtime.device_context.DeviceContext`, a layer above this one): its CUDA seam, the
    run's stream of a device, the order between two devices' streams, and host -> device copies."""

    cuda: Cuda

    def stream(self, device: int) -> Stream: ...

    def order(self, src: int, dst: int) -> None: ...

    def copy_to_device(self, dst: DeviceAllocation, src: np.ndarray, stream: Stream, *, dst_offset: int = 0) -> None:
        ...


@dataclass(slots=True)
class TensorInfo:
    """What the file says about one tensor value, after validation; read-only by convention.

    Not ``frozen``: a frozen dataclass costs ~3x as much to build, and a load builds one per tensor.
    """

    index: int
    scalar_type: ScalarType
    sizes: tuple[int, ...]
    dim_order: tuple[int, ...]
    dynamic: bool
    storage: str  # planned | constant | unplanned
    device: int | None = None  # CUDA ordinal (after device_map) of a device arena; None = host
    memory_id: int = 0
    offset: int = 0

    @property
    def capacity(self) -> int:
        """Element bound: the sizes in the file are upper bounds for dynamic tensors."""
        return math.prod(self.sizes)

    @property
    def nbytes(self) -> int:
        return self.capacity * self.scalar_type.itemsize


@dataclass
class ValueTable:
    """The method's values at run time (``vals``, one :data:`~pyrt.memory.tensors.Value` per slot) plus what the plan
    knows about each."""

    method: str
    host: NumpyHost | TorchHost
    kinds: list[ValueKind]
    items: dict[int, tuple[int, ...]]
    infos: dict[int, TensorInfo]
    vals: list[Value]
    unstable: set[int] = field(default_factory=set)
    arenas: dict[int, Any] = field(default_factory=dict)
    devices: DeviceStreams | None = None  # when the method touches CUDA
    read_only: set[int] = field(default_factory=set)  # values that may hold constant data (never written)

    def is_const(self, i: int) -> bool:
        return i not in self.unstable

    def getter(self, i: int) -> Callable[[], Value]:
        """Zero-argument callable returning value ``i`` as kernels see it at run time."""
        if self.is_const(i):
            v = self.vals[i]
            return lambda: v
        kind = self.kinds[i]
        if kind in LIST_KINDS:
            vals, items = self.vals, self.items[i]
            if kind == "OptionalTensorList":
                return lambda: [None if j < 0 else vals[j] for j in items]
            return lambda: [vals[j] for j in items]
        return functools.partial(self.vals.__getitem__, i)

    def resize(self, i: int, shape: Sequence[int]) -> Any:
        """Give dynamic tensor ``i`` a new shape within its bound; returns the (new) tensor."""
        info = self.infos[i]
        shape = tuple(int(d) for d in shape)
        if len(shape) != len(info.sizes) or math.prod(shape) > info.capacity:
            raise InputError(
                f"method {self.method!r}: value {i} cannot take shape {shape}: its memory-planned "
                f"bound is {info.sizes} ({info.capacity} elements)"
            )
        t = self.vals[i]
        if isinstance(t, DeviceTensor):
            t.resize(shape, f"method {self.method!r} value {i}")
            return t
        if isinstance(self.host, TorchHost):
            tt: torch.Tensor = t  # type: ignore[assignment]  # the torch host's tensor slots hold torch tensors
            if tuple(tt.shape) != shape:
                tt.as_strided_(shape, dim_order_strides(shape, info.dim_order))
            return tt
        arena = self.arenas.get(info.memory_id)
        if info.storage != PLANNED or arena is None:
            new = self.host.empty(info.scalar_type, shape, info.dim_order)
        else:
            new = self.host.view(arena, info.offset, info.scalar_type, shape, info.dim_order)
        self.vals[i] = new
        return new
