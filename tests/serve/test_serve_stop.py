"""``pyrt serve`` stops however it is told to, and nothing of it outlives it (checked through /proc).

Each test starts ``pyrt serve`` in a session of its own (so a signal to its process group
reaches it and its local Ray, not pytest), stops it one way, then checks: it exited, the
port is free, and no process marked as its own (``PYRT_SERVE_OWNER``, :mod:`pyrt.serve.lifetime`)
is left. While it serves, its HAProxy listens only on ``--host``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyrt.serve import ingress, lifetime
from tests.fixtures.serve import build, free_port, wait_for
from tests.fixtures.serve_process import ROOT, Server, listeners, port_free, spawn_marked

pytest.importorskip("ray.serve")
pytest.importorskip("executorch")

pytestmark = [pytest.mark.ray]
requests = pytest.importorskip("requests")
if not os.path.isdir("/proc"):
    pytest.skip("processes are checked through /proc (Linux)", allow_module_level=True)

@pytest.fixture(scope="module")
def dyn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("stop"))["dyn"]


@pytest.fixture
def server(dyn: Path, tmp_path: Path) -> Iterator[Any]:
    made: list[Server] = []

    def start(*flags: str) -> Server:
        made.append(Server(dyn, tmp_path / f"serve{len(made)}.log", "--cpus-per-replica", "0.5", *flags))
        return made[-1].wait_ready()

    yield start
    for s in made:
        s.stop()


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


def test_a_proxy_slower_than_serve_start_s_60_s_is_waited_for(dyn: Path, tmp_path: Path) -> None:
    """On busy cores Ray's proxies can take longer than ``serve.start``'s fixed 60 s (seen: two busy loops beside
    the suite), and it raised TimeoutError though they were still coming up. Here it gives up at once (its limit
    set to 0 in the server's process); pyrt serve waits for the proxies itself, then serves."""
    s = Server(dyn, tmp_path / "serve.log", "--cpus-per-replica", "0.5",
               prelude="import ray.serve._private.api as api\napi.HTTP_PROXY_TIMEOUT = 0")
    try:
        s.wait_ready()
        assert "not ready within Ray's 60 s; waiting" in s.output()
        assert requests.get(f"{s.base}/v2", timeout=30).json()["name"] == "pyrt"
    finally:
        s.stop()
    assert_nothing_left(s)


# On the path of every process of the server: the first dashboard agent Ray starts sleeps past the 30 s Ray's
# node start gives its raylet, which waits for that agent (as a loaded machine's slow Python start-up does)
SLOW_FIRST_AGENT = """import os, sys, time
if sys.argv and sys.argv[0].endswith(os.path.join("dashboard", "agent.py")):
    marker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "slowed")
    if not os.path.exists(marker):
        open(marker, "w").close()
        time.sleep(600)
"""


@pytest.mark.slow
def test_a_start_whose_node_timed_out_is_ended_and_made_again(dyn: Path, tmp_path: Path) -> None:
    """Ray's node start-up times out for real ("The current node timed out during startup", after Ray's fixed 30 s):
    pyrt serve ends what that start left (its GCS, agents, reaper), starts Ray again and serves."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SLOW_FIRST_AGENT)
    s = Server(dyn, tmp_path / "serve.log", "--cpus-per-replica", "0.5",
               env={"PYTHONPATH": os.pathsep.join((str(hook), str(ROOT)))})
    try:
        s.wait_ready()
        said = re.search(r"Ray's node did not start within Ray's fixed 30 s .*?: ended what it had started \((.+?)\); "
                         r"starting Ray again, try 2 of 3", s.output())
        assert said is not None and (hook / "slowed").exists(), s.output()[-3000:]
        first = {int(pid) for pid in re.findall(r"(\d+)(?:, |$)", said.group(1))}
        assert first and not first & {p.pid for p in s.marked()}, (first, s.marked())  # none of them is left
        assert requests.get(f"{s.base}/v2", timeout=30).json()["name"] == "pyrt"
    finally:
        s.stop()
    assert_nothing_left(s)


def test_sigint_stops_it_though_it_was_started_with_sigint_ignored(dyn: Path, tmp_path: Path) -> None:
    """D4: a background job of a script (``pyrt serve ... &``) inherits SIGINT ignored; ``kill -INT`` still drains
    and stops it, as SIGTERM does (the process's SIGINT disposition set to ignored before pyrt starts)."""
    s = Server(dyn, tmp_path / "serve.log", "--cpus-per-replica", "0.5",
               prelude="import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)")
    try:
        s.wait_ready()
        s.proc.send_signal(signal.SIGINT)
        assert s.wait_exit() == 0
        assert "draining requests in flight" in s.output()
    finally:
        s.stop()
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
    its run-state file records, and says so; a process carrying the mark that it did not record is left alone."""
    s = server()
    # Ray's own processes may end by themselves once their raylet is gone (how soon depends on the machine's
    # load); a process that does not stands beside them, as HAProxy in its own process group does, recorded by the
    # watchdog (it records its owner's processes every few seconds)
    stubborn = spawn_marked(s.owner)
    runs = lifetime.runs_dir()
    assert runs is not None
    record = runs / (s.owner.replace(":", "-") + lifetime.RUN_SUFFIX)
    wait_for(lambda: record.exists() and f"\n{stubborn.pid} " in record.read_text(), 60, "the stand-in recorded")
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
    decoy = spawn_marked(s.owner)  # the mark alone: not recorded, so not ended
    bad = tmp_path / "bad.pte"
    bad.write_bytes(b"not a program")
    done = subprocess.run([sys.executable, "-m", "pyrt", "serve", str(bad), "--port", str(free_port())],
                          capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert done.returncode == 1
    # the earlier servers it names: this test's, and on a loaded machine one whose own watchdog is still at work
    named = re.search(r"left by an earlier pyrt serve \(pid ([\d, ]+)\)", done.stderr)
    assert named is not None and str(s.proc.pid) in named.group(1).split(", "), done.stderr
    assert f"({stubborn.pid})" in done.stderr and stubborn.wait(30) == -signal.SIGKILL, done.stderr
    assert f"({decoy.pid})" not in done.stderr and decoy.poll() is None
    decoy.kill()
    decoy.wait()
    assert_nothing_left(s)


def test_a_clean_start_and_stop_log_only_pyrt_s_lines(server: Any) -> None:
    """Ray's and Serve's INFO lines, colours and a stop's "graceful_shutdown failed" stay out of a redirected log
    (issue 46); --verbose shows Ray's own lines."""
    s = server()
    s.proc.send_signal(signal.SIGTERM)
    assert s.wait_exit() == 0
    lines = [line for line in s.output().splitlines() if line.strip()]
    assert "\x1b[" not in s.output() and not any("graceful_shutdown" in line for line in lines), s.output()
    assert all(line.startswith("pyrt serve: ") for line in lines), s.output()


LOOPBACK = {"0100007F", "0000000000000000FFFF00000100007F", "00000000000000000000000001000000"}  # /proc/net's hex


def test_with_host_127_0_0_1_nothing_of_its_ray_listens_beyond_the_loopback(server: Any) -> None:
    """GCS, raylet, the dashboard and runtime-env agents, the driver, the controller, HAProxy and the replica
    (Ray Serve's inter-deployment gRPC server included: Ray puts it on ``[::]:0``, :mod:`pyrt.serve.replica_grpc`
    keeps it on the loopback): every listening socket of pyrt serve's process tree, as ``ss -ltnp`` lists them, is
    on 127.0.0.1 (issue 46: on 0.0.0.0)."""
    s = server("--host", "127.0.0.1")
    pids = [s.proc.pid, *(p.pid for p in s.marked())]
    sockets = [(pid, address, port) for pid in pids for address, port in listeners(pid)]
    assert len({pid for pid, _, _ in sockets}) >= 3, sockets  # the driver, the GCS, the raylet at least
    names = {lifetime._name(pid) for pid, _, _ in sockets}
    assert "ray::ServeRepli" in names, names  # the replica's own listener was looked at
    beyond = [(lifetime._name(pid), address, port) for pid, address, port in sockets if address not in LOOPBACK]
    assert beyond == [], beyond
