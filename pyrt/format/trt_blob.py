"""The TensorRT delegate blob (backend id ``TensorRTBackend``), TR01 / TR02.

Layout, byte-compatible with Torch-TensorRT's writer and its C++ reader::

    0   4s  magic            b"TR01" (b"TR02" when aliased I/O is present)
    4   u32 metadata_offset  32
    8   u32 metadata_size    length of the JSON metadata
    12  u32 engine_offset    align16(32 + metadata_size)
    16  u64 engine_size      bytes of serialized engine
    24  8s  reserved         written as 01 00 00 00 00 00 00 00, never read
    32  ... compact JSON metadata, zero padding to 16, then the engine

Parsing is zero-copy: the engine comes back as a memoryview of the input.

>>> blob = encode_blob(b"ENGINE", [IOBinding("x", "float32", (2, 3), True),
...                               IOBinding("y", "float32", (2, 3), False)])
>>> parsed = parse_blob(blob)
>>> parsed.magic, bytes(parsed.engine), [b.name for b in parsed.outputs]
('TR01', b'ENGINE', ['y'])
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pyrt.checks import is_int
from pyrt.errors import BlobFormatError
from pyrt.format.bounds import Span

HEADER = struct.Struct("<4sIIIQ8s")  # magic, meta off, meta size, engine off, engine size, reserved
HEADER_SIZE = HEADER.size  # 32
ALIGN = 16
MAGIC_PLAIN = b"TR01"
MAGIC_ALIASED = b"TR02"
RESERVED = b"\x01" + b"\x00" * 7
BACKEND_ID = "TensorRTBackend"
PLATFORMS = ("linux_x86_64", "linux_aarch64", "windows_x86_64", "windows_arm64", "unknown")
ALIAS_KINDS = ("kv_cache_update", "user")
# Keys in the order the C++ reader scans them; the writer (encode_metadata) emits exactly these, in this order.
METADATA_KEYS = (
    "io_bindings",
    "aliased_io",
    "hardware_compatible",
    "device_id",
    "serialized_metadata",
    "target_platform",
)


@dataclass(frozen=True)
class IOBinding:
    """One engine I/O tensor: ``shape`` uses -1 for a dynamic dimension."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    is_input: bool

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "is_input": self.is_input}


@dataclass(frozen=True)
class AliasedIO:
    """An engine output that writes into the buffer of one of its inputs."""

    output: str
    input: str
    kind: str

    def to_json(self) -> dict[str, Any]:
        return {"output": self.output, "input": self.input, "kind": self.kind}


@dataclass(frozen=True)
class TensorRTBlob:
    """A parsed blob; ``engine`` is a zero-copy view of the caller's buffer."""

    magic: str
    io_bindings: tuple[IOBinding, ...]
    aliased_io: tuple[AliasedIO, ...]
    hardware_compatible: bool
    device_id: int
    serialized_metadata: str
    target_platform: str
    engine: memoryview = field(repr=False)
    metadata_size: int = 0
    engine_offset: int = 0

    @property
    def inputs(self) -> list[IOBinding]:
        return [b for b in self.io_bindings if b.is_input]

    @property
    def outputs(self) -> list[IOBinding]:
        return [b for b in self.io_bindings if not b.is_input]


def align16(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def host_platform() -> str:
    """The ``target_platform`` string for this machine."""
    import platform
    import sys

    machine = platform.machine().lower()
    arch = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}.get(machine)
    if sys.platform.startswith("linux") and arch:
        return f"linux_{arch}"
    if sys.platform == "win32" and arch:
        return "windows_x86_64" if arch == "x86_64" else "windows_arm64"
    return "unknown"


# -- writing -----------------------------------------------------------------------------------


def encode_metadata(
    io_bindings: Sequence[IOBinding],
    *,
    aliased_io: Sequence[AliasedIO] = (),
    hardware_compatible: bool = False,
    device_id: int = 0,
    serialized_metadata: str = "",
    target_platform: str | None = None,
) -> bytes:
    """Compact JSON metadata with keys in the order the C++ reader expects."""
    platform = host_platform() if target_platform is None else target_platform
    if platform not in PLATFORMS:
        raise BlobFormatError(f"target_platform {platform!r} is not one of {PLATFORMS}")
    if not is_int(device_id, low=0):
        raise BlobFormatError(f"device_id {device_id!r} must be a non-negative int")
    for a in aliased_io:
        if a.kind not in ALIAS_KINDS:
            raise BlobFormatError(f"aliased_io kind {a.kind!r} for output {a.output!r} is not one of {ALIAS_KINDS}")
    values = {
        "io_bindings": [b.to_json() for b in io_bindings],
        "aliased_io": [a.to_json() for a in aliased_io],
        "hardware_compatible": bool(hardware_compatible),
        "device_id": int(device_id),  # a numpy int too
        "serialized_metadata": serialized_metadata,
        "target_platform": platform,
    }
    meta = {key: values[key] for key in METADATA_KEYS}  # the reader's order, and a KeyError if a key is missed
    return json.dumps(meta, separators=(",", ":")).encode("utf-8")


def encode_header(metadata: bytes, engine_size: int, *, aliased: bool) -> bytes:
    """The 32-byte header + metadata + padding: everything that precedes the engine."""
    engine_offset = align16(HEADER_SIZE + len(metadata))
    magic = MAGIC_ALIASED if aliased else MAGIC_PLAIN
    head = HEADER.pack(magic, HEADER_SIZE, len(metadata), engine_offset, engine_size, RESERVED)
    return head + metadata + b"\x00" * (engine_offset - HEADER_SIZE - len(metadata))


def encode_blob(engine: bytes | bytearray | memoryview, io_bindings: Sequence[IOBinding], **meta: Any) -> bytes:
    """Build a complete blob (one copy of the engine; see :func:`encode_header` to stream instead)."""
    engine_view = memoryview(engine).cast("B")
    metadata = encode_metadata(io_bindings, **meta)
    head = encode_header(metadata, engine_view.nbytes, aliased=bool(meta.get("aliased_io")))
    out = bytearray(len(head) + engine_view.nbytes)
    out[: len(head)] = head
    out[len(head) :] = engine_view
    return bytes(out)


# -- reading -----------------------------------------------------------------------------------


def parse_blob(data: bytes | bytearray | memoryview, *, source: str = "<blob>") -> TensorRTBlob:
    """Validate and parse a blob without copying the engine bytes."""
    span = Span(memoryview(data).cast("B"), source, error=BlobFormatError)
    magic, meta_off, meta_size, engine_off, engine_size, _ = HEADER.unpack(span.bytes_at("blob header", 0, HEADER_SIZE))
    if magic not in (MAGIC_PLAIN, MAGIC_ALIASED):
        raise BlobFormatError(f"{source}: blob magic {magic!r} is not {MAGIC_PLAIN!r} or {MAGIC_ALIASED!r}")
    if meta_off < HEADER_SIZE:
        raise BlobFormatError(f"{source}: metadata_offset {meta_off} is inside the {HEADER_SIZE}-byte header")
    if engine_off % ALIGN:
        raise BlobFormatError(f"{source}: engine_offset {engine_off} is not {ALIGN}-byte aligned")
    if meta_off + meta_size > engine_off:
        raise BlobFormatError(
            f"{source}: metadata [{meta_off}, {meta_off + meta_size}) overlaps engine_offset {engine_off}"
        )
    meta_bytes = span.bytes_at("blob metadata", meta_off, meta_size)
    engine = span.view("blob engine", engine_off, engine_size)
    meta = _decode_metadata(meta_bytes, source)
    aliased = tuple(_alias(a, source) for a in _field(meta, "aliased_io", list, source, default=[]))
    if aliased and magic == MAGIC_PLAIN:
        raise BlobFormatError(f"{source}: blob has aliased_io but magic {magic!r} (expected {MAGIC_ALIASED!r})")
    device_id = _field(meta, "device_id", int, source, default=0)
    if device_id < 0:
        raise BlobFormatError(f"{source}: device_id {device_id} is negative")
    return TensorRTBlob(
        magic=magic.decode("ascii"),
        io_bindings=tuple(_binding(b, source) for b in _field(meta, "io_bindings", list, source)),
        aliased_io=aliased,
        hardware_compatible=_field(meta, "hardware_compatible", bool, source, default=False),
        device_id=device_id,
        serialized_metadata=_field(meta, "serialized_metadata", str, source, default=""),
        target_platform=_field(meta, "target_platform", str, source, default="unknown"),
        engine=engine,
        metadata_size=meta_size,
        engine_offset=engine_off,
    )


def is_tensorrt_blob(data: bytes | bytearray | memoryview) -> bool:
    """True if ``data`` starts with a TR01/TR02 magic (no further validation)."""
    return bytes(memoryview(data)[:4]) in (MAGIC_PLAIN, MAGIC_ALIASED)


_MISSING = object()


def _decode_metadata(raw: bytes, source: str) -> dict[str, Any]:
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise BlobFormatError(f"{source}: metadata ({len(raw)} bytes) is not UTF-8 JSON: {exc}") from None
    if not isinstance(meta, dict):
        raise BlobFormatError(f"{source}: metadata is a JSON {type(meta).__name__}, expected an object")
    return meta


def _field(obj: dict[str, Any], key: str, kind: type, source: str, default: Any = _MISSING) -> Any:
    value = obj.get(key, default)
    if value is _MISSING:
        raise BlobFormatError(f"{source}: metadata lacks required key {key!r}")
    if not (is_int(value) if kind is int else isinstance(value, kind)):
        raise BlobFormatError(f"{source}: metadata key {key!r} is {value!r}, expected {kind.__name__}")
    return value


def _binding(obj: Any, source: str) -> IOBinding:
    if not isinstance(obj, dict):
        raise BlobFormatError(f"{source}: io_bindings entry {obj!r} is not an object")
    shape = _field(obj, "shape", list, source)
    if not all(is_int(d, low=-1) for d in shape):
        raise BlobFormatError(f"{source}: io_binding {obj.get('name')!r} has invalid shape {shape!r}")
    return IOBinding(
        name=_field(obj, "name", str, source),
        dtype=_field(obj, "dtype", str, source),
        shape=tuple(shape),
        is_input=_field(obj, "is_input", bool, source),
    )


def _alias(obj: Any, source: str) -> AliasedIO:
    if not isinstance(obj, dict):
        raise BlobFormatError(f"{source}: aliased_io entry {obj!r} is not an object")
    kind = _field(obj, "kind", str, source)
    if kind not in ALIAS_KINDS:
        raise BlobFormatError(f"{source}: aliased_io kind {kind!r} is not one of {ALIAS_KINDS}")
    return AliasedIO(output=_field(obj, "output", str, source), input=_field(obj, "input", str, source), kind=kind)
