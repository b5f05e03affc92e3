"""The ``.pte`` file's framing: identifier and extended header.

What :class:`pyrt.pte_reader.PteFile` checks before it parses the Program flatbuffer:
the ``ET12`` identifier and the ``eh00`` extended header's sizes and offsets against the
file length (opening the file safely is :func:`pyrt.format.mapped.map_file`'s), and that
bytes handed in are one flat buffer. Layout facts: ``docs/formats.md`` section 1.
"""

from __future__ import annotations

from pyrt.errors import PteFormatError
from pyrt.format.bounds import Span
from pyrt.format.schema import ExtendedHeader

FILE_IDENTIFIER = b"ET12"  # bytes 4..8
EXT_HEADER_OFFSET = 8  # the extended header follows root offset (4) + identifier (4)
EXT_HEADER_MAGIC = b"eh00"
# eh00 magic (4) + header length (4) + program_size (8) + segment_base_offset (8) = 24 bytes;
# segment_data_size (8) follows only when the header length says it is there (>= 32).
EXT_HEADER_MIN_LENGTH = 24
EXT_HEADER_WITH_DATA_SIZE = 32
FLATBUFFER_MAX = 2**31  # FlatBuffers cannot address more than 2 GiB


def byte_view(source: bytes | bytearray | memoryview) -> memoryview:
    """A flat unsigned-byte view of ``source`` (no copy); a non-contiguous view is a PteFormatError."""
    view = memoryview(source)
    if not view.c_contiguous:
        raise PteFormatError(f"<bytes>: a non-contiguous memoryview (shape {view.shape}, strides {view.strides}) "
                             f"is not a .pte image; pass bytes(view) or a contiguous buffer")
    try:
        return view.cast("B")
    except (TypeError, ValueError) as exc:
        raise PteFormatError(f"<bytes>: cannot read the buffer as bytes: {exc}") from None


def parse_headers(span: Span) -> tuple[str, ExtendedHeader | None]:
    ident = span.bytes_at("file identifier", 4, 4)
    if ident != FILE_IDENTIFIER:
        raise PteFormatError(f"{span.source}: file identifier {ident!r} is not {FILE_IDENTIFIER!r}")
    if span.length < EXT_HEADER_OFFSET + 4 or span.bytes_at("header magic", 8, 4) != EXT_HEADER_MAGIC:
        if span.length > FLATBUFFER_MAX:
            raise PteFormatError(f"{span.source}: {span.length} bytes without an extended header exceeds 2 GiB")
        return ident.decode("ascii"), None
    length = span.u32("extended header length", 12)
    if length < EXT_HEADER_MIN_LENGTH:
        raise PteFormatError(f"{span.source}: extended header length {length} < {EXT_HEADER_MIN_LENGTH}")
    span.check("extended header", EXT_HEADER_OFFSET, length)
    program_size = span.u64("program_size", 16)
    base = span.u64("segment_base_offset", 24)
    data_size = span.u64("segment_data_size", 32) if length >= EXT_HEADER_WITH_DATA_SIZE else None
    if not EXT_HEADER_OFFSET + length <= program_size <= span.length:
        raise PteFormatError(
            f"{span.source}: program_size {program_size} is outside [{EXT_HEADER_OFFSET + length}, "
            f"file length {span.length}]"
        )
    if program_size > FLATBUFFER_MAX:
        raise PteFormatError(f"{span.source}: program_size {program_size} exceeds the 2 GiB flatbuffer limit")
    if base < program_size and base != 0:
        raise PteFormatError(f"{span.source}: segment_base_offset {base} is inside the program (size {program_size})")
    if base > span.length:
        raise PteFormatError(f"{span.source}: segment_base_offset {base} is past the end (length {span.length})")
    if data_size is not None and base + data_size > span.length:
        raise PteFormatError(
            f"{span.source}: segment data [{base}, {base + data_size}) overruns the file (length {span.length})"
        )
    return ident.decode("ascii"), ExtendedHeader(program_size, base, data_size)

