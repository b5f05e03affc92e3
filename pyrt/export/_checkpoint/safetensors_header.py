"""A ``.safetensors`` shard's header, read and checked without touching its tensor bytes.

The layout (safetensors' own spec): a little-endian u64 ``N``, then ``N`` bytes of JSON mapping
each tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets relative to the
data that follows the header) and an optional ``"__metadata__"`` of strings. Every tensor must
fit the data, hold exactly ``prod(shape) * itemsize`` bytes, overlap no other, and together they
must cover the data exactly: a shard cut short by a failed copy names its first tensor past the end.

>>> import json, struct, tempfile, os
>>> head = json.dumps({"w": {"dtype": "F16", "shape": [2, 2], "data_offsets": [0, 8]}}).encode()
>>> path = os.path.join(tempfile.mkdtemp(), "x.safetensors")
>>> _ = open(path, "wb").write(struct.pack("<Q", len(head)) + head + bytes(8))
>>> read_header(path).tensors["w"].shape
(2, 2)
>>> _ = open(path, "wb").write(struct.pack("<Q", len(head)) + head + bytes(5))
>>> read_header(path)                                   # doctest: +ELLIPSIS
Traceback (most recent call last):
pyrt.errors.CheckpointError: ...x.safetensors: truncated: tensor 'w' ends at data byte 8, but the file holds 5 ...
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from typing import Any

from pyrt.checks import is_int
from pyrt.errors import CheckpointError

MAX_HEADER = 100_000_000  # bytes: safetensors' own limit on the JSON header
ITEMSIZE = {  # safetensors dtype -> bytes per element (sub-byte types are refused: no LLM export reads them)
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}
FLOATING = {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64"}


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a shard: its dtype (safetensors' name), shape, and byte range in the data."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class ShardHeader:
    """A checked shard: where it is, its tensors by name, and the bytes of tensor data it holds."""

    path: str
    tensors: dict[str, TensorEntry]
    data_bytes: int


def read_header(path: str | os.PathLike[str]) -> ShardHeader:
    """The header of the shard at ``path``; a :class:`CheckpointError` naming the file for any flaw."""
    where = os.fspath(path)
    try:
        with open(where, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size < 8:
                raise CheckpointError(where, f"{size} bytes: too short for a safetensors header (8-byte length)")
            (length,) = struct.unpack("<Q", fh.read(8))
            if length > MAX_HEADER or length > size - 8:
                raise CheckpointError(where, f"header length {length} exceeds the file ({size} bytes) or "
                                             f"safetensors' limit ({MAX_HEADER}): truncated or not safetensors")
            raw = fh.read(length)
    except OSError as exc:
        raise CheckpointError(where, f"cannot read: {exc.strerror or exc}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(where, f"the header is not JSON ({exc}): not a safetensors file") from None
    if not isinstance(header, dict):
        raise CheckpointError(where, f"the header is a JSON {type(header).__name__}, not an object")
    data = size - 8 - length
    tensors = {name: _entry(where, name, spec) for name, spec in header.items() if name != "__metadata__"}
    _check_layout(where, tensors, data)
    return ShardHeader(where, tensors, data)


def _entry(where: str, name: str, spec: Any) -> TensorEntry:
    if not isinstance(spec, dict):
        raise CheckpointError(where, f"tensor {name!r}: entry is not an object")
    dtype, shape, offsets = spec.get("dtype"), spec.get("shape"), spec.get("data_offsets")
    if dtype not in ITEMSIZE:
        raise CheckpointError(where, f"tensor {name!r}: dtype {dtype!r} is not one of {', '.join(ITEMSIZE)}")
    if not isinstance(shape, list) or not all(_whole(d) for d in shape):
        raise CheckpointError(where, f"tensor {name!r}: shape {shape!r} is not a list of whole numbers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_whole(o) for o in offsets)
            and offsets[0] <= offsets[1]):
        raise CheckpointError(where, f"tensor {name!r}: data_offsets {offsets!r} is not [begin, end] with "
                                     "0 <= begin <= end")
    want = math.prod(shape) * ITEMSIZE[dtype]
    if offsets[1] - offsets[0] != want:
        raise CheckpointError(where, f"tensor {name!r}: {dtype}{shape} needs {want} bytes, data_offsets "
                                     f"{offsets} hold {offsets[1] - offsets[0]}")
    return TensorEntry(dtype, tuple(shape), offsets[0], offsets[1])


def _whole(value: Any) -> bool:
    return is_int(value, low=0)


def _check_layout(where: str, tensors: dict[str, TensorEntry], data: int) -> None:
    """Every tensor inside the data, none overlapping, the data covered exactly (safetensors' rule)."""
    end = 0
    for name, entry in sorted(tensors.items(), key=lambda kv: (kv[1].begin, kv[1].end)):
        if entry.end > data:
            raise CheckpointError(where, f"truncated: tensor {name!r} ends at data byte {entry.end}, but the file "
                                         f"holds {data} bytes of data after its header")
        if entry.begin < end:
            raise CheckpointError(where, f"tensor {name!r} (data bytes {entry.begin}..{entry.end}) overlaps the "
                                         "tensor before it")
        if entry.begin > end:
            raise CheckpointError(where, f"data bytes {end}..{entry.begin} belong to no tensor (before {name!r})")
        end = entry.end
    if end != data:
        raise CheckpointError(where, f"{data - end} bytes after the last tensor belong to no tensor")
