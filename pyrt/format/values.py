"""Bulk decoding of a method's ``values``, instructions and operators: the load path's hottest loops.

:meth:`pyrt.pte_reader.ExecutionPlan.values` (and each chain's instructions, and the
operators) decode thousands of small tables;
through the general :class:`~pyrt.format.flatbuffer.Table` reader each field costs several
method calls. This decoder reads the same fields with the same checks inline
(every offset bounds-checked before it is read, vtables validated once each,
since FlatBuffers shares them) and gives up with :class:`Fallback` at the first
thing it does not like; the caller then decodes with the general reader, which
raises the typed error naming the field. So this module never decides what is
an error: it only makes the valid case fast, and tests check both decoders
agree on valid and corrupted files.

Speed comes from doing per vtable what can be done per vtable: a table's field
layout is validated once and cached by vtable position, and a Tensor's scalar
slots are read by one ``struct`` compiled for its vtable. Records are the typed
:mod:`pyrt.format.schema` classes, built without their argument parsing.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from operator import itemgetter
from typing import TypeVar

from pyrt.format.dtypes import ScalarType
from pyrt.format.schema import (
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
    Operator,
    Payload,
    ShapeDynamism,
    Tensor,
    TensorDataLocation,
    ValueKind,
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
Layout = tuple[tuple[int, ...], int]  # (offset of each wanted field, 0: absent; table size)
# A table's layout plus a reader of all its scalar slots: (offsets, table size, unpack of the present
# fields in offset order, getter putting them in slot order, zeros for absent slots appended to that).
Row = tuple[tuple[int, ...], int, Callable[[memoryview, int], tuple[int, ...]],
            Callable[[tuple[int, ...]], tuple[int, ...]], tuple[int, ...]]
Unpack = Callable[[memoryview, int], tuple[int, ...]]
R = TypeVar("R")
T = TypeVar("T", bound=tuple)
_tuple_new = tuple.__new__
E = TypeVar("E")


def _record(cls: type[R], fields: dict[str, object]) -> R:
    """An instance of frozen dataclass ``cls`` with ``fields`` (all of them), without its slow ``__init__``."""
    obj = object.__new__(cls)
    _set(obj, "__dict__", fields)
    return obj


def _row(cls: type[T], fields: tuple[object, ...]) -> T:
    """An instance of NamedTuple ``cls`` from all its fields in order, without its ``__new__``'s argument parsing."""
    return _tuple_new(cls, fields)


class Fallback(Exception):
    """The fast decoder met something it does not handle; decode with the general reader."""


# Tensor's slots 0..9 (program.fbs order): scalar_type, storage_offset, sizes, dim_order, requires_grad,
# data_buffer_idx, allocation_info, layout, shape_dynamism, extra_tensor_info (uoffsets read as "I").
_TENSOR_CODES = "biIIBIIbbI"
_EVALUE_FIELDS = (1, 4)  # val_type, val


class _Reader:
    __slots__ = ("data", "n", "vtables", "layouts", "rows", "permutations", "int_vectors")

    def __init__(self, data: memoryview, n: int) -> None:
        self.data, self.n = data, n
        self.vtables: dict[int, tuple[tuple[int, ...], int]] = {}
        self.layouts: dict[tuple[int, ...], dict[int, Layout]] = {}  # field sizes -> vtable position -> layout
        self.rows: dict[str, dict[int, Row]] = {}  # struct codes -> vtable position -> row reader
        self.permutations: set[tuple[int, ...]] = set()  # dim orders seen to be permutations of range(len)
        self.int_vectors: dict[int, Unpack] = {}  # count -> reader of that many int32s (tensor sizes)

    def cache(self, sizes: tuple[int, ...]) -> dict[int, Layout]:
        """The layouts of tables read with field ``sizes``, by vtable position (hot loops hold it)."""
        return self.layouts.setdefault(sizes, {})

    def layout(self, pos: int, sizes: tuple[int, ...]) -> tuple[int, ...]:
        """Offsets (0: absent) of slots ``0..len(sizes)-1`` of the table at ``pos``, each field validated.

        FlatBuffers shares vtables, so the per-field checks run once per vtable, not per table.
        """
        data, n = self.data, self.n
        if pos < 0 or pos + 4 > n:
            raise Fallback
        cache = self.cache(sizes)
        hit = cache.get(pos - _I32(data, pos)[0]) or self.fill(pos, sizes, cache)
        if pos + hit[1] > n:
            raise Fallback
        return hit[0]

    def fill(self, pos: int, sizes: tuple[int, ...], cache: dict[int, Layout]) -> Layout:
        """Validate the vtable of the table at ``pos`` (in bounds) for fields of ``sizes``; cache its layout."""
        offs, tsize = self.table(pos)
        found = tuple(offs[k] if k < len(offs) else 0 for k in range(len(sizes)))
        if any(o and o + size > tsize for o, size in zip(found, sizes, strict=True)):
            raise Fallback
        hit = cache[pos - _I32(self.data, pos)[0]] = (found, tsize)
        return hit

    def row_cache(self, codes: str) -> dict[int, Row]:
        """The row readers of tables whose slots hold ``codes`` (struct codes), by vtable position."""
        return self.rows.setdefault(codes, {})

    def fill_row(self, pos: int, codes: str, cache: dict[int, Row]) -> Row:
        """A reader of every scalar slot of tables sharing the vtable of the table at ``pos``: one unpack.

        Present fields are read in offset order by one compiled struct (padding between
        them), then put in slot order with absent ones 0. Overlapping fields give up.
        """
        sizes = tuple(struct.calcsize(c) for c in codes)
        offsets, tsize = self.fill(pos, sizes, self.cache(sizes))
        present = sorted((o, k) for k, o in enumerate(offsets) if o)
        fmt, end, order = "<", 0, []
        for o, k in present:
            if o < end:
                raise Fallback
            fmt += "x" * (o - end) + codes[k]
            end = o + sizes[k]
            order.append(k)
        where = [order.index(k) if k in order else len(order) + k for k in range(len(codes))]
        row = cache[pos - _I32(self.data, pos)[0]] = (offsets, tsize, struct.Struct(fmt).unpack_from,
                                                      itemgetter(*where), (0,) * len(codes))
        return row

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


_NULL = EValue("Null", None)
_SLOT8, _SLOT4, _SLOT1 = (8,), (4,), (1,)  # one-field tables: Int/Double, lists and String, Bool


def _offsets(data: memoryview, start: int, count: int) -> tuple[int, ...]:
    """The ``count`` uoffsets of a vector of tables, read in one call (the caller checked the bounds)."""
    return struct.unpack_from(f"<{count}I", data, start)


def decode_values(data: memoryview, length: int, vector_start: int, count: int) -> tuple[EValue, ...]:
    """Every EValue of a ``values`` vector whose offsets start at ``vector_start`` (already bounds-checked)."""
    r = _Reader(data, length)
    out: list[EValue] = []
    append = out.append
    layouts, ints = r.cache(_EVALUE_FIELDS), r.cache(_SLOT8)
    tensors, allocs = r.row_cache(_TENSOR_CODES), r.row_cache(_ALLOC_CODES)
    row, kinds = _row, EVALUE_KINDS
    for i, off in enumerate(_offsets(data, vector_start, count)):
        pos = vector_start + 4 * i + off
        if pos + 4 > length:
            raise Fallback
        (o_tag, o_val), tsize = layouts.get(pos - _I32(data, pos)[0]) or r.fill(pos, _EVALUE_FIELDS, layouts)
        if pos + tsize > length:
            raise Fallback
        kind = kinds.get(_U8(data, pos + o_tag)[0] if o_tag else 0)
        if kind is None:
            raise Fallback
        if not o_val:
            if kind != "Null":
                raise Fallback
            append(_NULL)
            continue
        body = pos + o_val + _U32(data, pos + o_val)[0]
        if kind == "Int":  # the commonest kinds inline: a layout lookup and a read or two
            if body + 4 > length:
                raise Fallback
            (w,), tsize = ints.get(body - _I32(data, body)[0]) or r.fill(body, _SLOT8, ints)
            if body + tsize > length:
                raise Fallback
            append(row(EValue, (kind, _I64(data, body + w)[0] if w else 0)))
        elif kind == "Tensor":
            append(row(EValue, (kind, _tensor(r, body, tensors, allocs))))
        elif kind == "Null":
            r.table(body)  # the general reader validates a Null's (unused) payload table too
            append(_NULL)
        else:
            append(row(EValue, (kind, _payload(r, kind, body, count))))
    return tuple(out)


def _payload(r: _Reader, kind: ValueKind, body: int, count: int) -> Payload:
    data = r.data
    if kind == "Int":
        (w,) = r.layout(body, _SLOT8)
        return _I64(data, body + w)[0] if w else 0
    if kind == "Bool":
        (w,) = r.layout(body, _SLOT1)
        return bool(_U8(data, body + w)[0]) if w else False
    if kind == "Double":
        (w,) = r.layout(body, _SLOT8)
        return _F64(data, body + w)[0] if w else 0.0
    if kind == "String":
        return r.string(body, r.table(body), 0) or ""
    fmt = _LIST_ELEM[kind]
    (w,) = r.layout(body, _SLOT4)
    items = r.vector_at(body + w, fmt) if w else ()
    if kind == "BoolList":
        return tuple(bool(v) for v in items)
    if kind in ("TensorList", "OptionalTensorList") and items:  # indices; -1 (None) only in optional lists
        if max(items) >= count or (kind == "TensorList" and min(items) < 0):
            raise Fallback
    return items


_ALLOC_CODES = "III"  # memory_id, memory_offset_low, memory_offset_high


def _tensor(r: _Reader, pos: int, rows: dict[int, Row], allocs: dict[int, Row]) -> Tensor:
    data, n = r.data, r.n
    if pos + 4 > n:
        raise Fallback
    offsets, tsize, unpack, order, zeros = rows.get(pos - _I32(data, pos)[0]) or r.fill_row(pos, _TENSOR_CODES, rows)
    if pos + tsize > n:
        raise Fallback
    _, _, o_sizes, o_dim, _, _, o_alloc, _, _, o_extra = offsets
    fields = order(unpack(data, pos) + zeros)
    st, storage_offset, rel_sizes, rel_dim, grad, dbi, rel_alloc, layout, dyn, rel_extra = fields
    sizes = _sizes(r, pos + o_sizes + rel_sizes) if o_sizes else ()
    dim_order = _dim_order(r, pos + o_dim + rel_dim, sizes) if o_dim else ()
    alloc = _allocation(r, pos + o_alloc + rel_alloc, allocs) if o_alloc else None
    extra = _extra_info(r, pos + o_extra + rel_extra) if o_extra else None
    scalar_type, dynamism = _SCALAR_TYPES.get(st), _DYNAMISM.get(dyn)
    if scalar_type is None or dynamism is None:
        raise Fallback
    return _row(Tensor, (scalar_type, storage_offset, sizes, dim_order, bool(grad), dbi, alloc, layout, dynamism,
                         extra))


def _sizes(r: _Reader, start: int) -> tuple[int, ...]:
    """A Tensor's ``sizes`` vector at ``start`` (one struct per length, cached); negative sizes fall back."""
    data, n = r.data, r.n
    if start + 4 > n:
        raise Fallback
    k = _U32(data, start)[0]
    if start + 4 + 4 * k > n:
        raise Fallback
    unpack_sizes = r.int_vectors.get(k)
    if unpack_sizes is None:
        unpack_sizes = r.int_vectors[k] = struct.Struct(f"<{k}i").unpack_from
    sizes: tuple[int, ...] = unpack_sizes(data, start + 4)
    if sizes and min(sizes) < 0:
        raise Fallback
    return sizes


def _dim_order(r: _Reader, start: int, sizes: tuple[int, ...]) -> tuple[int, ...]:
    """A Tensor's ``dim_order`` vector at ``start``; it must be a permutation of ``len(sizes)`` dims."""
    data, n = r.data, r.n
    if start + 4 > n:
        raise Fallback
    k = _U32(data, start)[0]
    if start + 4 + k > n:
        raise Fallback
    dim_order = tuple(data[start + 4: start + 4 + k])
    if dim_order and (len(dim_order) != len(sizes) or dim_order not in r.permutations):
        if sorted(dim_order) != list(range(len(sizes))):
            raise Fallback
        r.permutations.add(dim_order)
    return dim_order


def _allocation(r: _Reader, a: int, allocs: dict[int, Row]) -> AllocationInfo:
    """A Tensor's ``allocation_info`` table at ``a``: memory id and the 64-bit offset from its two halves."""
    data, n = r.data, r.n
    if a + 4 > n:
        raise Fallback
    _, asize, aunpack, aorder, azeros = allocs.get(a - _I32(data, a)[0]) or r.fill_row(a, _ALLOC_CODES, allocs)
    if a + asize > n:
        raise Fallback
    mem, low, high = aorder(aunpack(data, a) + azeros)
    return _row(AllocationInfo, (mem, low | high << 32))


def _extra_info(r: _Reader, x: int) -> ExtraTensorInfo:
    """A Tensor's ``extra_tensor_info`` table at ``x`` (rare: external or mutable tensors)."""
    data = r.data
    xe = r.table(x)
    return ExtraTensorInfo(
        mutable_data_segments_idx=_small(data, x, xe, 0, _U64, 8),
        fully_qualified_name=r.string(x, xe, 1),
        location=_member(_LOCATIONS, _small(data, x, xe, 2, _I8, 1)),
        device_type=_member(_DEVICES, _small(data, x, xe, 3, _I8, 1)),
        device_index=_small(data, x, xe, 4, _I8, 1),
    )


def _small(data: memoryview, pos: int, entry: tuple[tuple[int, ...], int], slot: int, unpack: Unpack, size: int) -> int:
    w = _field(pos, entry, slot, size)
    return 0 if w is None else unpack(data, w)[0]


def _member(members: dict[int, E], raw: int) -> E:
    try:
        return members[raw]
    except KeyError:
        raise Fallback from None


def decode_operators(data: memoryview, length: int, vector_start: int, count: int) -> tuple[Operator, ...]:
    """Every Operator (name, overload) of an ``operators`` vector (offsets already bounds-checked)."""
    r = _Reader(data, length)
    out: list[Operator] = []
    for i, off in enumerate(_offsets(data, vector_start, count)):
        pos = vector_start + 4 * i + off
        entry = r.table(pos)
        name, overload = r.string(pos, entry, 0) or "", r.string(pos, entry, 1) or ""
        out.append(_record(Operator, {"name": name, "overload": overload}))
    return tuple(out)


_INSTRUCTION_FIELDS = (1, 4)  # instr_args_type, instr_args
_CALL_FIELDS = (4, 4)  # op/delegate index or move_from/cond, then args vector or move_to/destination
_FREE_FIELDS = (4,)


def decode_instructions(data: memoryview, length: int, vector_start: int, count: int,
                        num_values: int) -> tuple[Instruction, ...]:
    """Every instruction of a chain's ``instructions`` vector (offsets already bounds-checked)."""
    r = _Reader(data, length)
    out: list[Instruction] = []
    append, layout = out.append, r.layout
    heads, calls = r.cache(_INSTRUCTION_FIELDS), r.cache(_CALL_FIELDS)
    for i, off in enumerate(_offsets(data, vector_start, count)):
        pos = vector_start + 4 * i + off
        if pos + 4 > length:
            raise Fallback
        (o_tag, o_body), tsize = heads.get(pos - _I32(data, pos)[0]) or r.fill(pos, _INSTRUCTION_FIELDS, heads)
        if pos + tsize > length:
            raise Fallback
        tag = _U8(data, pos + o_tag)[0] if o_tag else 0
        if not o_body or not 1 <= tag <= 5:
            raise Fallback
        body = pos + o_body + _U32(data, pos + o_body)[0]
        if tag == 5:
            (o_a,) = layout(body, _FREE_FIELDS)
            append(_record(FreeCall, {"value_index": _I32(data, body + o_a)[0] if o_a else 0}))
            continue
        if body + 4 > length:
            raise Fallback
        (o_a, o_b), tsize = calls.get(body - _I32(data, body)[0]) or r.fill(body, _CALL_FIELDS, calls)
        if body + tsize > length:
            raise Fallback
        a = _I32(data, body + o_a)[0] if o_a else 0
        if tag <= 2:
            args = r.vector_at(body + o_b, "i") if o_b else ()
            if args and (min(args) < 0 or max(args) >= num_values):
                raise Fallback
            if tag == 1:
                append(_record(KernelCall, {"op_index": a, "args": args}))
            else:
                append(_record(DelegateCall, {"delegate_index": a, "args": args}))
        else:
            b = _I32(data, body + o_b)[0] if o_b else 0
            if tag == 3:
                append(_record(MoveCall, {"move_from": a, "move_to": b}))
            else:
                append(_record(JumpFalseCall, {"cond_value_index": a, "destination_instruction": b}))
    return tuple(out)
