"""``pyrt serve`` stops however it is told to, and nothing of it outlives it (checked through /proc).

Each test starts ``pyrt serve`` in a session of its own (so a signal to its process group
reaches it and its local Ray, not pytest), stops it one way, then checks: it exited, the
port is free, and no process marked as its own (``PYRT_SERVE_OWNER``, :mod:`pyrt.serve.lifetime`)
is left. While it serves, its HAProxy listens only on ``--host``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyrt.serve import ingress, lifetime
from tests.fixtures.serve import build, free_port, wait_for

pytest.importorskip("ray.serve")
pytest.importorskip("executorch")
requests = pytest.importorskip("requests")
if not os.path.isdir("/proc"):
    pytest.skip("processes are checked through /proc (Linux)", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
EXIT_S = 60  # the bound this suite holds a stop to (a whole-group SIGTERM used to take 62 s and abort)


@pytest.fixture(scope="module")
def dyn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("stop"))["dyn"]


class Server:
    """One ``pyrt serve`` in its own session, its output in a file."""

    def __init__(self, path: Path, log: Path, *flags: str) -> None:
        self.port, self.log = free_port(), log
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYRT_SIMULATED_GPUS": "1"}
        with open(log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "pyrt", "serve", str(path), "--port", str(self.port),
                                          "--cpus-per-replica", "0.5", *flags], env=env, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.owner = lifetime.owner_token(self.proc.pid)

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"pyrt serve exited with {self.proc.returncode}:\n{self.output()[-3000:]}")
        if "Ctrl-C or SIGTERM drains and stops" not in self.output():  # printed once Ray Serve said it runs
            return False
        return requests.get(f"http://127.0.0.1:{self.port}/v2/health/ready", timeout=30).status_code == 200

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def marked(self) -> list[lifetime.Marked]:
        return lifetime.marked(self.owner)

    def wait_exit(self) -> int:
        try:
            return self.proc.wait(EXIT_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"pyrt serve still runs {EXIT_S} s after it was told to stop:\n"
                                 f"{self.output()[-3000:]}") from None

    def kill_everything(self) -> None:
        """After a failed test: end what is left (its marked processes, then itself)."""
        lifetime.end(self.marked(), grace_s=2)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def server(dyn: Path, tmp_path: Path) -> Iterator[Any]:
    made: list[Server] = []

    def start(*flags: str) -> Server:
        made.append(Server(dyn, tmp_path / f"serve{len(made)}.log", *flags))
        wait_for(made[-1].ready, 300, "pyrt serve ready")
        return made[-1]

    yield start
    for s in made:
        s.kill_everything()


def listeners(pid: int) -> list[tuple[str, int]]:
    """(address, port) of a process's listening TCP sockets."""
    try:
        inodes = {os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{pid}/fd")}
    except OSError:
        return []
    out = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}", encoding="ascii") as f:
            for row in (line.split() for line in f.readlines()[1:]):
                if row[3] == "0A" and row[9] in inodes:
                    address, port = row[1].split(":")
                    out.append((address, int(port, 16)))
    return out


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def assert_nothing_left(s: Server) -> None:
    wait_for(lambda: port_free(s.port), 15, f"port {s.port} free")
    wait_for(lambda: not s.marked(), 30, f"no process of pyrt serve {s.proc.pid} left (left: {s.marked()})")


def test_haproxy_listens_only_on_host_and_a_sigterm_to_the_whole_group_stops_it_at_once(server: Any) -> None:
    """systemd's ``KillMode=control-group`` (``systemctl stop``): SIGTERM to every process of the service at once.
    Ray's GCS stops with it, so nothing can be drained; pyrt serve says so and exits 0 instead of waiting 60 s
    on the GCS and aborting. Meanwhile: HAProxy's serve port and both side ports listen on 127.0.0.1 only."""
    s = server()
    if ingress.haproxy_binary() is not None:
        haproxies = [p for p in s.marked() if p.name == "haproxy"]
        bound = [address for p in haproxies for address, _ in listeners(p.pid)]
        assert len(bound) >= 3 and set(bound) == {"0100007F"}, bound  # 127.0.0.1 in /proc's byte order
    os.killpg(s.proc.pid, signal.SIGTERM)
    assert s.wait_exit() == 0
    assert "Ray's GCS has stopped" in s.output()
    assert_nothing_left(s)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT to the group"])
def test_a_normal_stop_leaves_no_process_and_frees_the_port(server: Any, how: str) -> None:
    """SIGTERM to its pid, Ctrl-C (SIGINT to the terminal's process group): drains, exits 0, nothing left."""
    s = server()
    if how == "SIGTERM":
        s.proc.send_signal(signal.SIGTERM)
    else:
        os.killpg(s.proc.pid, signal.SIGINT)
    assert s.wait_exit() == 0
    assert "draining requests in flight" in s.output() and "not drained" not in s.output()
    assert_nothing_left(s)


@pytest.mark.slow
def test_after_sigkill_its_watchdog_ends_its_ray(server: Any) -> None:
    s = server()
    s.proc.kill()
    s.proc.wait()
    assert s.marked()  # Ray's processes outlive a SIGKILLed driver (they are not its process group's)...
    assert_nothing_left(s)  # ... until the watchdog, whose pipe closed, ends them


@pytest.mark.slow
def test_the_next_pyrt_serve_ends_what_a_killed_one_left(server: Any, tmp_path: Path) -> None:
    """pyrt serve and its watchdog both SIGKILLed: the next pyrt serve (here one given a bad file) ends the leftovers
    and says so."""
    s = server()
    watchdogs = []  # the watchdog carries no mark: found by its command line
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().split(b"\0")[-3:-1] == [b"pyrt.serve.lifetime", s.owner.encode()]:
                    os.kill(pid, signal.SIGKILL)
                    watchdogs.append(pid)
        except OSError:
            continue
    assert len(watchdogs) == 1
    s.proc.kill()
    s.proc.wait()
    assert s.marked()
    bad = tmp_path / "bad.pte"
    bad.write_bytes(b"not a program")
    done = subprocess.run([sys.executable, "-m", "pyrt", "serve", str(bad)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert done.returncode == 1
    assert f"left by an earlier pyrt serve (pid {s.proc.pid})" in done.stderr, done.stderr
    assert_nothing_left(s)
