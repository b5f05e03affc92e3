"""Bulk decoding of a method's ``values`` and instructions: the load path's hottest loops.

:meth:`pyrt.pte_reader.ExecutionPlan.values` (and each chain's instructions) decode
thousands of small tables;
through the general :class:`~pyrt._flatbuffer.Table` reader each field costs several
method calls. This decoder reads the same fields with the same checks inline
(every offset bounds-checked before it is read, vtables validated once each,
since FlatBuffers shares them) and gives up with :class:`Fallback` at the first
thing it does not like; the caller then decodes with the general reader, which
raises the typed error naming the field. So this module never decides what is
an error: it only makes the valid case fast, and tests check both decoders
agree on valid and corrupted files.
"""

from __future__ import annotations

import struct
from typing import Any

from pyrt.dtypes import ScalarType
from pyrt.schema import (
    EVALUE_KINDS,
    AllocationInfo,
    DelegateCall,
    DeviceType,
    EValue,
    ExtraTensorInfo,
    FreeCall,
    Instruction,
    JumpFalseCall,
    KernelCall,
    MoveCall,
    ShapeDynamism,
    Tensor,
    TensorDataLocation,
)

_U8 = struct.Struct("<B").unpack_from
_I8 = struct.Struct("<b").unpack_from
_U16x2 = struct.Struct("<HH").unpack_from
_U32 = struct.Struct("<I").unpack_from
_I32 = struct.Struct("<i").unpack_from
_I64 = struct.Struct("<q").unpack_from
_U64 = struct.Struct("<Q").unpack_from
_F64 = struct.Struct("<d").unpack_from
_SCALAR_TYPES = {int(m): m for m in ScalarType}
_DYNAMISM = {int(m): m for m in ShapeDynamism}
_LOCATIONS = {int(m): m for m in TensorDataLocation}
_DEVICES = {int(m): m for m in DeviceType}
_LIST_ELEM = {"IntList": "q", "DoubleList": "d", "BoolList": "B", "TensorList": "i", "OptionalTensorList": "i"}
_LIST_SIZE = {"q": 8, "d": 8, "B": 1, "i": 4}


_set = object.__setattr__


def _record(cls: type, fields: dict[str, Any]) -> Any:
    """An instance of frozen dataclass ``cls`` with ``fields`` (all of them), without its slow ``__init__``."""
    obj: Any = object.__new__(cls)
    _set(obj, "__dict__", fields)
    return obj


class Fallback(Exception):
    """The fast decoder met something it does not handle; decode with the general reader."""


_TENSOR_FIELDS = (1, 4, 4, 4, 1, 4, 4, 1, 1, 4)  # byte sizes of Tensor's slots 0..9 (program.fbs order)
_EVALUE_FIELDS = (1, 4)  # val_type, val


class _Reader:
    __slots__ = ("data", "n", "vtables", "layouts")

    def __init__(self, data: memoryview, n: int) -> None:
        self.data, self.n = data, n
        self.vtables: dict[int, tuple[tuple[int, ...], int]] = {}
        self.layouts: dict[tuple[int, tuple[int, ...]], tuple[tuple[int, ...], int]] = {}

    def layout(self, pos: int, sizes: tuple[int, ...]) -> tuple[int, ...]:
        """Offsets (0: absent) of slots ``0..len(sizes)-1`` of the table at ``pos``, each field validated.

        FlatBuffers shares vtables, so the per-field checks run once per vtable, not per table.
        """
        data, n = self.data, self.n
        if pos < 0 or pos + 4 > n:
            raise Fallback
        vt = pos - _I32(data, pos)[0]
        hit = self.layouts.get((vt, sizes))
        if hit is None:
            offs, tsize = self.table(pos)
            found = tuple(offs[k] if k < len(offs) else 0 for k in range(len(sizes)))
            if any(o and o + size > tsize for o, size in zip(found, sizes, strict=True)):
                raise Fallback
            hit = self.layouts[vt, sizes] = (found, tsize)
        if pos + hit[1] > n:
            raise Fallback
        return hit[0]

    def vector_at(self, where: int, fmt: str) -> tuple:
        """The scalar vector a uoffset at absolute position ``where`` points to."""
        start = where + _U32(self.data, where)[0]
        if start + 4 > self.n:
            raise Fallback
        count = _U32(self.data, start)[0]
        if start + 4 + count * _LIST_SIZE[fmt] > self.n:
            raise Fallback
        return struct.unpack_from(f"<{count}{fmt}", self.data, start + 4)

    def table(self, pos: int) -> tuple[tuple[int, ...], int]:
        """(field offsets, table size) of the table at ``pos``; both validated."""
        data, n = self.data, self.n
        if pos < 0 or pos + 4 > n:
            raise Fallback
        vt = pos - _I32(data, pos)[0]
        entry = self.vtables.get(vt)
        if entry is None:
            if vt < 0 or vt + 4 > n:
                raise Fallback
            vtsize, tsize = _U16x2(data, vt)
            if vtsize < 4 or vtsize % 2 or vt + vtsize > n:
                raise Fallback
            entry = self.vtables[vt] = (struct.unpack_from(f"<{(vtsize - 4) // 2}H", data, vt + 4), tsize)
        if pos + entry[1] > n:
            raise Fallback
        return entry

    def target(self, pos: int, entry: tuple[tuple[int, ...], int], slot: int) -> int | None:
        where = _field(pos, entry, slot, 4)
        return None if where is None else where + _U32(self.data, where)[0]

    def vector(self, pos: int, entry: tuple[tuple[int, ...], int], slot: int, fmt: str) -> tuple:
        where = _field(pos, entry, slot, 4)
        return () if where is None else self.vector_at(where, fmt)

    def string(self, pos: int, entry: tuple[tuple[int, ...], int], slot: int) -> str | None:
        start = self.target(pos, entry, slot)
        if start is None:
            return None
        if start + 4 > self.n:
            raise Fallback
        count = _U32(self.data, start)[0]
        if start + 4 + count > self.n:
            raise Fallback
        try:
            return bytes(self.data[start + 4: start + 4 + count]).decode("utf-8")
        except UnicodeDecodeError:
            raise Fallback from None


def _field(pos: int, entry: tuple[tuple[int, ...], int], slot: int, size: int) -> int | None:
    offs, tsize = entry
    if slot >= len(offs) or offs[slot] == 0:
        return None
    off = offs[slot]
    if off + size > tsize:
        raise Fallback
    return pos + off


def decode_values(data: memoryview, length: int, vector_start: int, count: int) -> tuple[EValue, ...]:
    """Every EValue of a ``values`` vector whose offsets start at ``vector_start`` (already bounds-checked)."""
    r = _Reader(data, length)
    out: list[EValue] = []
    for i in range(count):
        p = vector_start + 4 * i
        pos = p + _U32(data, p)[0]
        o_tag, o_val = r.layout(pos, _EVALUE_FIELDS)
        kind = EVALUE_KINDS.get(_U8(data, pos + o_tag)[0] if o_tag else 0)
        if kind is None:
            raise Fallback
        body = None if not o_val else pos + o_val + _U32(data, pos + o_val)[0]
        if body is None:
            if kind != "Null":
                raise Fallback
            out.append(EValue("Null", None))
            continue
        if kind == "Null":
            r.table(body)  # the general reader validates a Null's (unused) payload table too
            out.append(EValue("Null", None))
            continue
        out.append(_record(EValue, {"kind": kind, "value": _payload(r, kind, body, count)}))
    return tuple(out)


def _payload(r: _Reader, kind: str, body: int, count: int) -> Any:
    data = r.data
    if kind == "Tensor":
        return _tensor(r, body)
    entry = r.table(body)
    if kind == "Int":
        w = _field(body, entry, 0, 8)
        return 0 if w is None else _I64(data, w)[0]
    if kind == "Bool":
        w = _field(body, entry, 0, 1)
        return False if w is None else bool(_U8(data, w)[0])
    if kind == "Double":
        w = _field(body, entry, 0, 8)
        return 0.0 if w is None else _F64(data, w)[0]
    if kind == "String":
        return r.string(body, entry, 0) or ""
    fmt = _LIST_ELEM[kind]
    items = r.vector(body, entry, 0, fmt)
    if kind == "BoolList":
        return tuple(bool(v) for v in items)
    if kind in ("TensorList", "OptionalTensorList"):
        for item in items:
            if not 0 <= item < count and not (kind == "OptionalTensorList" and item < 0):
                raise Fallback
    return items


def _tensor(r: _Reader, pos: int) -> Tensor:
    data = r.data
    o_st, o_so, o_sizes, o_dim, o_rg, o_dbi, o_alloc, o_layout, o_dyn, o_extra = r.layout(pos, _TENSOR_FIELDS)
    sizes = r.vector_at(pos + o_sizes, "i") if o_sizes else ()
    if any(s < 0 for s in sizes):
        raise Fallback
    dim_order = r.vector_at(pos + o_dim, "B") if o_dim else ()
    if dim_order and sorted(dim_order) != list(range(len(sizes))):
        raise Fallback
    alloc = None
    if o_alloc:
        a = pos + o_alloc + _U32(data, pos + o_alloc)[0]
        ae = r.table(a)
        alloc = AllocationInfo(_small(data, a, ae, 0, _U32, 4),
                               _small(data, a, ae, 1, _U32, 4) | _small(data, a, ae, 2, _U32, 4) << 32)
    extra = None
    if o_extra:
        x = pos + o_extra + _U32(data, pos + o_extra)[0]
        xe = r.table(x)
        extra = ExtraTensorInfo(
            mutable_data_segments_idx=_small(data, x, xe, 0, _U64, 8),
            fully_qualified_name=r.string(x, xe, 1),
            location=_member(_LOCATIONS, _small(data, x, xe, 2, _I8, 1)),
            device_type=_member(_DEVICES, _small(data, x, xe, 3, _I8, 1)),
            device_index=_small(data, x, xe, 4, _I8, 1),
        )
    return _record(Tensor, {
        "scalar_type": _member(_SCALAR_TYPES, _I8(data, pos + o_st)[0] if o_st else 0),
        "storage_offset": _I32(data, pos + o_so)[0] if o_so else 0,
        "sizes": sizes,
        "dim_order": dim_order,
        "requires_grad": bool(_U8(data, pos + o_rg)[0]) if o_rg else False,
        "data_buffer_idx": _U32(data, pos + o_dbi)[0] if o_dbi else 0,
        "allocation_info": alloc,
        "layout": _I8(data, pos + o_layout)[0] if o_layout else 0,
        "shape_dynamism": _member(_DYNAMISM, _I8(data, pos + o_dyn)[0] if o_dyn else 0),
        "extra_tensor_info": extra,
    })


def _small(data: memoryview, pos: int, entry: tuple[tuple[int, ...], int], slot: int, unpack: Any, size: int) -> int:
    w = _field(pos, entry, slot, size)
    return 0 if w is None else unpack(data, w)[0]


def _member(members: dict[int, Any], raw: int) -> Any:
    try:
        return members[raw]
    except KeyError:
        raise Fallback from None


def decode_instructions(data: memoryview, length: int, vector_start: int, count: int,
                        num_values: int) -> tuple[Instruction, ...]:
    """Every instruction of a chain's ``instructions`` vector (offsets already bounds-checked)."""
    r = _Reader(data, length)
    out: list[Instruction] = []
    for i in range(count):
        p = vector_start + 4 * i
        pos = p + _U32(data, p)[0]
        entry = r.table(pos)
        where = _field(pos, entry, 0, 1)
        tag = 0 if where is None else _U8(data, where)[0]
        body = r.target(pos, entry, 1)
        if body is None or not 1 <= tag <= 5:
            raise Fallback
        be = r.table(body)
        a = _small(data, body, be, 0, _I32, 4)
        if tag in (1, 2):
            args = r.vector(body, be, 1, "i")
            for v in args:
                if not 0 <= v < num_values:
                    raise Fallback
            out.append(KernelCall(a, args) if tag == 1 else DelegateCall(a, args))
        elif tag == 3:
            out.append(MoveCall(a, _small(data, body, be, 1, _I32, 4)))
        elif tag == 4:
            out.append(JumpFalseCall(a, _small(data, body, be, 1, _I32, 4)))
        else:
            out.append(FreeCall(a))
    return tuple(out)
