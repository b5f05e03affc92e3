"""The TR01/TR02 TensorRT delegate blob: golden bytes, validation and round trips (formats.md section 2)."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyrt.errors import BlobFormatError
from pyrt.format.trt_blob import (
    AliasedIO,
    IOBinding,
    encode_blob,
    encode_header,
    encode_metadata,
    is_tensorrt_blob,
    parse_blob,
)

# Engine bytes with distinct head, fill and tail, so every boundary shows up in the bytes.
HEAD, FILL, TAIL = b"\xe1" * 7, b"\xe2" * 50, b"\xe3" * 9
ENGINE = HEAD + FILL + TAIL  # 66 bytes
BINDINGS = [IOBinding("x", "float32", (2, -1), True), IOBinding("out", "float16", (2, 3), False)]

# The metadata the C++ reader expects for BINDINGS, written out by hand (keys in formats.md order).
GOLDEN_META = (
    b'{"io_bindings":[{"name":"x","dtype":"float32","shape":[2,-1],"is_input":true},'
    b'{"name":"out","dtype":"float16","shape":[2,3],"is_input":false}],"aliased_io":[],'
    b'"hardware_compatible":false,"device_id":0,"serialized_metadata":"","target_platform":"linux_x86_64"}'
)
META_KEYS = ["io_bindings", "aliased_io", "hardware_compatible", "device_id", "serialized_metadata",
             "target_platform"]


def _blob(meta: bytes, engine: bytes = b"ENGINE", *, magic: bytes = b"TR01", meta_off: int = 32,
          engine_off: int | None = None, engine_size: int | None = None, meta_size: int | None = None) -> bytes:
    """A hand-assembled blob; any header field can be overridden to make it invalid."""
    eoff = (32 + len(meta) + 15) // 16 * 16 if engine_off is None else engine_off
    head = struct.pack("<4sIIIQ8s", magic, meta_off, len(meta) if meta_size is None else meta_size, eoff,
                       len(engine) if engine_size is None else engine_size, b"\x01" + b"\x00" * 7)
    body = bytearray(max(eoff, 32 + len(meta)) + len(engine))
    body[:32] = head
    body[32:32 + len(meta)] = meta
    body[eoff:eoff + len(engine)] = engine
    return bytes(body)


def _meta(**overrides: object) -> bytes:
    base = {"io_bindings": [b.to_json() for b in BINDINGS], "aliased_io": [], "hardware_compatible": False,
            "device_id": 0, "serialized_metadata": "", "target_platform": "linux_x86_64"}
    base.update(overrides)
    return json.dumps({k: v for k, v in base.items() if v is not ...}).encode()


# -- golden bytes ------------------------------------------------------------------------------------------


def test_golden_bytes_and_every_boundary() -> None:
    blob = encode_blob(ENGINE, BINDINGS, target_platform="linux_x86_64")
    # header: 32 + 259 metadata bytes = 291 -> engine at align16(291) = 304 = 0x130; 13 padding bytes
    assert len(GOLDEN_META) == 259
    assert blob[:32] == bytes.fromhex("54523031" "20000000" "03010000" "30010000" "4200000000000000"
                                      "0100000000000000")
    assert len(blob) == 304 + 66
    assert blob[31:33] == b"\x00{"                    # last reserved byte | first metadata byte
    assert blob[32:291] == GOLDEN_META
    assert blob[290:292] == b"}\x00"                  # metadata end | padding
    assert blob[291:304] == b"\x00" * 13               # padding only zeros
    assert blob[303:305] == b"\x00\xe1"               # padding | engine head
    assert blob[304:311] == HEAD and blob[311:361] == FILL and blob[361:] == TAIL
    assert blob[-1:] == b"\xe3"

    parsed = parse_blob(blob)
    assert (parsed.magic, parsed.metadata_size, parsed.engine_offset) == ("TR01", 259, 304)
    assert bytes(parsed.engine) == ENGINE
    assert parsed.io_bindings == tuple(BINDINGS)
    assert [b.name for b in parsed.inputs] == ["x"] and [b.name for b in parsed.outputs] == ["out"]


def test_metadata_ending_on_a_16_byte_boundary_has_no_padding() -> None:
    meta = encode_metadata(BINDINGS, target_platform="linux_x86_64", serialized_metadata="abcdefghijklm")
    assert (32 + len(meta)) % 16 == 0
    blob = encode_blob(ENGINE, BINDINGS, target_platform="linux_x86_64", serialized_metadata="abcdefghijklm")
    end = 32 + len(meta)
    assert blob[end - 1:end + 1] == b"}\xe1"           # metadata runs straight into the engine
    assert parse_blob(blob).engine_offset == end


def test_json_key_order_matches_the_cpp_reader() -> None:
    blob = encode_blob(ENGINE, BINDINGS, aliased_io=[AliasedIO("out", "x", "kv_cache_update")], device_id=3,
                       hardware_compatible=True, serialized_metadata="meta", target_platform="windows_arm64")
    meta_size = struct.unpack_from("<I", blob, 8)[0]
    pairs = json.loads(blob[32:32 + meta_size], object_pairs_hook=lambda kv: kv)
    assert [k for k, _ in pairs] == META_KEYS
    body = dict(pairs)
    assert [[k for k, _ in b] for b in body["io_bindings"]] == [["name", "dtype", "shape", "is_input"]] * 2
    assert [k for k, _ in body["aliased_io"][0]] == ["output", "input", "kind"]
    assert b" " not in blob[32:32 + meta_size]          # compact separators


def test_aliased_io_writes_tr02() -> None:
    alias = AliasedIO("out", "x", "user")
    blob = encode_blob(ENGINE, BINDINGS, aliased_io=[alias], target_platform="unknown")
    assert blob[:4] == b"TR02"
    parsed = parse_blob(blob)
    assert parsed.magic == "TR02" and parsed.aliased_io == (alias,)
    assert encode_blob(ENGINE, BINDINGS, aliased_io=[])[:4] == b"TR01"


def test_header_then_engine_equals_whole_blob() -> None:
    meta = encode_metadata(BINDINGS, device_id=1, target_platform="linux_aarch64")
    head = encode_header(meta, len(ENGINE), aliased=False)
    assert head + ENGINE == encode_blob(ENGINE, BINDINGS, device_id=1, target_platform="linux_aarch64")


def test_engine_is_a_zero_copy_view_at_an_offset_inside_a_larger_buffer() -> None:
    blob = encode_blob(ENGINE, BINDINGS, target_platform="linux_x86_64")
    buf = bytearray(b"\xaa" * 48 + blob + b"\xbb" * 5)
    parsed = parse_blob(memoryview(buf)[48:48 + len(blob)])
    assert bytes(parsed.engine) == ENGINE
    buf[48 + parsed.engine_offset] = 0x42               # the view sees writes to the buffer: no copy was made
    assert parsed.engine[0] == 0x42
    assert is_tensorrt_blob(blob) and not is_tensorrt_blob(b"TR03....")


# -- validation --------------------------------------------------------------------------------------------

GOOD = _meta()

INVALID_BLOBS = {
    "empty": b"",
    "short header": _blob(GOOD)[:31],
    "bad magic": _blob(GOOD, magic=b"TR03"),
    "lowercase magic": _blob(GOOD, magic=b"tr01"),
    "metadata offset inside header": _blob(GOOD, meta_off=16),
    "engine offset unaligned": _blob(GOOD, engine_off=(32 + len(GOOD) + 15) // 16 * 16 + 8),
    "metadata overlaps engine": _blob(GOOD, engine_off=(32 + len(GOOD)) // 16 * 16),
    "metadata past end": _blob(GOOD, meta_size=10**6),
    "engine past end": _blob(GOOD, engine_size=7),
    "engine size u64 max": _blob(GOOD, engine_size=2**64 - 1),
    "engine offset past end": _blob(GOOD, engine_off=1 << 20, engine=b"")[:64 + len(GOOD)],
    "metadata not utf-8": _blob(b"\xff\xfe" + GOOD),
    "metadata not json": _blob(b"{io_bindings: []}"),
    "metadata a list": _blob(b"[1, 2]"),
    "metadata nested 100000 deep": _blob(b"[" * 100_000),
    "io_bindings missing": _blob(_meta(io_bindings=...)),
    "io_bindings not a list": _blob(_meta(io_bindings={"x": 1})),
    "binding not an object": _blob(_meta(io_bindings=["x"])),
    "binding without name": _blob(_meta(io_bindings=[{"dtype": "float32", "shape": [1], "is_input": True}])),
    "binding name not str": _blob(_meta(io_bindings=[{"name": 1, "dtype": "f", "shape": [1], "is_input": True}])),
    "is_input a string": _blob(_meta(io_bindings=[{"name": "x", "dtype": "f", "shape": [1], "is_input": "true"}])),
    "shape with bool": _blob(_meta(io_bindings=[{"name": "x", "dtype": "f", "shape": [True], "is_input": True}])),
    "shape below -1": _blob(_meta(io_bindings=[{"name": "x", "dtype": "f", "shape": [-2], "is_input": True}])),
    "shape with float": _blob(_meta(io_bindings=[{"name": "x", "dtype": "f", "shape": [1.5], "is_input": True}])),
    "shape not a list": _blob(_meta(io_bindings=[{"name": "x", "dtype": "f", "shape": 3, "is_input": True}])),
    "aliased io under TR01": _blob(_meta(aliased_io=[{"output": "out", "input": "x", "kind": "user"}])),
    "alias kind unknown": _blob(_meta(aliased_io=[{"output": "o", "input": "x", "kind": "other"}]), magic=b"TR02"),
    "alias not an object": _blob(_meta(aliased_io=["o@x@user"]), magic=b"TR02"),
    "device_id negative": _blob(_meta(device_id=-1)),
    "device_id bool": _blob(_meta(device_id=True)),
    "device_id string": _blob(_meta(device_id="0")),
    "hardware_compatible int": _blob(_meta(hardware_compatible=1)),
    "serialized_metadata not str": _blob(_meta(serialized_metadata=["x"])),
    "target_platform not str": _blob(_meta(target_platform=3)),
}


@pytest.mark.parametrize("name", sorted(INVALID_BLOBS))
def test_every_validation_failure_is_a_blob_format_error(name: str) -> None:
    with pytest.raises(BlobFormatError, match="^<blob>|^x.pte"):
        parse_blob(INVALID_BLOBS[name], source="x.pte")


def test_the_hand_assembled_good_blob_parses() -> None:
    """Control for the table above: the same assembly without a defect is accepted."""
    parsed = parse_blob(_blob(GOOD, b"\xe1\xe2\xe3"))
    assert parsed.io_bindings == tuple(BINDINGS) and bytes(parsed.engine) == b"\xe1\xe2\xe3"


@pytest.mark.parametrize("kwargs", [
    {"target_platform": "linux_riscv"}, {"device_id": -1}, {"device_id": True},
    {"aliased_io": [AliasedIO("o", "i", "weird")]},
])
def test_encoder_rejects_bad_metadata(kwargs: dict) -> None:
    with pytest.raises(BlobFormatError):
        encode_blob(ENGINE, BINDINGS, **kwargs)


# -- round trip ---------------------------------------------------------------------------------------------

names = st.text(min_size=1, max_size=12)
bindings = st.builds(IOBinding, names, st.sampled_from(["float32", "float16", "bfloat16", "int64", "int32", "int8",
                                                        "uint8", "bool"]),
                     st.lists(st.integers(-1, 2**40), max_size=5).map(tuple), st.booleans())
aliases = st.builds(AliasedIO, names, names, st.sampled_from(["kv_cache_update", "user"]))


@settings(max_examples=200)
@given(engine=st.binary(max_size=300), io=st.lists(bindings, max_size=6), aliased=st.lists(aliases, max_size=3),
       hw=st.booleans(), device=st.integers(0, 2**31), meta=st.text(max_size=40),
       platform=st.sampled_from(["linux_x86_64", "linux_aarch64", "windows_x86_64", "windows_arm64", "unknown"]))
def test_round_trip(engine: bytes, io: list, aliased: list, hw: bool, device: int, meta: str, platform: str) -> None:
    blob = encode_blob(engine, io, aliased_io=aliased, hardware_compatible=hw, device_id=device,
                       serialized_metadata=meta, target_platform=platform)
    parsed = parse_blob(blob)
    assert parsed.magic == ("TR02" if aliased else "TR01")
    assert (parsed.io_bindings, parsed.aliased_io) == (tuple(io), tuple(aliased))
    assert (parsed.hardware_compatible, parsed.device_id, parsed.serialized_metadata, parsed.target_platform) == (
        hw, device, meta, platform)
    assert bytes(parsed.engine) == engine
    assert parsed.engine_offset % 16 == 0 and parsed.engine_offset + len(engine) == len(blob)
    assert not any(blob[32 + parsed.metadata_size:parsed.engine_offset])
