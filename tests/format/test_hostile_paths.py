"""Hostile paths and buffers: a typed PteFormatError naming the path, and opening never blocks.

A FIFO (opening one blocks until a writer appears), device files, directories,
paths with a NUL byte and non-contiguous buffers; ``pyrt inspect`` whose reader
goes away early exits quietly.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("executorch")

import pyrt  # noqa: E402
from pyrt.errors import PteFormatError  # noqa: E402
from pyrt.format.ptd_reader import PtdFile  # noqa: E402
from pyrt.runtime.program import Program  # noqa: E402
from tests.fixtures.pte import relu_program  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]



def _open_in_thread(fn: Any) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def target() -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: B036 - reported to the test thread
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(30)
    return thread, errors


OPENERS = [Program, pyrt.inspect, PtdFile.open]  # a .ptd opens the way a .pte does (pyrt.format.mapped.map_file)
OPENER_IDS = ["Program", "inspect", "ptd"]


@pytest.mark.parametrize("opener", OPENERS, ids=OPENER_IDS)
def test_fifo_is_refused_without_blocking(tmp_path: Path, opener: Any) -> None:
    fifo = tmp_path / "model.pte"
    os.mkfifo(fifo)
    thread, errors = _open_in_thread(lambda: opener(fifo))
    if thread.is_alive():  # release the blocked open (a writer appears), then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(30)
        pytest.fail("opening a FIFO blocked")
    assert len(errors) == 1 and isinstance(errors[0], PteFormatError), errors
    assert str(fifo) in str(errors[0]) and "FIFO" in str(errors[0])


def test_cli_on_a_fifo_reports_and_exits(tmp_path: Path) -> None:
    fifo = tmp_path / "model.pte"
    os.mkfifo(fifo)
    try:
        proc = subprocess.run([sys.executable, "-m", "pyrt", "inspect", str(fifo)], cwd=ROOT, capture_output=True,
                              text=True, timeout=60)
    except subprocess.TimeoutExpired:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("pyrt inspect blocked on a FIFO")
    assert proc.returncode == 1 and "FIFO" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("path, kind", [("/dev/null", "character device"), ("/dev/zero", "character device"),
                                        ("/tmp", "directory")])
def test_not_a_regular_file(path: str, kind: str) -> None:
    if not os.path.exists(path):
        pytest.skip(f"{path} does not exist here")
    for opener in OPENERS:
        with pytest.raises(PteFormatError, match=rf"{path}: cannot open: it is a {kind}"):
            opener(path)


@pytest.mark.parametrize("opener", OPENERS, ids=OPENER_IDS)
def test_nul_byte_in_path(opener: Any) -> None:
    with pytest.raises(PteFormatError, match=r"'/tmp/model\\x00.pte': not a usable path"):
        opener("/tmp/model\0.pte")


def test_non_contiguous_memoryview() -> None:
    data = relu_program()
    with pytest.raises(PteFormatError, match=r"non-contiguous memoryview \(shape \(\d+,\), strides \(2,\)\)"):
        Program(memoryview(bytearray(data * 2))[::2])
    with Program(memoryview(bytearray(b"\0" * 8 + data))[8:]) as prog:  # a contiguous slice is fine
        assert prog.method_names == ("forward",)


def test_broken_pipe_is_not_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "m.pte"
    path.write_bytes(relu_program())
    read, write = os.pipe()
    os.close(read)  # the reader is gone before pyrt writes a byte (what `| head` does, deterministically)
    try:
        proc = subprocess.run([sys.executable, "-m", "pyrt", "inspect", "--json", str(path)], cwd=ROOT,
                              stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
    assert proc.returncode == 141
