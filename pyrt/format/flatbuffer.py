"""A bounds-checked reader for FlatBuffers tables.

Generated FlatBuffers accessors follow offsets without checking them; this
reader sends every offset through :class:`pyrt.format.bounds.Span`, so a hostile
file raises :class:`~pyrt.errors.PteFormatError` naming the field instead of
reading out of range. Offsets to sub-objects (uoffset) are unsigned and point
forward, so traversal always terminates.

Field slots are the schema's declaration order; a union takes two slots
(its type byte, then its value).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import TypeVar

from pyrt.format.bounds import SCALARS, Span

T = TypeVar("T")


class Table:
    """One FlatBuffers table at absolute position ``pos`` in ``span``."""

    __slots__ = ("span", "pos", "name", "_vt", "_vtsize", "_tsize")

    def __init__(self, span: Span, pos: int, name: str) -> None:
        self.span, self.pos, self.name = span, pos, name
        vt = pos - span.i32(f"{name} vtable offset", pos)
        vtsize = span.u16(f"{name} vtable size", vt)
        if vtsize < 4 or vtsize % 2:
            raise span.error(f"{span.source}: {name} vtable at offset {vt} has invalid size {vtsize}")
        span.check(f"{name} vtable", vt, vtsize)
        tsize = span.u16(f"{name} table size", vt + 2)
        span.check(f"{name} table", pos, tsize)
        self._vt, self._vtsize, self._tsize = vt, vtsize, tsize

    @classmethod
    def root(cls, span: Span, name: str) -> Table:
        return cls(span, span.u32(f"{name} root offset", 0), name)

    def _where(self, slot: int, field: str, size: int) -> int | None:
        entry = 4 + 2 * slot
        if entry >= self._vtsize:
            return None
        off = self.span.u16(f"{self.name}.{field} vtable entry", self._vt + entry)
        if off == 0:
            return None
        if off + size > self._tsize:
            raise self.span.error(
                f"{self.span.source}: {self.name}.{field} at table offset {off} size {size} "
                f"overruns its table (size {self._tsize}) at offset {self.pos}"
            )
        return self.pos + off

    def scalar(self, slot: int, field: str, kind: str, default: int | float | bool = 0) -> int | float:
        fmt = SCALARS[kind]
        where = self._where(slot, field, fmt.size)
        if where is None:
            return default
        return self.span.unpack(fmt, f"{self.name}.{field}", where)

    def _target(self, slot: int, field: str) -> int | None:
        where = self._where(slot, field, 4)
        if where is None:
            return None
        return where + self.span.u32(f"{self.name}.{field} offset", where)

    def table(self, slot: int, field: str, name: str | None = None) -> Table | None:
        target = self._target(slot, field)
        return None if target is None else Table(self.span, target, name or f"{self.name}.{field}")

    def string(self, slot: int, field: str) -> str | None:
        target = self._target(slot, field)
        return None if target is None else read_string(self.span, target, f"{self.name}.{field}")

    def vector(self, slot: int, field: str, elem: str) -> Vector | None:
        target = self._target(slot, field)
        return None if target is None else Vector(self.span, target, f"{self.name}.{field}", elem)

    def union(self, slot: int, field: str) -> tuple[int, Table | None]:
        """``(type tag, value table)`` of the union whose type byte is at ``slot``."""
        tag = int(self.scalar(slot, f"{field}_type", "u8"))
        return tag, self.table(slot + 1, field)


def read_string(span: Span, pos: int, field: str) -> str:
    n = span.u32(f"{field} length", pos)
    raw = span.bytes_at(field, pos + 4, n)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise span.error(f"{span.source}: {field} at offset {pos} is not UTF-8: {exc}") from None


class Vector:
    """A FlatBuffers vector; its whole extent is bounds-checked on construction."""

    __slots__ = ("span", "pos", "name", "elem", "n", "start", "_esize")

    def __init__(self, span: Span, pos: int, name: str, elem: str) -> None:
        self.span, self.pos, self.name, self.elem = span, pos, name, elem
        self.n = span.u32(f"{name} length", pos)
        self._esize = 4 if elem in ("table", "string") else SCALARS[elem].size
        self.start = pos + 4
        span.check(f"{name} ({self.n} x {self._esize} bytes)", self.start, self.n * self._esize)

    def __len__(self) -> int:
        return self.n

    def scalars(self) -> tuple:
        """All elements of a scalar vector, decoded in one call."""
        fmt = SCALARS[self.elem].format[1:]
        values = struct.unpack_from(f"<{self.n}{fmt}", self.span.data, self.start)
        return tuple(bool(v) for v in values) if self.elem == "bool" else values

    def raw(self) -> memoryview:
        """Zero-copy view of a ubyte vector's contents."""
        return self.span.view(self.name, self.start, self.n * self._esize)

    def _elem_pos(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise self.span.error(f"{self.span.source}: {self.name} index {i} is out of range (length {self.n})")
        p = self.start + 4 * i
        return p + self.span.u32(f"{self.name}[{i}] offset", p)

    def table(self, i: int, name: str | None = None) -> Table:
        return Table(self.span, self._elem_pos(i), name or f"{self.name}[{i}]")

    def string(self, i: int) -> str:
        return read_string(self.span, self._elem_pos(i), f"{self.name}[{i}]")

    def tables(self, decode: Callable[[Table, int], T]) -> Iterator[T]:
        for i in range(self.n):
            yield decode(self.table(i), i)
