"""Nothing outlives ``pyrt serve``: the processes of the Ray it starts are marked, and ended however it stops.

Every process of a local Ray that pyrt starts (GCS, raylet, agents, actors, the replicas,
HAProxy) inherits ``PYRT_SERVE_OWNER=PID:START`` (:data:`OWNER_ENV`, the starting process's
id and start time, so a reused pid is never taken for it). Then:

- a normal stop (Ctrl-C, SIGTERM) drains, shuts Ray down, and ends what is left of the
  marked processes (Ray's dashboard and runtime-env agents have been seen ignoring SIGTERM;
  HAProxy runs in a process group of its own): SIGTERM, then SIGKILL after :data:`GRACE_S`;
- a stop that finds Ray's own processes already gone (systemd's ``KillMode=control-group``
  sends SIGTERM to every process of the service at once) skips the drain instead of
  waiting on a dead GCS; every step is bounded (:func:`shutdown`);
- a watchdog (``python -m pyrt.serve.lifetime TOKEN``, in a session of its own, deaf to
  SIGINT and SIGTERM) ends the marked processes when ``pyrt serve`` dies without stopping
  (SIGKILL, the OOM killer): it waits for its end of a pipe to close;
- each ``pyrt serve`` records its Ray's processes (pid and start time) in a run-state file of
  this user's (:func:`record`, :func:`runs_dir`; refreshed by the watchdog, removed at a normal
  stop), and first ends the processes an earlier one recorded whose owner is gone
  (:func:`end_orphans`), saying so: only those whose pid, start time and mark all still match,
  never a process found by its mark alone (the mark is inherited by whatever they start);
- and a start of Ray whose node timed out in Ray's own fixed wait (a loaded machine) leaves
  nothing either: what it started is ended before Ray is started again (:func:`start_ray`).

Processes are found through ``/proc`` (Linux); elsewhere nothing is found and Ray's own
shutdown is all there is.

>>> owner_token(os.getpid()) == owner_token()
True
>>> alive(owner_token()), alive("1:0")
(True, False)
"""

from __future__ import annotations

import os
import select
import signal
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

T = TypeVar("T")
OWNER_ENV = "PYRT_SERVE_OWNER"
GRACE_S = 5.0  # between SIGTERM and SIGKILL
RECORD_S = 2.0  # how often the watchdog records its owner's processes again
RUN_SUFFIX = ".run"
HEAD = "gcs_server"  # a local Ray's GCS: once it no longer listens (it stops at SIGTERM), nothing can be drained


@dataclass(frozen=True)
class Marked:
    """A process marked with an owner token."""

    pid: int
    owner: str
    name: str


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[19]  # field 22, after the (comm)
    except (OSError, IndexError):
        return None


def owner_token(pid: int | None = None) -> str:
    """``PID:START`` of a process (default: this one); START is its start time in clock ticks since boot."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}:{_start_time(pid) or 0}"


def alive(token: str) -> bool:
    """Whether the process a token names still runs (the same process: its start time matches; not a zombie)."""
    pid, _, start = token.partition(":")
    return pid.isdigit() and _start_time(int(pid)) == start and not _gone(int(pid))


def _owner(pid: int, name: str = OWNER_ENV) -> str | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read()
    except OSError:
        return None
    key = name.encode() + b"="
    for item in env.split(b"\0"):
        if item.startswith(key):
            return item[len(key):].decode("ascii", "replace")
    return None


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return "?"


def marked(owner: str | None = None, key: str = OWNER_ENV) -> list[Marked]:
    """The processes marked with ``owner`` (None: with any owner) in ``$key``, this one left out."""
    found = []
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []
    for pid in pids:
        if pid == os.getpid():
            continue
        token = _owner(pid, key)
        if token is not None and (owner is None or token == owner) and not _gone(pid):  # a zombie has ended
            found.append(Marked(pid, token, _name(pid)))
    return found


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie has ended; its parent reaps it
    except (OSError, IndexError):
        return True


def listens(pid: int) -> bool:
    """Whether a process holds a listening TCP socket (a GCS told to stop closes its port at once)."""
    try:
        inodes = {os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{pid}/fd")}
    except OSError:
        return False
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}", encoding="ascii") as f:
                rows = [line.split() for line in f.readlines()[1:]]
        except OSError:
            continue
        if any(len(r) > 9 and r[3] == "0A" and r[9] in inodes for r in rows):  # 0A: LISTEN
            return True
    return False


def end(processes: Iterable[Marked], grace_s: float = GRACE_S) -> list[Marked]:
    """SIGTERM each process, SIGKILL those still there after ``grace_s``; the ones that needed SIGKILL."""
    procs = list(processes)
    for p in procs:
        _signal(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and not all(_gone(p.pid) for p in procs):
        time.sleep(0.05)
    stubborn = [p for p in procs if not _gone(p.pid)]
    for p in stubborn:
        _signal(p.pid, signal.SIGKILL)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and not all(_gone(p.pid) for p in stubborn):
        time.sleep(0.05)
    return stubborn


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def runs_dir() -> Path | None:
    """This user's folder of run-state files (created 0700; None when it cannot be trusted: not a folder of this
    user's, or open to others): ``$XDG_RUNTIME_DIR/pyrt-serve``, else ``pyrt-serve-UID`` in the temp folder."""
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    folder = Path(base) / ("pyrt-serve" if os.environ.get("XDG_RUNTIME_DIR") else f"pyrt-serve-{os.getuid()}")
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        info = folder.lstat()
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        return None
    return folder


def _run_file(owner: str, runs: Path) -> Path:
    return runs / (owner.replace(":", "-") + RUN_SUFFIX)


def record(owner: str, runs: Path | None = None) -> Path | None:
    """Write ``owner``'s run-state file: its token, then ``PID START`` of each process it marked (None: no folder
    to keep it in). Written whole (a rename), so a reader sees one snapshot or the one before."""
    runs = runs_dir() if runs is None else runs
    if runs is None:
        return None
    lines = [owner] + [f"{p.pid} {_start_time(p.pid)}" for p in marked(owner)]
    target = _run_file(owner, runs)
    part = target.with_suffix(f".{os.getpid()}.part")
    try:
        part.write_text("\n".join(lines) + "\n", encoding="ascii")
        os.replace(part, target)
    except OSError:
        return None
    return target


def forget(owner: str, runs: Path | None = None) -> None:
    """Remove ``owner``'s run-state file (its processes have been ended)."""
    runs = runs_dir() if runs is None else runs
    if runs is not None:
        _run_file(owner, runs).unlink(missing_ok=True)


def _recorded(path: Path) -> tuple[str, list[tuple[int, str]]] | None:
    """A run-state file's owner and (pid, start time) pairs; None for a file that is not one."""
    try:
        owner, *rows = path.read_text(encoding="ascii").split("\n")
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    pairs = [(int(pid), start) for pid, _, start in (r.partition(" ") for r in rows) if pid.isdigit() and start]
    return (owner, pairs) if ":" in owner else None


def _mine(pid: int) -> bool:
    try:
        return os.stat(f"/proc/{pid}").st_uid == os.getuid()
    except OSError:
        return False


def end_orphans(say: Callable[[str], None], runs: Path | None = None) -> list[Marked]:
    """End what an earlier ``pyrt serve`` of this user recorded (:func:`record`) and left when it was killed
    outright (its owner gone, its watchdog too), saying so. A process is ended only when its pid, start time
    (a reused pid has another) and mark still match the record, and it is this user's."""
    runs = runs_dir() if runs is None else runs
    if runs is None:
        return []
    orphans: list[Marked] = []
    for path in sorted(runs.glob("*" + RUN_SUFFIX)):
        found = _recorded(path)
        if found is None or alive(found[0]):
            continue
        owner, pairs = found
        orphans += [Marked(pid, owner, _name(pid)) for pid, start in pairs
                    if pid != os.getpid() and _start_time(pid) == start and not _gone(pid) and _mine(pid)
                    and _owner(pid) == owner]
        path.unlink(missing_ok=True)
    if orphans:
        owners = sorted({p.owner.partition(":")[0] for p in orphans})
        say(f"pyrt serve: ending {len(orphans)} processes left by an earlier pyrt serve (pid {', '.join(owners)}) "
            f"that did not stop: " + ", ".join(f"{p.name} ({p.pid})" for p in orphans))
        end(orphans)
    return orphans


def start_watchdog(owner: str) -> IO[bytes] | None:
    """The watchdog of ``owner``'s processes; keep the returned pipe open while they should live (None: no /proc)."""
    if not os.path.isdir("/proc"):
        return None
    read, write = os.pipe()  # neither end is inherited, but for the read end made the watchdog's stdin
    try:
        os.posix_spawn(sys.executable, [sys.executable, "-m", "pyrt.serve.lifetime", owner], os.environ,
                       file_actions=[(os.POSIX_SPAWN_DUP2, read, 0)], setsid=True)
    finally:
        os.close(read)
    return os.fdopen(write, "wb")


def _bounded(work: Callable[[], Any], seconds: float, until: Callable[[], bool] = lambda: False) -> bool:
    """Run ``work`` on a daemon thread; True when it finished within ``seconds`` (False: gave up, or ``until``)."""
    thread = threading.Thread(target=work, daemon=True, name="pyrt-stop")
    thread.start()
    deadline = time.monotonic() + seconds
    while thread.is_alive() and time.monotonic() < deadline and not until():
        thread.join(0.1)
    return not thread.is_alive()


def shutdown(drain: Callable[[], Any], stop_ray: Callable[[], Any], owner: str | None, drain_s: float,
             say: Callable[[str], None]) -> bool:
    """``drain()`` (while the local Ray lives, at most ``drain_s``), ``stop_ray()`` (at most 30 s), then end the
    processes marked with ``owner``. False when a step was abandoned (its thread may still be stuck in Ray)."""
    def head_gone() -> bool:
        return owner is not None and not any(p.name == HEAD and listens(p.pid) for p in marked(owner))

    drained = not head_gone() and _bounded(drain, drain_s, head_gone)
    if not drained:
        say("pyrt serve: Ray's GCS has stopped (did the signal reach every process of the service?), or the drain "
            f"took over {drain_s:g} s: requests in flight were not drained")
    stopped = _bounded(stop_ray, 3.0 if head_gone() else 30.0)  # without its GCS, Ray's shutdown waits on it
    left = end(marked(owner)) if owner is not None else []
    if left:
        say("pyrt serve: ended what ignored SIGTERM: " + ", ".join(f"{p.name} ({p.pid})" for p in left))
    return drained and stopped


NODE_TIMED_OUT = "The current node timed out during startup"  # Ray 2.60 (ray/_private/node.py), after 30 s
STARTS = 3  # tries at starting a local Ray whose node start-up timed out


def start_ray(init: Callable[[], T], started: Callable[[], list[Marked]], say: Callable[[str], None],
              starts: int = STARTS) -> T:
    """``init()``, a start of a local Ray, made again (``starts`` tries in all) while Ray's node start-up times
    out, after ending what the try left running (``started()``: the processes it marked).

    Ray gives a new node's raylet a fixed 30 s to register with the GCS (a local variable in Ray 2.60's
    ``Node.__init__``), and the raylet itself gives its dashboard agent a fixed 15 s to write its port files
    (``NodeManager::WaitForDashboardAgentPorts``; it aborts after that, and ``RAY_agent_register_timeout_ms``
    does not reach it: measured). That agent is a Python process that imports every dashboard module, slower
    than that on 2 cores at load 15+. Ray then raises, and the GCS, agents and reaper it started go on
    running. Only that error is tried again, and only where processes can be found (``/proc``); any other
    error, and the last try's, is raised as it is.

    >>> start_ray(lambda: "up", list, print)
    'up'
    """
    tries = 1
    while True:
        try:
            return init()
        except Exception as exc:
            if NODE_TIMED_OUT not in str(exc) or tries >= starts or not os.path.isdir("/proc"):
                raise
        left = started()
        end(left)
        tries += 1
        ended = ", ".join(f"{p.name} {p.pid}" for p in left) or "nothing was left"
        say(f"Ray's node did not start within Ray's fixed 30 s (a loaded machine?): ended what it had started "
            f"({ended}); starting Ray again, try {tries} of {starts}")


def _watch(owner: str) -> None:
    """The watchdog's body: until the pipe closes (its owner stopped or died), record its owner's processes every
    :data:`RECORD_S` (replicas start and restart); then end what is left and forget the record."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    try:
        while not select.select([sys.stdin], [], [], RECORD_S)[0]:
            record(owner)
        sys.stdin.buffer.read()
    except OSError:
        pass
    end(marked(owner))  # its owner has ended them already when it stopped normally
    forget(owner)


if __name__ == "__main__":
    _watch(sys.argv[1])
