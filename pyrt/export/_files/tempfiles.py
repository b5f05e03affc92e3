"""Export's temporary files: named after their owner, swept once the owner is gone, removed on SIGTERM.

An export keeps a working directory of engine files (``.pyrt-export-HOST-PID-XXXX``)
and writes the .pte through a temporary file (``.NAME.HOST-PID-XXXX.pte.tmp``),
both next to the target. A process killed outright (SIGKILL, a crash, power
loss) cannot remove them, so the next export in that directory does
(:func:`sweep`): only entries matching these two patterns exactly, made on
this host, whose process no longer exists, and never through a symlink.
Names without a host and pid (pyrt before this scheme) are never touched.

SIGTERM normally ends Python without running ``finally`` blocks; while an
export runs in the main thread with SIGTERM at its default action,
:func:`sigterm_cleans` turns it into an exception so the same cleanup as for
Ctrl-C runs, then delivers SIGTERM again so the process still ends by it.

>>> import re
>>> bool(re.fullmatch(_DIR, engine_dir_prefix() + "abc_123"))
True
>>> bool(re.fullmatch(_FILE, temp_file_prefix("model.pte") + "x1y2.pte.tmp"))
True
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger("pyrt.export")

_DIR = r"\.pyrt-export-(?P<host>[A-Za-z0-9]+)-(?P<pid>\d+)-[A-Za-z0-9_]+"
_FILE = r"\..+\.(?P<host>[A-Za-z0-9]+)-(?P<pid>\d+)-[A-Za-z0-9_]+\.(?:pte|ptd|bin)\.tmp"


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9]", "", socket.gethostname())[:32] or "host"


def _owner() -> str:
    return f"{_host()}-{os.getpid()}"  # read at each call: a forked child is its own owner


def engine_dir_prefix() -> str:
    """Prefix of an export's working directory (``tempfile.mkdtemp(prefix=...)`` adds the random tail)."""
    return f".pyrt-export-{_owner()}-"


def temp_file_prefix(target_name: str) -> str:
    """Prefix of the temporary file a .pte named ``target_name`` is written to (suffix ``.pte.tmp``)."""
    return f".{target_name}.{_owner()}-"


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, under another user
        return True
    return True


def sweep(directory: str | Path) -> list[str]:
    """Remove the temporary files and directories of dead exports from ``directory``; return their names."""
    host = _host()
    removed: list[str] = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        for pattern, want_dir in ((_DIR, True), (_FILE, False)):
            m = re.fullmatch(pattern, entry.name)
            if m is None or m["host"] != host or _alive(int(m["pid"])):
                continue
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
                if want_dir and stat.S_ISDIR(mode):
                    shutil.rmtree(entry.path)
                elif not want_dir and stat.S_ISREG(mode):
                    os.unlink(entry.path)
                else:
                    continue
            except OSError as exc:
                log.debug("could not remove %s: %s", entry.path, exc)
                continue
            log.info("removed %s, left by export process %s that no longer runs", entry.path, m["pid"])
            removed.append(entry.name)
            break
    return removed


class Terminated(BaseException):
    """SIGTERM arrived while an export ran (a BaseException: cleanup handlers re-raise it)."""


@contextlib.contextmanager
def sigterm_cleans() -> Iterator[None]:
    """While the block runs, SIGTERM raises :class:`Terminated`; after cleanup the signal is delivered again."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield  # someone else owns SIGTERM (or signals cannot be set here): leave it alone
        return

    def handler(signum: int, frame: object) -> None:
        raise Terminated("SIGTERM during export")

    signal.signal(signal.SIGTERM, handler)
    terminated = False
    try:
        yield
    except Terminated:
        terminated = True
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if terminated:
        log.info("export interrupted by SIGTERM; temporary files removed")
        signal.raise_signal(signal.SIGTERM)


__all__ = ["engine_dir_prefix", "temp_file_prefix", "sweep", "sigterm_cleans", "Terminated"]
