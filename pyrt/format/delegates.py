"""Delegate records of ``program.fbs``: a method's backend delegates and their compile specs.

:class:`BackendDelegate` keeps its compile specs as the undecoded flatbuffer vector
until first asked (the blob path never needs them); :func:`decode_delegate` is the
general reader's decoder for one ``BackendDelegate`` table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyrt.errors import PteFormatError
from pyrt.format.decode import enum_member, first
from pyrt.format.flatbuffer import Table
from pyrt.format.schema import DataLocation


@dataclass(frozen=True)
class CompileSpec:
    key: str
    value: bytes

    def text(self) -> str:
        """The value as UTF-8 text, or ``hex:...`` when it is not printable text."""
        try:
            decoded = self.value.decode("utf-8")
        except UnicodeDecodeError:
            decoded = None
        if decoded is not None and decoded.isprintable():
            return decoded
        return "hex:" + self.value.hex()


class BackendDelegate:
    """A delegate entry; ``compile_specs`` decode on first access (the blob path never needs them)."""

    __slots__ = ("id", "location", "index", "_specs", "_decoded")

    def __init__(self, id: str, location: DataLocation, index: int, compile_specs: Any = ()) -> None:
        self.id, self.location, self.index = id, location, index
        self._specs = compile_specs
        self._decoded: tuple[CompileSpec, ...] | None = compile_specs if isinstance(compile_specs, tuple) else None

    @property
    def compile_specs(self) -> tuple[CompileSpec, ...]:
        if self._decoded is None:
            self._decoded = tuple(
                CompileSpec(s.string(0, "key") or "", bytes(v.raw()) if (v := s.vector(1, "value", "u8")) else b"")
                for s in self._specs.tables(first)
            )
        return self._decoded

    def spec(self, key: str) -> bytes | None:
        """The value of compile spec ``key``; a duplicated key is a format error."""
        found = [c.value for c in self.compile_specs if c.key == key]
        if len(found) > 1:
            raise PteFormatError(f"delegate {self.id!r} has compile spec {key!r} {len(found)} times")
        return found[0] if found else None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BackendDelegate):
            return NotImplemented
        return (self.id, self.location, self.index, self.compile_specs) == (
            other.id, other.location, other.index, other.compile_specs)

    def __hash__(self) -> int:
        return hash((self.id, self.location, self.index))

    def __repr__(self) -> str:
        return (f"BackendDelegate(id={self.id!r}, location={self.location!r}, index={self.index}, "
                f"compile_specs={self.compile_specs!r})")



def decode_delegate(t: Table, i: int) -> BackendDelegate:
    processed = t.table(1, "processed")
    if processed is None:
        raise PteFormatError(f"{t.span.source}: delegates[{i}] has no processed data reference")
    return BackendDelegate(
        id=t.string(0, "id") or "",
        location=enum_member(DataLocation, processed.scalar(0, "location", "i8"), "location", processed),
        index=int(processed.scalar(1, "index", "u32")),
        compile_specs=t.vector(2, "compile_specs", "table") or (),
    )
