"""Atomic file writes: a temporary file beside the target, fsync, rename.

Each output is written to a temporary file in the target's directory (runs of
zeros become holes: :mod:`pyrt.export._files.sparse_file`), flushed, fsynced and renamed
over the target: an interrupted export never leaves a partial file at
``path``, and an existing file there survives a failure. With several outputs
(a .pte and its .ptd), all temporary files are complete before any is renamed.
The temporary file is named after its process, so the next export removes it if
that process was killed before it could (:mod:`pyrt.export._files.tempfiles`).
Nothing here imports torch or ExecuTorch.

>>> import os, tempfile
>>> target = os.path.join(tempfile.mkdtemp(), "x.bin")
>>> atomic_write_all([(target, lambda f: f.write(b"ok"))])
[2]
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from pyrt.errors import ExportError
from pyrt.export._files.sparse_file import HoleWriter
from pyrt.export._files.tempfiles import temp_file_prefix


def atomic_write_all(outputs: list[tuple[str | Path, Callable[[BinaryIO], Any]]]) -> list[int]:
    """Write every file to a temp file (zero runs as holes) and fsync it; only then rename each, in order.

    ``write(f)`` gets a write-only file. Returns the final sizes. On any failure no target changes.
    Failing to create a temporary file or to rename it over its target is an ExportError naming
    the path; errors of ``write`` itself pass through. Temporary files are named after their
    process, so the next export removes them if that process was killed first.
    """
    temps: list[tuple[Path, str]] = []
    try:
        for path, write in outputs:
            target = Path(path)
            try:
                fd, tmp = tempfile.mkstemp(prefix=temp_file_prefix(target.name), suffix=f"{target.suffix}.tmp",
                                           dir=target.parent)
            except (OSError, ValueError) as exc:
                raise ExportError(f"cannot create a file next to {str(target)!r}: "
                                  f"{getattr(exc, 'strerror', None) or exc}") from None
            temps.append((target, tmp))
            with os.fdopen(fd, "wb") as f:
                sink = HoleWriter(f)
                write(sink)  # type: ignore[arg-type]  # HoleWriter is write-only, which is all writers use
                sink.finish()
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, _file_mode(target))
        for target, tmp in temps:
            try:
                os.replace(tmp, target)
            except OSError as exc:
                raise ExportError(f"cannot replace {str(target)!r}: {exc.strerror or exc}") from None
    except BaseException:
        for _, tmp in temps:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise
    for directory in {target.parent for target, _ in temps}:
        _fsync_dir(directory)
    return [target.stat().st_size for target, _ in temps]


def _file_mode(target: Path) -> int:
    try:
        return target.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _fsync_dir(directory: Path) -> None:
    if not hasattr(os, "O_DIRECTORY"):
        return
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

