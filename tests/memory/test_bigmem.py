"""Bounded host memory at every stage of a program bigger than memory (issue 13).

Each stage runs in its own process (``tests/memory/bigmem_stages.py``) and reports its peak RSS
(VmHWM, reset once its imports are done), so stages never pollute each other. The model's
weights are untouched ``torch.empty`` pages and the files are sparse (zero runs are holes),
so the slow test needs little disk and no RAM for the data itself: what is measured is
what pyrt holds. The bounds are the ones docs/memory.md documents.
"""

from __future__ import annotations

import json
import mmap
import subprocess
import sys
from pathlib import Path

import pytest

from pyrt.engine import STREAM_CHUNK_BYTES
from pyrt.format.mapped import map_file, release_pages, unmap

ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20
GIB = 1 << 30

# docs/memory.md: peak RSS bounds per stage (imports included) and growth over the stage's base.
EXPORT_PEAK, EXPORT_GROWTH = 1024 * MIB, 256 * MIB
INSPECT_PEAK = 128 * MIB
LOAD_PEAK = 256 * MIB


def stage(name: str, directory: Path, *sizes: int) -> dict:
    proc = subprocess.run([sys.executable, "-m", "tests.memory.bigmem_stages", name, str(directory), *map(str, sizes)],
                          cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["peak"], result["base"] = result["peak_mib"] * MIB, result["base_mib"] * MIB
    return result


def check_runs(load: dict) -> None:
    from tests.memory.bigmem_stages import MARKS

    assert load["first"] == [(1 + MARKS[0] + MARKS[1]) * MARKS[2]] * 4  # engine weight ends x table row 0
    assert load["last"] == [(1 + MARKS[0] + MARKS[1]) * MARKS[3]] * 4  # ... x the table's last row


def test_release_pages_touches_only_read_only_mappings(tmp_path: Path) -> None:
    path = tmp_path / "data.bin"
    path.write_bytes(b"\x07" * (4 * mmap.PAGESIZE))
    mm, view = map_file(str(path), "test data")
    try:
        assert release_pages(view[mmap.PAGESIZE : 3 * mmap.PAGESIZE]) is True
        assert bytes(view[mmap.PAGESIZE : mmap.PAGESIZE + 4]) == b"\x07" * 4  # the data comes back on access
        assert release_pages(view[10:20]) is False  # less than a whole page: nothing to drop
    finally:
        view.release()
        unmap(mm)
    heap = bytearray(b"\x05" * (4 * mmap.PAGESIZE))
    assert release_pages(memoryview(heap)) is False and heap == b"\x05" * (4 * mmap.PAGESIZE)


def test_stream_reader_drops_the_engine_pages_it_served(tmp_path: Path) -> None:
    """A 256 MiB engine reaches the (fake) TensorRT through the stream reader in pieces of at most
    ``STREAM_CHUNK_BYTES``;
    the loading process never holds it: without dropping served pages its peak grows by the engine."""
    export = stage("export", tmp_path, 256 * MIB, 16 * MIB)
    load = stage("load", tmp_path)
    assert export["routes"] == ["stream"] and load["streamed"] == export["engine"] > 256 * MIB
    assert load["largest_read"] <= STREAM_CHUNK_BYTES
    assert load["peak"] - load["base"] < 64 * MIB, load
    check_runs(load)


@pytest.mark.slow
def test_program_over_4gib_stays_bounded_at_every_stage(tmp_path: Path) -> None:
    size = 9 * GIB // 2  # 4.5 GiB: the engine, and the external weights, each past 4 GiB (u32 offsets)
    export = stage("export", tmp_path, size, size)
    assert export["engine"] > 4 * GIB and export["ptd"] > 4 * GIB and export["pte"] > 4 * GIB
    assert export["peak"] < EXPORT_PEAK and export["peak"] - export["base"] < EXPORT_GROWTH, export
    for name in ("big.pte", "big.ptd"):
        st = (tmp_path / name).stat()
        assert st.st_size > 4 * GIB and st.st_blocks * 512 < 64 * MIB  # zero runs stayed holes
    inspect = stage("inspect", tmp_path)
    assert inspect["external"] == [["table", size, "big.ptd"]]
    assert inspect["peak"] < INSPECT_PEAK, inspect
    load = stage("load", tmp_path)
    assert load["streamed"] == export["engine"] and load["largest_read"] <= STREAM_CHUNK_BYTES
    assert load["peak"] < LOAD_PEAK, load
    check_runs(load)
