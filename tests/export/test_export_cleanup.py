"""Export cleans up after itself: dead exports' temporary files are swept, SIGTERM cleans like Ctrl-C,
and every bad target path is an ExportError naming it.

Interrupted exports run in child processes that stall half-way through
writing the .pte (as in tests/export/test_export_write.py) and are then signalled.

The exports here keep a fallback op (``torch_executed_ops``), so they go through ExecuTorch's
lowering and pyrt's streaming writer, which the tests interrupt; a fully delegated program is
written by pyrt.export._write.direct (tests/export/test_export_direct.py), through the same atomic write.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from pyrt.errors import ExportError
from pyrt.export import to_pte
from pyrt.export._files import tempfiles as _tempfiles
from tests.export.test_export_traps import TwoLinears

ROOT = Path(__file__).resolve().parents[2]
OLD = b"previous export, must survive"


def _export(target: Path) -> None:
    to_pte(TwoLinears(), target, (torch.randn(3, 4),), builder="reference", progress=False,
           torch_executed_ops=["aten.sigmoid.default"])


def _others(directory: Path, keep: str = "m.pte") -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name != keep)


def _start_stalled_export(target: Path) -> subprocess.Popen:
    """A child export that stops half-way through writing ``target`` (it prints "writing" when there)."""
    child = textwrap.dedent(f"""
        import signal, sys, time, torch
        # Ctrl-C's KeyboardInterrupt, as in a terminal: a shell's background job (a CI started with &)
        # starts with SIGINT ignored, and Python keeps an inherited SIG_IGN
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.path.insert(0, {str(ROOT)!r})
        from pyrt.export import to_pte
        from pyrt.export._write import executorch_serializer as _writer
        from tests.export.test_export_traps import TwoLinears

        def stall(cord, f, progress):
            f.write(b"\\x00" * 4096)
            f.flush()
            print("writing", flush=True)
            time.sleep(120)

        _writer.write_cord = stall
        to_pte(TwoLinears(), {str(target)!r}, (torch.randn(3, 4),), builder="reference", progress=False,
               torch_executed_ops=["aten.sigmoid.default"])
    """)
    return subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)


@pytest.fixture(scope="module")
def stalled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[subprocess.Popen, Path]]]:
    """One stalled child export per signal, started together (each in its own directory, over an old file)."""
    out = {}
    for name in ("SIGKILL", "SIGTERM", "SIGINT"):
        target = tmp_path_factory.mktemp(name) / "m.pte"
        target.write_bytes(OLD)
        out[name] = (_start_stalled_export(target), target)
    yield out
    for proc, _ in out.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _stalled(stalled: dict[str, tuple[subprocess.Popen, Path]], name: str) -> tuple[subprocess.Popen, Path]:
    proc, target = stalled[name]
    assert proc.stdout is not None and proc.stdout.readline().strip() == "writing", f"{name} child did not stall"
    return proc, target


def _signal_and_wait(proc: subprocess.Popen, sig: int) -> int:
    try:
        os.kill(proc.pid, sig)
    finally:
        proc.wait(timeout=120)
    return proc.returncode


# The stalled children (three exports importing torch and ExecuTorch at once) take about 46 s of a 2-core
# machine: the full tier's, not the fast tier's 8 minutes.
@pytest.mark.slow
def test_sigkill_leftovers_are_swept_by_the_next_export(stalled: dict) -> None:
    proc, target = _stalled(stalled, "SIGKILL")
    _signal_and_wait(proc, signal.SIGKILL)
    left = _others(target.parent)
    assert len(left) == 2 and all(f"-{proc.pid}-" in name for name in left), left  # working dir + partial .pte
    assert any(n.startswith(".pyrt-export-") for n in left) and any(n.endswith(".pte.tmp") for n in left)
    assert target.read_bytes() == OLD
    _export(target)
    assert _others(target.parent) == [] and target.read_bytes() != OLD


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_sigterm_cleans_like_sigint(stalled: dict, sig: int) -> None:
    proc, target = _stalled(stalled, signal.Signals(sig).name)
    rc = _signal_and_wait(proc, sig)
    assert _others(target.parent) == [] and target.read_bytes() == OLD
    if sig == signal.SIGTERM:
        assert rc == -signal.SIGTERM  # it still ends by the signal, after cleaning up


@pytest.mark.export
def test_sigterm_handler_is_restored_and_a_callers_handler_respected(tmp_path: Path) -> None:
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    _export(tmp_path / "a.pte")
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL

    def mine(signum: int, frame: object) -> None:
        raise AssertionError("not delivered in this test")

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        _export(tmp_path / "b.pte")
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_sweep_removes_only_its_own_patterns_of_dead_processes(tmp_path: Path) -> None:
    host = _tempfiles._host()
    dead = _dead_pid()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("not ours")
    try:
        for name in (f".pyrt-export-{host}-{dead}-abc12345", f".pyrt-export-{host}-{os.getpid()}-abc",
                     f".pyrt-export-{host}-{live.pid}-abc", f".pyrt-export-otherhost-{dead}-abc",
                     ".pyrt-export-legacy12"):
            (tmp_path / name).mkdir()
            (tmp_path / name / "0.engine").write_bytes(b"E")
        for name in (f".m.pte.{host}-{dead}-x1y2.pte.tmp", f".m.pte.{host}-{live.pid}-x1y2.pte.tmp",
                     ".m.pte.abc123.pte.tmp", f".pyrt-export-{host}-{dead}-afile", "model.pte", ".hidden"):
            (tmp_path / name).write_bytes(b"data")
        (tmp_path / f".pyrt-export-{host}-{dead}-link").symlink_to(outside, target_is_directory=True)
        (tmp_path / f".n.pte.{host}-{dead}-link.pte.tmp").symlink_to(outside / "keep.txt")
        before = set(_others(tmp_path, keep=""))
        removed = _tempfiles.sweep(tmp_path)
        assert sorted(removed) == sorted([f".pyrt-export-{host}-{dead}-abc12345", f".m.pte.{host}-{dead}-x1y2.pte.tmp"])
        assert set(_others(tmp_path, keep="")) == before - set(removed)
        assert (outside / "keep.txt").read_text() == "not ours"
    finally:
        live.kill()
        live.wait()


def test_names_carry_host_and_pid() -> None:
    host = "".join(c for c in socket.gethostname() if c.isalnum())[:32] or "host"
    assert _tempfiles.engine_dir_prefix() == f".pyrt-export-{host}-{os.getpid()}-"
    assert _tempfiles.temp_file_prefix("m.pte") == f".m.pte.{host}-{os.getpid()}-"


# -- bad target paths ------------------------------------------------------------------------------------


def _read_only_dir(tmp_path: Path) -> Path:
    if os.geteuid() == 0:
        pytest.skip("root writes into a mode 0555 directory; /sys covers a directory nobody may write")
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    return d / "m.pte"


@pytest.mark.parametrize("case, match", [
    ("nul", r"contains a NUL byte"),
    ("proc", r"cannot create a working directory in '/proc'"),
    ("sys", r"cannot create a working directory in '/sys'"),
    ("read_only", r"cannot create a working directory in '.*/ro'"),
    ("parent_is_a_file", r"the directory of '.*/file/m.pte' does not exist"),
    ("too_long", r"File name too long"),
    ("directory", r"is a directory"),
])
def test_bad_target_path_is_an_export_error(tmp_path: Path, case: str, match: str) -> None:
    (tmp_path / "file").write_bytes(b"x")
    target = {
        "nul": lambda: str(tmp_path / "m\0.pte"),
        "proc": lambda: "/proc/pyrt-export-test.pte",
        "sys": lambda: "/sys/pyrt-export-test.pte",
        "read_only": lambda: _read_only_dir(tmp_path),
        "parent_is_a_file": lambda: tmp_path / "file" / "m.pte",
        "too_long": lambda: tmp_path / ("m" * 300 + ".pte"),
        "directory": lambda: tmp_path,
    }[case]()
    with pytest.raises(ExportError, match=match):
        _export(target)  # type: ignore[arg-type]
    assert _others(tmp_path, keep="file") in ([], ["ro"])
