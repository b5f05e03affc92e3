"""Zero-copy, validated reader for ExecuTorch ``.ptd`` data files (FlatTensor).

A ``.ptd`` holds the weights a program keeps outside its ``.pte`` (ExecuTorch's
``external_constants=True``), keyed by name. Layout (all little-endian; the schema
is ExecuTorch's ``flat_tensor.fbs``):

- bytes 0..4: flatbuffer root offset (u32); 4..8: file identifier ``FT01``;
- bytes 8..48: header: magic ``FH01``, u32 length (>= 40), then u64 ``flatbuffer_offset``,
  ``flatbuffer_size``, ``segment_base_offset``, ``segment_data_size``;
- the ``FlatTensor`` flatbuffer ends at ``flatbuffer_offset + flatbuffer_size``;
- segment data starts at ``segment_base_offset``; ``DataSegment.offset`` is relative to it.

``FlatTensor{version, segments[DataSegment{offset, size}], named_data[NamedData{key,
segment_index, tensor_layout{scalar_type, sizes[i32], dim_order[u8]}}]}``.

The file is mapped once, read-only; the header, every segment and every entry are
checked when it opens (one bounds check, :class:`pyrt.format.bounds.Span`), and
:meth:`PtdFile.view` hands out memoryviews of the mapping. Any malformed byte is a
:class:`~pyrt.errors.PteFormatError` naming the field, offset and sizes.

>>> with PtdFile.open("model.ptd") as ptd:                      # doctest: +SKIP
...     ptd.keys()
...     ptd.view("linear.weight").nbytes
"""

from __future__ import annotations

import math
import mmap
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pyrt.errors import PteFormatError
from pyrt.format.bounds import Span
from pyrt.format.decode import check_layout
from pyrt.format.dtypes import ScalarType
from pyrt.format.flatbuffer import Table
from pyrt.format.mapped import map_file, unmap

FILE_IDENTIFIER = b"FT01"  # bytes 4..8
HEADER_OFFSET = 8  # the header follows root offset (4) + identifier (4)
HEADER_MAGIC = b"FH01"
# magic (4) + length (4) + flatbuffer_offset (8) + flatbuffer_size (8) + segment_base_offset (8)
# + segment_data_size (8) = 40 bytes; a longer header keeps these fields where they are.
HEADER_MIN_LENGTH = 40
MAX_VERSION = 0  # the newest FlatTensor schema version ExecuTorch 1.5 writes and reads

DataSource = str | os.PathLike | bytes | bytearray | memoryview


@dataclass(frozen=True)
class TensorLayout:
    """What a ``.ptd`` says a tensor entry is: dtype, sizes and dim order."""

    scalar_type: ScalarType
    sizes: tuple[int, ...]
    dim_order: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.sizes) * self.scalar_type.itemsize


@dataclass(frozen=True)
class DataEntry:
    """One named entry: its segment, absolute file ``offset`` and ``size``, and its layout (if any)."""

    key: str
    segment_index: int
    offset: int
    size: int
    layout: TensorLayout | None


@dataclass(frozen=True)
class PtdHeader:
    flatbuffer_offset: int
    flatbuffer_size: int
    segment_base_offset: int
    segment_data_size: int


class PtdFile:
    """An open ``.pte`` data file: every entry validated at open, data handed out zero-copy."""

    def __init__(self, data: memoryview, source: str, *, _mmap: mmap.mmap | None = None) -> None:
        self._mmap = _mmap
        self._data = data
        self.source = source
        self.file = Span(data, source)
        self.size = data.nbytes
        self.header = _parse_header(self.file)
        fb = Span(data[: self.header.flatbuffer_offset + self.header.flatbuffer_size], source)
        root = Table.root(fb, "FlatTensor")
        self.version = int(root.scalar(0, "version", "u32"))
        if self.version > MAX_VERSION:
            raise PteFormatError(f"{source}: FlatTensor version {self.version} is newer than this reader "
                                 f"supports (at most {MAX_VERSION})")
        self.segments = _segments(root, self.header, source)
        self.entries = _entries(root, self.segments, source)

    @classmethod
    def open(cls, source: DataSource) -> PtdFile:
        """Open a path (mapped read-only) or wrap a bytes-like object (no copy)."""
        if isinstance(source, (bytes, bytearray, memoryview)):
            return cls(memoryview(source).cast("B"), "<bytes>")
        if not isinstance(source, (str, os.PathLike)):
            raise PteFormatError(f"cannot open {source!r} as a .ptd: expected a path or a bytes-like object")
        path = str(os.fspath(source))
        mm, view = map_file(path, "data file")
        try:
            return cls(view, path, _mmap=mm)
        except BaseException:
            view.release()
            unmap(mm)
            raise

    def keys(self) -> list[str]:
        return list(self.entries)

    def entry(self, key: str) -> DataEntry | None:
        return self.entries.get(key)

    def view(self, key: str) -> memoryview:
        """Zero-copy view of entry ``key``'s bytes (a missing key is a PteFormatError)."""
        entry = self.entries.get(key)
        if entry is None:
            raise PteFormatError(f"{self.source}: no named data {key!r} ({len(self.entries)} keys)")
        return self.file.view(f"named data {key!r}", entry.offset, entry.size)

    def close(self) -> None:
        """Release the mapping. Views handed out earlier must not be used afterwards."""
        self.file.data = memoryview(b"")
        self.file.length = 0
        self._data.release()
        if self._mmap is not None:
            unmap(self._mmap)
            self._mmap = None

    def __enter__(self) -> PtdFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PtdFile({self.source!r}, {len(self.entries)} entries, {self.size} bytes)"


def _parse_header(span: Span) -> PtdHeader:
    if span.length < HEADER_OFFSET + HEADER_MIN_LENGTH:
        raise PteFormatError(f"{span.source}: {span.length} bytes is too short for a .ptd header "
                             f"(needs {HEADER_OFFSET + HEADER_MIN_LENGTH})")
    ident = span.bytes_at("file identifier", 4, 4)
    if ident != FILE_IDENTIFIER:
        raise PteFormatError(f"{span.source}: file identifier {ident!r} is not {FILE_IDENTIFIER!r} (not a .ptd)")
    magic = span.bytes_at("header magic", HEADER_OFFSET, 4)
    if magic != HEADER_MAGIC:
        raise PteFormatError(f"{span.source}: header magic {magic!r} at offset {HEADER_OFFSET} is not {HEADER_MAGIC!r}")
    length = span.u32("header length", HEADER_OFFSET + 4)
    if length < HEADER_MIN_LENGTH:
        raise PteFormatError(f"{span.source}: header length {length} < {HEADER_MIN_LENGTH}")
    span.check("header", HEADER_OFFSET, length)
    header = PtdHeader(*(span.u64(name, HEADER_OFFSET + 8 + 8 * i) for i, name in enumerate(
        ("flatbuffer_offset", "flatbuffer_size", "segment_base_offset", "segment_data_size"))))
    fb_end = header.flatbuffer_offset + header.flatbuffer_size
    if not HEADER_OFFSET + length <= fb_end <= span.length:
        raise PteFormatError(f"{span.source}: flatbuffer_offset {header.flatbuffer_offset} + flatbuffer_size "
                             f"{header.flatbuffer_size} = {fb_end} is outside [{HEADER_OFFSET + length}, "
                             f"file length {span.length}]")
    base, size = header.segment_base_offset, header.segment_data_size
    if base < fb_end and (base != 0 or size != 0):
        raise PteFormatError(f"{span.source}: segment_base_offset {base} is inside the flatbuffer (ends at {fb_end})")
    if base + size > span.length:
        raise PteFormatError(f"{span.source}: segment data [{base}, {base + size}) overruns the file "
                             f"(length {span.length}): truncated?")
    return header


def _segments(root: Table, header: PtdHeader, source: str) -> tuple[tuple[int, int], ...]:
    """(absolute offset, size) of every segment, each inside the segment data."""
    vec = root.vector(1, "segments", "table")
    if vec is None:
        raise PteFormatError(f"{source}: FlatTensor.segments is missing")
    out = []
    for i in range(len(vec)):
        t = vec.table(i, f"FlatTensor.segments[{i}]")
        offset, size = int(t.scalar(0, "offset", "u64")), int(t.scalar(1, "size", "u64"))
        if offset + size > header.segment_data_size:
            raise PteFormatError(f"{source}: segment {i} at offset {offset} size {size} overruns the segment data "
                                 f"(size {header.segment_data_size})")
        out.append((header.segment_base_offset + offset, size))
    return tuple(out)


def _entries(root: Table, segments: Sequence[tuple[int, int]], source: str) -> dict[str, DataEntry]:
    vec = root.vector(2, "named_data", "table")
    if vec is None:
        raise PteFormatError(f"{source}: FlatTensor.named_data is missing")
    out: dict[str, DataEntry] = {}
    first: dict[str, int] = {}
    for i in range(len(vec)):
        t = vec.table(i, f"FlatTensor.named_data[{i}]")
        key = t.string(0, "key")
        if key is None:
            raise PteFormatError(f"{source}: named_data[{i}] has no key")
        if key in first:
            raise PteFormatError(f"{source}: named data key {key!r} appears twice (named_data[{first[key]}] and "
                                 f"named_data[{i}])")
        first[key] = i
        index = int(t.scalar(1, "segment_index", "u32"))
        if index >= len(segments):
            raise PteFormatError(f"{source}: named data {key!r} segment_index {index} out of range "
                                 f"({len(segments)} segments)")
        layout_table = t.table(2, "tensor_layout")
        layout = None if layout_table is None else _layout(layout_table, key, source)
        offset, size = segments[index]
        if layout is not None and layout.nbytes > size:
            raise PteFormatError(f"{source}: named data {key!r} is {_describe(layout)} ({layout.nbytes} bytes) but "
                                 f"its segment {index} holds {size} bytes")
        out[key] = DataEntry(key, index, offset, size, layout)
    return out


def _layout(t: Table, key: str, source: str) -> TensorLayout:
    raw = int(t.scalar(0, "scalar_type", "i8"))
    try:
        scalar_type = ScalarType(raw)
    except ValueError:
        raise PteFormatError(f"{source}: named data {key!r} has unknown scalar_type {raw}") from None
    sizes_v = t.vector(1, "sizes", "i32")
    sizes = sizes_v.scalars() if sizes_v else ()
    order_v = t.vector(2, "dim_order", "u8")
    dim_order = order_v.scalars() if order_v else ()
    check_layout(sizes, dim_order, f"{source}: named data {key!r}", order_optional=False)
    return TensorLayout(scalar_type, sizes, dim_order)


def _describe(layout: TensorLayout) -> str:
    return f"{layout.scalar_type.name}{list(layout.sizes)}"


class ExternalData:
    """Named data from one or more ``.ptd`` files, looked up by key (a key in two files is an error).

    >>> data = ExternalData.open(["a.ptd", "b.ptd"])                # doctest: +SKIP
    >>> data.find("linear.weight")                                   # doctest: +SKIP
    """

    def __init__(self, files: Sequence[PtdFile], *, owned: bool = False) -> None:
        self.files = list(files)
        self._owned = owned
        self._index: dict[str, PtdFile] = {}
        for f in self.files:
            for key in f.entries:
                other = self._index.get(key)
                if other is not None:
                    raise PteFormatError(f"named data key {key!r} is in both {other.source} and {f.source}")
                self._index[key] = f

    @classmethod
    def open(cls, sources: DataSource | Iterable[DataSource]) -> ExternalData:
        """Open every data file (a path, bytes, or a list of them); closed again on any error."""
        items = [sources] if isinstance(sources, (str, os.PathLike, bytes, bytearray, memoryview)) else list(sources)
        files: list[PtdFile] = []
        try:
            for item in items:
                files.append(PtdFile.open(item))
            return cls(files, owned=True)
        except BaseException:
            for f in files:
                f.close()
            raise

    @property
    def sources(self) -> list[str]:
        return [f.source for f in self.files]

    def find(self, key: str) -> tuple[PtdFile, DataEntry] | None:
        f = self._index.get(key)
        return None if f is None else (f, f.entries[key])

    def close(self) -> None:
        """Close the files this object opened (files handed to the constructor stay open)."""
        if self._owned:
            for f in self.files:
                f.close()

    def __enter__(self) -> ExternalData:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["PtdFile", "ExternalData", "DataEntry", "TensorLayout", "PtdHeader"]
