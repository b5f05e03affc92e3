"""The one bounds check every offset in pyrt goes through.

memoryview and numpy slicing truncate silently, so nothing in pyrt slices an
untrusted offset directly: it asks a :class:`Span`, which raises a typed error
naming the field, the offset, the size and the length of what was read.

>>> s = Span(memoryview(b"abcdef"), "demo.pte")
>>> bytes(s.view("tail", 4, 2))
b'ef'
>>> s.view("tail", 4, 3)
Traceback (most recent call last):
...
pyrt.errors.PteFormatError: demo.pte: tail at offset 4 size 3 overruns the data (length 6)
"""

from __future__ import annotations

import struct
from typing import Any

from pyrt.errors import PteFormatError, PyrtError

_U8 = struct.Struct("<B")
_I8 = struct.Struct("<b")
_U16 = struct.Struct("<H")
_I16 = struct.Struct("<h")
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")


class Span:
    """A bounds-checked window over a read-only byte buffer."""

    __slots__ = ("data", "source", "error", "length")

    def __init__(self, data: memoryview, source: str, *, error: type[PyrtError] = PteFormatError) -> None:
        self.data = data
        self.source = source
        self.error = error
        self.length = data.nbytes

    def check(self, field: str, offset: int, size: int) -> int:
        """Return ``offset`` if ``[offset, offset + size)`` lies inside the data, else raise."""
        if offset < 0 or size < 0 or offset + size > self.length:
            raise self.error(
                f"{self.source}: {field} at offset {offset} size {size} overruns the data (length {self.length})"
            )
        return offset

    def view(self, field: str, offset: int, size: int) -> memoryview:
        """Zero-copy view of ``size`` bytes at ``offset``."""
        self.check(field, offset, size)
        return self.data[offset : offset + size]

    def bytes_at(self, field: str, offset: int, size: int) -> bytes:
        """A copy of ``size`` bytes (for small headers and strings only)."""
        return bytes(self.view(field, offset, size))

    def unpack(self, fmt: struct.Struct, field: str, offset: int) -> Any:
        if offset < 0 or offset + fmt.size > self.length:  # hot path: fail through check()
            self.check(field, offset, fmt.size)
        return fmt.unpack_from(self.data, offset)[0]

    def u8(self, field: str, offset: int) -> int:
        return self.unpack(_U8, field, offset)

    def i8(self, field: str, offset: int) -> int:
        return self.unpack(_I8, field, offset)

    def u16(self, field: str, offset: int) -> int:
        return self.unpack(_U16, field, offset)

    def i16(self, field: str, offset: int) -> int:
        return self.unpack(_I16, field, offset)

    def u32(self, field: str, offset: int) -> int:
        return self.unpack(_U32, field, offset)

    def i32(self, field: str, offset: int) -> int:
        return self.unpack(_I32, field, offset)

    def u64(self, field: str, offset: int) -> int:
        return self.unpack(_U64, field, offset)

    def i64(self, field: str, offset: int) -> int:
        return self.unpack(_I64, field, offset)

    def f64(self, field: str, offset: int) -> float:
        return self.unpack(_F64, field, offset)


SCALARS: dict[str, struct.Struct] = {
    "u8": _U8, "i8": _I8, "u16": _U16, "i16": _I16, "u32": _U32,
    "i32": _I32, "u64": _U64, "i64": _I64, "f64": _F64, "bool": _U8,
}
