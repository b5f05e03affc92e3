"""Plain records of ExecuTorch's ``program.fbs``: what the reader decodes, typed.

Both decoders build these (the general reader in :mod:`pyrt.format.decode`, the bulk one in
:mod:`pyrt.format.values`); this module depends on neither, so they do not depend on each other's
import order.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import ClassVar, Literal, NamedTuple

from pyrt.format.dtypes import ScalarType


class ShapeDynamism(enum.IntEnum):
    STATIC = 0
    DYNAMIC_BOUND = 1
    DYNAMIC_UNBOUND = 2


class TensorDataLocation(enum.IntEnum):
    SEGMENT = 0
    EXTERNAL = 1


class DeviceType(enum.IntEnum):
    CPU = 0
    CUDA = 1


class DataLocation(enum.IntEnum):
    INLINE = 0
    SEGMENT = 1


# EValue union tags (program.fbs KernelTypes, NONE = 0).
ValueKind = Literal["Null", "Int", "Bool", "Double", "Tensor", "String", "IntList", "DoubleList", "BoolList",
                    "TensorList", "OptionalTensorList"]
InstructionKind = Literal["KernelCall", "DelegateCall", "MoveCall", "JumpFalseCall", "FreeCall"]
EVALUE_KINDS: dict[int, ValueKind] = {
    1: "Null", 2: "Int", 3: "Bool", 4: "Double", 5: "Tensor", 6: "String",
    7: "IntList", 8: "DoubleList", 9: "BoolList", 10: "TensorList", 11: "OptionalTensorList",
}
# Instruction union tags (program.fbs InstructionArguments, NONE = 0).
INSTRUCTION_KINDS: dict[int, InstructionKind] = {
    1: "KernelCall", 2: "DelegateCall", 3: "MoveCall", 4: "JumpFalseCall", 5: "FreeCall",
}


# -- plain records ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExtendedHeader:
    program_size: int
    segment_base_offset: int
    segment_data_size: int | None


@dataclass(frozen=True)
class DataSegment:
    offset: int
    size: int


@dataclass(frozen=True)
class SubsegmentOffsets:
    segment_index: int
    offsets: tuple[int, ...]


@dataclass(frozen=True)
class NamedData:
    key: str
    segment_index: int


class AllocationInfo(NamedTuple):
    memory_id: int
    memory_offset: int  # low | high << 32


@dataclass(frozen=True)
class ExtraTensorInfo:
    mutable_data_segments_idx: int
    fully_qualified_name: str | None
    location: TensorDataLocation
    device_type: DeviceType
    device_index: int


class Tensor(NamedTuple):
    """A tensor value's declaration (a NamedTuple, as EValue and AllocationInfo: a load builds thousands)."""

    scalar_type: ScalarType
    storage_offset: int
    sizes: tuple[int, ...]
    dim_order: tuple[int, ...]
    requires_grad: bool
    data_buffer_idx: int
    allocation_info: AllocationInfo | None
    layout: int
    shape_dynamism: ShapeDynamism
    extra_tensor_info: ExtraTensorInfo | None

    @property
    def numel(self) -> int:
        return math.prod(self.sizes)

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor at its (upper-bound) sizes."""
        return self.numel * self.scalar_type.itemsize

    @property
    def is_external(self) -> bool:
        """Data is a named-data entry keyed by ``fully_qualified_name`` (usually in a .ptd)."""
        return self.extra_tensor_info is not None and self.extra_tensor_info.location == TensorDataLocation.EXTERNAL

    @property
    def is_constant(self) -> bool:
        """Read-only data in the file: the constant segment, or external data without planned memory.

        An external tensor with ``allocation_info`` is a mutable (planned) tensor whose initial
        value comes from the named data, as in ExecuTorch.
        """
        return self.allocation_info is None and (self.is_external or self.data_buffer_idx > 0)


# What an EValue carries, by kind (see EValue); list payloads are tuples of literals or value indices.
Payload = None | bool | int | float | str | Tensor | tuple[int, ...] | tuple[float, ...] | tuple[bool, ...]


class EValue(NamedTuple):
    """One value slot; ``kind`` is the union member name, ``value`` its Python payload.

    Payloads: Null -> None, Int -> int, Bool -> bool, Double -> float,
    Tensor -> :class:`Tensor`, String -> str, IntList / TensorList /
    OptionalTensorList -> tuple of value indices (-1 = None in optional lists),
    DoubleList / BoolList -> tuple of literals.
    """

    kind: ValueKind
    value: Payload

    @property
    def tensor(self) -> Tensor:
        """The payload of a ``Tensor`` value; TypeError for another kind (the caller's bug, not the file's)."""
        if isinstance(self.value, Tensor):
            return self.value
        raise TypeError(f"a {self.kind} value has no tensor payload")


@dataclass(frozen=True)
class Operator:
    name: str
    overload: str

    @property
    def qualified_name(self) -> str:
        return f"{self.name}.{self.overload}" if self.overload else self.name


@dataclass(frozen=True)
class KernelCall:
    op_index: int
    args: tuple[int, ...]
    kind: ClassVar[InstructionKind] = "KernelCall"


@dataclass(frozen=True)
class DelegateCall:
    delegate_index: int
    args: tuple[int, ...]
    kind: ClassVar[InstructionKind] = "DelegateCall"


@dataclass(frozen=True)
class MoveCall:
    move_from: int
    move_to: int
    kind: ClassVar[InstructionKind] = "MoveCall"


@dataclass(frozen=True)
class JumpFalseCall:
    cond_value_index: int
    destination_instruction: int
    kind: ClassVar[InstructionKind] = "JumpFalseCall"


@dataclass(frozen=True)
class FreeCall:
    value_index: int
    kind: ClassVar[InstructionKind] = "FreeCall"


Instruction = KernelCall | DelegateCall | MoveCall | JumpFalseCall | FreeCall


@dataclass(frozen=True)
class Chain:
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    instructions: tuple[Instruction, ...]


@dataclass(frozen=True)
class BufferDevice:
    buffer_idx: int
    device_type: DeviceType
    device_index: int
