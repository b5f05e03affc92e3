"""Write FlatBuffers tables in the order ExecuTorch's serializer writes them, so the bytes match.

ExecuTorch serializes a ``Program`` through the generated object API
(``ProgramT.Pack``): every table packs its children first, in schema field
order, then starts the table and adds its fields in the same order (scalars
equal to their default are left out). :func:`pack` does the same for a
:class:`Table` tree, with the ``flatbuffers`` package's own ``Builder``, so the
output is byte-identical to ExecuTorch's for the same tree, without importing
``executorch.exir`` (seconds of start-up).

Field kinds: scalars ``u8 i8 bool u32 i32 u64 i64``; offsets ``str``,
``table``, ``tables`` (a vector of tables) and the scalar vectors ``[u8]``,
``[i32]``, ``[i64]``, ``[u64]``. A union is two fields: its ``u8`` type, then
its ``table``.

>>> data = finish(Table(1, [(0, "str", "hi")]), b"TEST")
>>> data[4:8], len(data)
(b'TEST', 32)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import flatbuffers

_SCALAR_SLOTS = {"u8": "PrependUint8Slot", "i8": "PrependInt8Slot", "bool": "PrependBoolSlot",
                 "u32": "PrependUint32Slot", "i32": "PrependInt32Slot", "u64": "PrependUint64Slot",
                 "i64": "PrependInt64Slot"}
_VECTORS = {"[u8]": (1, "PrependUint8"), "[i32]": (4, "PrependInt32"), "[i64]": (8, "PrependInt64"),
            "[u64]": (8, "PrependUint64")}


@dataclass
class Table:
    """A table with ``slots`` fields; ``fields`` are ``(slot, kind, value)`` in schema order (None: absent)."""

    slots: int
    fields: list[tuple[int, str, Any]] = field(default_factory=list)


def pack(builder: flatbuffers.Builder, table: Table) -> int:
    """Pack ``table`` (children first, as ExecuTorch's generated ``Pack`` does); returns its offset."""
    children = {}
    for slot, kind, value in table.fields:
        if value is None or kind in _SCALAR_SLOTS:
            continue
        children[slot] = _child(builder, kind, value)
    builder.StartObject(table.slots)
    for slot, kind, value in table.fields:
        if value is None:
            continue
        if kind in _SCALAR_SLOTS:
            getattr(builder, _SCALAR_SLOTS[kind])(slot, value, 0)
        else:
            builder.PrependUOffsetTRelativeSlot(slot, children[slot], 0)
    return int(builder.EndObject())


def _child(builder: flatbuffers.Builder, kind: str, value: Any) -> int:
    if kind == "str":
        return int(builder.CreateString(value))
    if kind == "table":
        return pack(builder, value)
    if kind == "tables":
        offsets = [pack(builder, t) for t in value]
        builder.StartVector(4, len(offsets), 4)
        for off in reversed(offsets):
            builder.PrependUOffsetTRelative(off)
        return int(builder.EndVector())
    size, prepend = _VECTORS[kind]
    builder.StartVector(size, len(value), size)
    for item in reversed(value):
        getattr(builder, prepend)(item)
    return int(builder.EndVector())


def finish(root: Table, file_identifier: bytes) -> bytes:
    """The finished buffer of ``root``: root offset, ``file_identifier``, then the tables."""
    builder = flatbuffers.Builder()
    builder.Finish(pack(builder, root), file_identifier=file_identifier)
    return bytes(builder.Output())
