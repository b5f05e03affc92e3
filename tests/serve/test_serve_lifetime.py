"""pyrt.serve.lifetime's parts on real processes: marks, owners that are gone, an end for what ignores SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pyrt.serve import lifetime
from tests.fixtures.serve import wait_for
from tests.fixtures.serve_process import spawn_marked

if not os.path.isdir("/proc"):
    pytest.skip("processes are found through /proc (Linux)", allow_module_level=True)

@pytest.fixture
def owner() -> Iterator[str]:
    """The mark of a live stand-in owner: not this process's, which the serving tests' local Ray carries."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        yield lifetime.owner_token(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def test_marked_processes_that_ignore_sigterm_are_ended_with_sigkill(owner: str) -> None:
    procs = [spawn_marked(owner), spawn_marked(owner)]
    try:
        found = lifetime.marked(owner)
        assert sorted(p.pid for p in found) == sorted(p.pid for p in procs)
        assert sorted(p.pid for p in lifetime.end(found, grace_s=0.5)) == sorted(p.pid for p in procs)
        assert [p.wait(60) for p in procs] == [-9, -9] and not lifetime.marked(owner)
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _dead_owner() -> str:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    token = f"{gone.pid}:{lifetime.owner_token(os.getpid()).split(':')[1]}"  # its pid, not its start time
    assert not lifetime.alive(token)
    return token


def _write_record(runs: Path, owner: str, rows: list[str]) -> Path:
    path = runs / (owner.replace(":", "-") + lifetime.RUN_SUFFIX)
    path.write_text("\n".join([owner, *rows]) + "\n", encoding="ascii")
    return path


def test_recorded_orphans_of_a_dead_owner_are_ended_and_named_and_a_live_owner_s_are_not(owner: str,
                                                                                          tmp_path: Path) -> None:
    dead = _dead_owner()
    orphan, kept = spawn_marked(dead), spawn_marked(owner)
    said: list[str] = []
    try:
        dead_record = _write_record(tmp_path, dead, [f"{orphan.pid} {lifetime._start_time(orphan.pid)}"])
        live_record = lifetime.record(owner, tmp_path)
        assert live_record is not None and f"{kept.pid} " in live_record.read_text()
        ended = lifetime.end_orphans(said.append, tmp_path)
        assert [p.pid for p in ended] == [orphan.pid]
        assert orphan.wait(60) == -9 and kept.poll() is None
        assert f"(pid {dead.split(':')[0]})" in said[0] and f"({orphan.pid})" in said[0]
        assert not dead_record.exists() and live_record.exists()  # a dead owner's record is done with
        lifetime.forget(owner, tmp_path)
        assert not live_record.exists()
    finally:
        for p in (orphan, kept):
            p.kill()
            p.wait()


def test_a_decoy_with_the_mark_of_a_dead_owner_survives_a_start(tmp_path: Path) -> None:
    """The mark alone proves nothing (any process can carry it; whatever a replica starts inherits it): a process
    not recorded, or recorded with another start time (a reused pid), or marked for another owner, is left alone."""
    dead = _dead_owner()
    decoy, reused, other = spawn_marked(dead), spawn_marked(dead), spawn_marked(_dead_owner())
    said: list[str] = []
    try:
        _write_record(tmp_path, dead, [f"{reused.pid} 1", f"{other.pid} {lifetime._start_time(other.pid)}"])
        assert lifetime.end_orphans(said.append, tmp_path) == [] and said == []
        assert [p.poll() for p in (decoy, reused, other)] == [None, None, None]
    finally:
        for p in (decoy, reused, other):
            p.kill()
            p.wait()


def test_the_run_state_folder_is_this_user_s_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    runs = lifetime.runs_dir()
    assert runs == tmp_path / "pyrt-serve" and (runs.stat().st_mode & 0o777) == 0o700
    runs.chmod(0o755)  # open to others: not trusted, nothing recorded or ended from it
    assert lifetime.runs_dir() is None and lifetime.record(lifetime.owner_token()) is None


def test_the_watchdog_ends_its_owner_s_processes_when_its_pipe_closes(owner: str) -> None:
    proc = spawn_marked(owner)
    try:
        pipe = lifetime.start_watchdog(owner)
        assert pipe is not None and proc.poll() is None
        pipe.close()  # as when pyrt serve exits, however
        assert proc.wait(60) == -9
    finally:
        proc.kill()
        proc.wait()
    wait_for(lambda: not lifetime.marked(owner), 30, "nothing marked left")


def test_the_watchdog_records_its_owner_s_processes_and_forgets_them_when_it_ends(
        owner: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    record = tmp_path / "pyrt-serve" / (owner.replace(":", "-") + lifetime.RUN_SUFFIX)
    proc = spawn_marked(owner)
    try:
        pipe = lifetime.start_watchdog(owner)
        assert pipe is not None
        wait_for(lambda: record.exists() and f"{proc.pid} " in record.read_text(), 60, "the watchdog's record")
        pipe.close()
        assert proc.wait(60) == -9
        wait_for(lambda: not record.exists(), 30, "the record forgotten")
    finally:
        proc.kill()
        proc.wait()


def _marked_sleeper(owner: str) -> subprocess.Popen[bytes]:
    """A process marked as ``owner``'s that ends at SIGTERM: a stand-in for what a half-started Ray node leaves."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                            env={**os.environ, lifetime.OWNER_ENV: owner})


def test_a_start_whose_node_timed_out_is_made_again_after_what_it_left_is_ended(owner: str) -> None:
    left: list[subprocess.Popen[bytes]] = []

    def init() -> str:
        if len(left) < 2:
            left.append(_marked_sleeper(owner))
            raise Exception(f"{lifetime.NODE_TIMED_OUT}. This could happen because some of the raylet failed")
        return "up"

    said: list[str] = []
    try:
        assert lifetime.start_ray(init, lambda: lifetime.marked(owner), said.append) == "up"
        assert [p.wait(60) for p in left] == [-signal.SIGTERM] * 2 and not lifetime.marked(owner)
        assert all(f" {p.pid})" in line for p, line in zip(left, said, strict=True)), said  # what each try left
        assert "try 2 of 3" in said[0] and "try 3 of 3" in said[1]
    finally:
        for p in left:
            p.kill()
            p.wait()


def test_other_start_errors_and_the_last_timeout_are_raised_as_they_are(owner: str) -> None:
    calls: list[str] = []

    def failing(error: Exception) -> Callable[[], str]:
        def init() -> str:
            calls.append(str(error))
            raise error
        return init

    with pytest.raises(ValueError, match="num_cpus"):
        lifetime.start_ray(failing(ValueError("num_cpus must be >= 0")), list, calls.append)
    assert calls == ["num_cpus must be >= 0"]  # tried once, nothing ended or said
    calls.clear()
    timed_out = Exception(lifetime.NODE_TIMED_OUT)
    with pytest.raises(Exception, match=lifetime.NODE_TIMED_OUT):
        lifetime.start_ray(failing(timed_out), list, lambda line: None, starts=2)
    assert calls == [str(timed_out)] * 2
