"""Hostile .pte files: opening and fully walking one either succeeds or raises a PyrtError.

Never another exception type, never a hang (pytest-timeout), never unbounded
memory (tracemalloc peak for the hostile-length cases). Field positions are
located with ExecuTorch's generated FlatBuffers accessors, independently of pyrt.
"""

from __future__ import annotations

import random
import struct
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyrt.errors import PteFormatError, PyrtError
from pyrt.pte_reader import PteFile
from tests.fixtures.pte import walk

MiB = 1 << 20


def outcome(data: bytes | bytearray) -> PyrtError | None:
    """Open + walk ``data``; return the PyrtError raised, or None. Any other exception propagates."""
    try:
        with PteFile.open(bytes(data)) as pte:
            walk(pte)
    except PyrtError as exc:
        return exc
    return None


def patched(data: bytes, pos: int, fmt: str, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, pos, value)
    assert bytes(out) != data or struct.unpack_from(fmt, data, pos)[0] == value
    return bytes(out)


# -- locating fields with ExecuTorch's generated accessors ------------------------------------------------


def fb_program(data: bytes) -> Any:
    from executorch.exir._serialize._flatbuffer_program import _patch_generated_flatbuffer_aliases
    from executorch.exir._serialize.generated.executorch_flatbuffer.Program import Program

    _patch_generated_flatbuffer_aliases()  # ExecuTorch's own fix-up of the generated modules' class names

    return Program.GetRootAs(data, 0)


def field_pos(obj: Any, slot: int) -> int:
    """Absolute position of field ``slot`` (declaration order) of a generated table object."""
    off = obj._tab.Offset(4 + 2 * slot)
    assert off, f"field {slot} absent"
    return obj._tab.Pos + off


def vector_len_pos(obj: Any, slot: int) -> int:
    return obj._tab.Vector(obj._tab.Offset(4 + 2 * slot)) - 4


# -- truncation ---------------------------------------------------------------------------------------------


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["delegated_segments", "no_segments"])
def test_truncation_at_every_offset(pte_file: Callable[[str], Path], name: str) -> None:
    data = pte_file(name).read_bytes()
    assert outcome(data) is None
    for n in range(len(data)):
        err = outcome(data[:n])
        if name == "delegated_segments":
            assert isinstance(err, PteFormatError), n  # the extended header makes any truncation detectable


@pytest.mark.timeout(300)
def test_truncation_with_header_patched_to_match(pte_file: Callable[[str], Path]) -> None:
    """Truncate, then shrink program_size / segment_data_size so parsing reaches the cut flatbuffer."""
    data = pte_file("synthetic").read_bytes()
    program_size, base = struct.unpack_from("<QQ", data, 16)
    for n in range(8, len(data)):
        cut = bytearray(data[:n])
        if n >= 40:
            struct.pack_into("<QQQ", cut, 16, min(program_size, n), base if n >= base else 0, max(0, n - base))
        outcome(cut)


# -- flipped bytes ------------------------------------------------------------------------------------------


def _header_region(data: bytes) -> range:
    """The file header, extended header, root table and its vtable."""
    prog = fb_program(data)
    pos = prog._tab.Pos
    vt = pos - struct.unpack_from("<i", data, pos)[0]
    vt_size = struct.unpack_from("<H", data, vt)[0]
    return range(0, max(40, pos + 4, vt + vt_size))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["delegated_segments", "delegated_inline", "portable"])
def test_flipped_bytes(pte_file: Callable[[str], Path], name: str) -> None:
    data = pte_file(name).read_bytes()
    rng = random.Random(f"flip-{name}")
    header = _header_region(data)
    cases = [(p, mask) for p in header for mask in (0x01, 0x80, 0xFF)]
    cases += [(rng.randrange(header.stop, len(data)), rng.randrange(1, 256)) for _ in range(400)]
    failures = 0
    for pos, mask in cases:
        mutated = bytearray(data)
        mutated[pos] ^= mask
        failures += outcome(mutated) is not None
    assert failures > 0  # the sweep does reach validation (a sweep that can't fail proves nothing)


# -- hostile lengths and offsets ---------------------------------------------------------------------------


def hostile_cases(data: bytes) -> dict[str, bytes]:
    """Named single-field corruptions of a delegated (segment) file; each must be rejected."""
    p = fb_program(data)
    plan = p.ExecutionPlan(0)
    delegate = plan.Delegates(0)
    value0 = plan.Values(0)
    seg1 = p.Segments(1)  # segment 0 sits at offset 0, which FlatBuffers leaves out as the default
    chain = plan.Chains(0)
    n = len(data)
    ptab = p._tab.Pos
    cases = {
        "root offset past end": patched(data, 0, "<I", n + 64),
        "root offset u32 max": patched(data, 0, "<I", 0xFFFFFFFF),
        "vtable soffset i32 min": patched(data, ptab, "<i", -(2**31)),
        "vtable soffset i32 max": patched(data, ptab, "<i", 2**31 - 1),
        "vtable soffset negative past end": patched(data, ptab, "<i", -(n + 8)),
        "vtable size odd": patched(data, ptab - struct.unpack_from("<i", data, ptab)[0], "<H", 7),
        "vtable size 0xFFFF": patched(data, ptab - struct.unpack_from("<i", data, ptab)[0], "<H", 0xFFFF),
        "execution_plan length u32 max": patched(data, vector_len_pos(p, 1), "<I", 0xFFFFFFFF),
        "segments length u32 max": patched(data, vector_len_pos(p, 4), "<I", 0xFFFFFFFF),
        "values length u32 max": patched(data, vector_len_pos(plan, 2), "<I", 0xFFFFFFFF),
        "values length just past end": patched(data, vector_len_pos(plan, 2), "<I", n // 4),
        "method name length u32 max": patched(data, plan._tab.Vector(plan._tab.Offset(4)) - 4, "<I", 0xFFFFFFFF),
        "instructions length u32 max": patched(data, vector_len_pos(chain, 2), "<I", 0xFFFFFFFF),
        "compile_specs length u32 max": patched(data, vector_len_pos(delegate, 2), "<I", 0xFFFFFFFF),
        "plan table uoffset past end": patched(data, p._tab.Vector(p._tab.Offset(6)), "<I", n),
        "value table uoffset u32 max": patched(data, plan._tab.Vector(plan._tab.Offset(8)), "<I", 0xFFFFFFFF),
        "segment offset u64 max": patched(data, field_pos(seg1, 0), "<Q", 2**64 - 1),
        "segment size u64 max": patched(data, field_pos(seg1, 1), "<Q", 2**64 - 1),
        "segment offset wraps in 64 bits": patched(patched(data, field_pos(seg1, 0), "<Q", 2**64 - 16),
                                                   field_pos(seg1, 1), "<Q", 48),
        "segment offset 5 GiB": patched(data, field_pos(seg1, 0), "<Q", 5 << 30),
        "delegate segment index u32 max": patched(data, field_pos(delegate.Processed(), 1), "<I", 0xFFFFFFFF),
        "delegate location 7": patched(data, field_pos(delegate.Processed(), 0), "<b", 7),
        "evalue union tag 200": patched(data, field_pos(value0, 0), "<B", 200),
        "evalue union tag 0": patched(data, field_pos(value0, 0), "<B", 0),
        "constant offset u64 max": patched(data, p.ConstantSegment()._tab.Vector(
            p.ConstantSegment()._tab.Offset(6)) + 8, "<Q", 2**64 - 1),
        "named data segment index u32 max": patched(data, field_pos(p.NamedData(0), 1), "<I", 0xFFFFFFFF),
        "header length 0xFFFFFFFF": patched(data, 12, "<I", 0xFFFFFFFF),
        "header length 8": patched(data, 12, "<I", 8),
        "program_size > file": patched(data, 16, "<Q", n + 1),
        "program_size u64 max": patched(data, 16, "<Q", 2**64 - 1),
        "program_size 0": patched(data, 16, "<Q", 0),
        "segment_base_offset past end": patched(data, 24, "<Q", n + 128),
        "segment_base_offset inside program": patched(data, 24, "<Q", 64),
        "segment_base_offset u64 max": patched(data, 24, "<Q", 2**64 - 1),
        "segment_data_size past end": patched(data, 32, "<Q", n),
        "segment_data_size u64 max": patched(data, 32, "<Q", 2**64 - 1),
    }
    tensor = next(plan.Values(i).Val() for i in range(plan.ValuesLength()) if plan.Values(i).ValType() == 5)
    from executorch.exir._serialize.generated.executorch_flatbuffer.Tensor import Tensor as FBTensor

    t = FBTensor()
    t.Init(tensor.Bytes, tensor.Pos)
    cases["tensor scalar_type 99"] = patched(data, field_pos(t, 0), "<b", 99)
    cases["tensor sizes length u32 max"] = patched(data, vector_len_pos(t, 2), "<I", 0xFFFFFFFF)
    cases["tensor negative size"] = patched(data, vector_len_pos(t, 2) + 4, "<i", -3)
    return cases


HOSTILE_NAMES = [
    "root offset past end", "root offset u32 max", "vtable soffset i32 min", "vtable soffset i32 max",
    "vtable soffset negative past end", "vtable size odd", "vtable size 0xFFFF", "execution_plan length u32 max",
    "segments length u32 max", "values length u32 max", "values length just past end",
    "method name length u32 max", "instructions length u32 max", "compile_specs length u32 max",
    "plan table uoffset past end", "value table uoffset u32 max", "segment offset u64 max",
    "segment size u64 max", "segment offset wraps in 64 bits", "segment offset 5 GiB",
    "delegate segment index u32 max", "delegate location 7", "evalue union tag 200", "evalue union tag 0",
    "constant offset u64 max", "named data segment index u32 max", "header length 0xFFFFFFFF",
    "header length 8", "program_size > file", "program_size u64 max", "program_size 0",
    "segment_base_offset past end", "segment_base_offset inside program", "segment_base_offset u64 max",
    "segment_data_size past end", "segment_data_size u64 max", "tensor scalar_type 99",
    "tensor sizes length u32 max", "tensor negative size"]


@pytest.fixture(scope="module")
def delegated_bytes(pte_file: Callable[[str], Path]) -> bytes:
    return pte_file("delegated_segments").read_bytes()


def test_hostile_cases_differ_from_the_original(delegated_bytes: bytes) -> None:
    cases = hostile_cases(delegated_bytes)
    assert sorted(cases) == sorted(HOSTILE_NAMES)
    assert all(c != delegated_bytes for c in cases.values())
    assert outcome(delegated_bytes) is None


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_hostile_field_is_rejected_in_bounded_memory(delegated_bytes: bytes, name: str) -> None:
    data = hostile_cases(delegated_bytes)[name]
    tracemalloc.start()
    try:
        err = outcome(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert isinstance(err, PteFormatError), f"{name}: accepted"
    assert peak < 16 * MiB, f"{name}: peak {peak} bytes"
    assert "<" not in type(err).__name__ and str(err)


@pytest.mark.timeout(300)
def test_hostile_u32_at_every_aligned_position(pte_file: Callable[[str], Path]) -> None:
    """Every 4-aligned word of a small file's flatbuffer set to each hostile value."""
    data = pte_file("synthetic").read_bytes()
    program_size = struct.unpack_from("<Q", data, 16)[0]
    for pos in range(0, program_size - 3, 4):
        for value in (0xFFFFFFFF, 0x80000000, 0x7FFFFFFF, len(data), len(data) - 4):
            outcome(patched(data, pos, "<I", value))


# -- property-based mutation of real files -----------------------------------------------------------------

FIXTURES = ["delegated_segments", "delegated_inline", "portable", "synthetic"]


@st.composite
def mutations(draw: Any, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 8))):
        how = draw(st.sampled_from(["byte", "u32", "u64", "cut", "splice"]))
        pos = draw(st.integers(0, len(out) - 1))
        if how == "byte":
            out[pos] = draw(st.integers(0, 255))
        elif how == "u32" and pos + 4 <= len(out):
            out[pos:pos + 4] = struct.pack("<I", draw(st.sampled_from(
                [0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, len(out), len(out) + 4, pos])))
        elif how == "u64" and pos + 8 <= len(out):
            out[pos:pos + 8] = struct.pack("<Q", draw(st.sampled_from([2**63, 2**64 - 1, 2**32, 5 << 30, len(out)])))
        elif how == "cut":
            del out[pos:]
            if not out:
                out = bytearray(b"\x00")
        elif how == "splice":
            out[pos:pos] = draw(st.binary(min_size=1, max_size=16))
    return bytes(out)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_mutated_real_files_fail_only_with_pyrt_errors(pte_file: Callable[[str], Path], data: st.DataObject) -> None:
    original = pte_file(data.draw(st.sampled_from(FIXTURES))).read_bytes()
    outcome(data.draw(mutations(original)))


@pytest.mark.slow
@settings(max_examples=20_000, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_mutated_real_files_long_run(pte_file: Callable[[str], Path], data: st.DataObject) -> None:
    original = pte_file(data.draw(st.sampled_from(FIXTURES))).read_bytes()
    outcome(data.draw(mutations(original)))
