"""The general reader's decoders for ``program.fbs`` tables: values, tensors, instructions, segments.

Each decoder reads one :class:`~pyrt.format.flatbuffer.Table` field by field through the
bounds-checked reader and raises a :class:`~pyrt.errors.PteFormatError` naming the field
that is malformed. The bulk decoders of :mod:`pyrt.format.values` make the valid case fast
and fall back to these; :mod:`pyrt.pte_reader` calls them on first access to a field.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

from pyrt.errors import PteFormatError
from pyrt.format.dtypes import ScalarType
from pyrt.format.flatbuffer import Table
from pyrt.format.schema import (
    EVALUE_KINDS,
    INSTRUCTION_KINDS,
    AllocationInfo,
    BufferDevice,
    DataSegment,
    DelegateCall,
    DeviceType,
    EValue,
    ExtraTensorInfo,
    FreeCall,
    Instruction,
    JumpFalseCall,
    KernelCall,
    MoveCall,
    NamedData,
    ShapeDynamism,
    SubsegmentOffsets,
    Tensor,
    TensorDataLocation,
)

# check_value_index(index, what) of the method being decoded: raises when index is out of range.
IndexCheck = Callable[[int, str], int]


def first(t: Table, i: int) -> Table:
    return t


def data_segment(t: Table, i: int) -> DataSegment:
    return DataSegment(int(t.scalar(0, "offset", "u64")), int(t.scalar(1, "size", "u64")))


def subsegment(t: Table) -> SubsegmentOffsets:
    offs = t.vector(1, "offsets", "u64")
    return SubsegmentOffsets(int(t.scalar(0, "segment_index", "u32")), offs.scalars() if offs else ())


def named_data(t: Table, i: int) -> NamedData:
    return NamedData(t.string(0, "key") or "", int(t.scalar(1, "segment_index", "u32")))


def buffer_device(t: Table, i: int) -> BufferDevice:
    return BufferDevice(
        int(t.scalar(0, "buffer_idx", "i32")),
        enum_member(DeviceType, t.scalar(1, "device_type", "i8"), "device_type", t),
        int(t.scalar(2, "device_index", "i8")),
    )


_ENUM_MEMBERS: dict[type, dict[int, Any]] = {}


def enum_member(kind: type[enum.IntEnum], raw: int | float, field: str, t: Table) -> Any:
    members = _ENUM_MEMBERS.get(kind)
    if members is None:  # a plain dict lookup: calling kind(raw) is slow on the load path
        members = _ENUM_MEMBERS[kind] = {m.value: m for m in kind}
    try:
        return members[int(raw)]
    except KeyError:
        raise PteFormatError(f"{t.span.source}: {t.name}.{field} has unknown value {raw}") from None


def decode_instruction(t: Table, i: int, check_value_index: IndexCheck, src: str) -> Instruction:
    """Instruction ``i`` of a chain; ``src`` names the method in errors."""
    tag, body = t.union(0, "instr_args")
    kind = INSTRUCTION_KINDS.get(tag)
    if kind is None or body is None:
        raise PteFormatError(f"{src}: instruction {i} has unknown or empty type tag {tag}")

    def idx(slot: int, field: str) -> int:
        return int(body.scalar(slot, field, "i32"))

    def args() -> tuple[int, ...]:
        vec = body.vector(1, "args", "i32")
        out = vec.scalars() if vec else ()
        for a in out:
            check_value_index(a, f"instruction {i} argument")
        return out

    if kind == "KernelCall":
        return KernelCall(idx(0, "op_index"), args())
    if kind == "DelegateCall":
        return DelegateCall(idx(0, "delegate_index"), args())
    if kind == "MoveCall":
        return MoveCall(idx(0, "move_from"), idx(1, "move_to"))
    if kind == "JumpFalseCall":
        return JumpFalseCall(idx(0, "cond_value_index"), idx(1, "destination_instruction"))
    return FreeCall(idx(0, "value_index"))


def decode_evalue(t: Table, check_value_index: IndexCheck) -> EValue:
    tag, body = t.union(0, "val")
    kind = EVALUE_KINDS.get(tag)
    if kind is None:
        raise PteFormatError(f"{t.span.source}: {t.name} has unknown EValue type tag {tag}")
    if kind == "Null" or body is None:
        if kind != "Null":
            raise PteFormatError(f"{t.span.source}: {t.name} is a {kind} with no payload")
        return EValue("Null", None)
    if kind == "Int":
        return EValue(kind, int(body.scalar(0, "int_val", "i64")))
    if kind == "Bool":
        return EValue(kind, bool(body.scalar(0, "bool_val", "bool")))
    if kind == "Double":
        return EValue(kind, float(body.scalar(0, "double_val", "f64")))
    if kind == "String":
        return EValue(kind, body.string(0, "string_val") or "")
    if kind == "Tensor":
        return EValue(kind, decode_tensor(body))
    elem = {"IntList": "i64", "DoubleList": "f64", "BoolList": "bool"}.get(kind, "i32")
    vec = body.vector(0, "items", elem)
    items = vec.scalars() if vec else ()
    if kind in ("TensorList", "OptionalTensorList"):
        for item in items:
            if not (kind == "OptionalTensorList" and item < 0):
                check_value_index(item, f"{t.name} {kind} item")
    return EValue(kind, items)


def check_layout(sizes: tuple[int, ...], dim_order: tuple[int, ...], what: str, *, order_optional: bool) -> None:
    """A tensor's ``sizes`` are >= 0 and its ``dim_order`` a permutation of its dims, else a PteFormatError
    naming ``what``. ``order_optional``: an empty ``dim_order`` stands for contiguous (a .pte's tensors).

    >>> check_layout((2, 3), (1, 0), "x", order_optional=False)
    >>> check_layout((2, 3), (), "x", order_optional=False)
    Traceback (most recent call last):
    ...
    pyrt.errors.PteFormatError: x dim_order () is not a permutation of 2 dims
    """
    if any(s < 0 for s in sizes):
        raise PteFormatError(f"{what} has negative sizes {sizes}")
    if (dim_order or not order_optional) and sorted(dim_order) != list(range(len(sizes))):
        raise PteFormatError(f"{what} dim_order {dim_order} is not a permutation of {len(sizes)} dims")


def decode_tensor(t: Table) -> Tensor:
    sizes_v = t.vector(2, "sizes", "i32")
    sizes = sizes_v.scalars() if sizes_v else ()
    dim_order_v = t.vector(3, "dim_order", "u8")
    dim_order = dim_order_v.scalars() if dim_order_v else ()
    check_layout(sizes, dim_order, f"{t.span.source}: {t.name}", order_optional=True)
    alloc = t.table(6, "allocation_info")
    extra = t.table(9, "extra_tensor_info")
    return Tensor(
        scalar_type=enum_member(ScalarType, t.scalar(0, "scalar_type", "i8"), "scalar_type", t),
        storage_offset=int(t.scalar(1, "storage_offset", "i32")),
        sizes=sizes,
        dim_order=dim_order,
        requires_grad=bool(t.scalar(4, "requires_grad", "bool")),
        data_buffer_idx=int(t.scalar(5, "data_buffer_idx", "u32")),
        allocation_info=None if alloc is None else AllocationInfo(
            int(alloc.scalar(0, "memory_id", "u32")),
            int(alloc.scalar(1, "memory_offset_low", "u32")) | int(alloc.scalar(2, "memory_offset_high", "u32")) << 32,
        ),
        layout=int(t.scalar(7, "layout", "i8")),
        shape_dynamism=enum_member(ShapeDynamism, t.scalar(8, "shape_dynamism", "i8"), "shape_dynamism", t),
        extra_tensor_info=None if extra is None else ExtraTensorInfo(
            mutable_data_segments_idx=int(extra.scalar(0, "mutable_data_segments_idx", "u64")),
            fully_qualified_name=extra.string(1, "fully_qualified_name"),
            location=enum_member(TensorDataLocation, extra.scalar(2, "location", "i8"), "location", extra),
            device_type=enum_member(DeviceType, extra.scalar(3, "device_type", "i8"), "device_type", extra),
            device_index=int(extra.scalar(4, "device_index", "i8")),
        ),
    )
