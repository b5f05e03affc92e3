"""Read-only file mappings: map a file once, hand out memoryviews, drop pages already consumed.

:func:`map_file` is the one way pyrt opens a file it reads (a .pte, a .ptd): only a regular
file, never blocking on a FIFO, mapped read-only or (``private=True``, ``mmap=False`` to
the user) read into private memory.

Pages of a mapping that the process has touched count towards its RSS until it
unmaps them. :func:`release_pages` lets the kernel drop the pages of a view that
lies in a read-only mapping made by :func:`map_file` (they stay in the page cache
and come back on the next access), so streaming a 20 GiB engine out of a .pte
costs one chunk of resident memory, not 20 GiB. Views over anything else (bytes,
a writable buffer) are left alone.

>>> import tempfile
>>> with tempfile.NamedTemporaryFile() as f:
...     _ = f.write(b"x" * 3 * _PAGE); f.flush()
...     mm, view = map_file(f.name, "demo file")
...     chunk = view[_PAGE : 2 * _PAGE]
...     data = bytes(chunk[:3]); release_pages(chunk), data, bytes(chunk[:3])   # the bytes come back on access
(True, b'xxx', b'xxx')
>>> chunk.release(); view.release(); unmap(mm)
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
import threading

from pyrt.errors import PteFormatError, PyrtError, ResourceError
from pyrt.format.limits import allocating, check_host_memory

_PAGE = mmap.PAGESIZE
_lock = threading.Lock()
_maps: dict[int, mmap.mmap] = {}  # base address -> read-only mapping made by map_file


def map_file(path: str, what: str, *, error: type[PyrtError] = PteFormatError,
             private: bool = False) -> tuple[mmap.mmap | None, memoryview]:
    """Map ``path`` read-only; a missing, empty, unreadable or non-regular file raises ``error`` naming ``what``.

    Opening never blocks: the path is checked before it is opened (a FIFO would wait for a
    writer) and opened non-blocking, then checked again. ``private``: read the file into
    private memory instead (its size checked against :mod:`pyrt.format.limits` first; the
    mapping returned is then None). A mapping the address space cannot hold is a
    :class:`~pyrt.errors.ResourceError`, not a bad file.
    """
    if "\0" in path:
        raise error(f"{path!r}: not a usable path for a {what}: it contains a NUL byte")
    try:
        _require_regular(path, os.stat(path), what, error)  # before open: opening a FIFO blocks until a writer comes
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_BINARY", 0))  # no buffered file object
    except OSError as exc:
        raise error(f"{path}: cannot open {what}: {exc.strerror or exc}") from exc
    try:
        info = os.fstat(fd)
        _require_regular(path, info, what, error)  # the path may have been swapped since the stat
        if info.st_size == 0:
            raise error(f"{path}: {what} is empty (0 bytes)")
        if private:
            return None, _read_private(fd, path, info.st_size, error)
        mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    except OSError as exc:
        if exc.errno == errno.ENOMEM:  # the address space is full (RLIMIT_AS): a resource, not a bad file
            raise ResourceError(f"{path}: cannot map the file ({exc.strerror}): over the process's address-space "
                                f"limit or out of memory") from exc
        raise error(f"{path}: cannot {'read' if private else 'map'} {what}: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    register(mm)
    return mm, memoryview(mm)


def _read_private(fd: int, path: str, size: int, error: type[PyrtError] = PteFormatError) -> memoryview:
    """The file's ``size`` bytes in a private buffer (a read-only view of it); never mapped."""
    check_host_memory(path, [("reading the file into memory (mmap=False)", size)])
    with allocating(f"{path}: reading the file into private memory (mmap=False, {size} bytes)"):
        buf = memoryview(bytearray(size))
    got = 0
    while got < size:
        n = os.readv(fd, [buf[got:]])
        if n == 0:
            raise error(f"{path}: the file shrank to {got} bytes while being read ({size} expected)")
        got += n
    return buf.toreadonly()


_FILE_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _require_regular(path: str, info: os.stat_result, what: str, error: type[PyrtError]) -> None:
    if stat.S_ISREG(info.st_mode):
        return
    kind = next((name for test, name in _FILE_KINDS if test(info.st_mode)), "not a regular file")
    raise error(f"{path}: cannot open: it is {kind}; a {what} must be a regular file")


def register(mm: mmap.mmap) -> None:
    """Let :func:`release_pages` drop pages of a read-only mapping made elsewhere (forget it with :func:`unmap`)."""
    with _lock:
        _maps[_address(mm)] = mm


def unmap(mm: mmap.mmap | None) -> None:
    """Forget and close a mapping from :func:`map_file` (it closes later if views are still held; None: none)."""
    if mm is None:
        return
    with _lock:
        for base, known in list(_maps.items()):
            if known is mm:
                del _maps[base]
    try:
        mm.close()
    except BufferError:
        pass  # a caller still holds a view; the mapping closes when it is released


def release_pages(view: memoryview) -> bool:
    """Drop the whole pages of ``view`` from this process if it lies in a :func:`map_file` mapping.

    Returns whether anything was released. Safe on any view: other memory is never touched.
    """
    if view.nbytes < _PAGE or not hasattr(mmap, "MADV_DONTNEED"):
        return False
    start = _address(view)
    with _lock:
        for base, mm in _maps.items():
            if base <= start and start + view.nbytes <= base + len(mm):
                first = -(-(start - base) // _PAGE) * _PAGE  # whole pages only: neighbours keep theirs
                last = (start - base + view.nbytes) // _PAGE * _PAGE
                if last > first:
                    mm.madvise(mmap.MADV_DONTNEED, first, last - first)
                    return True
                return False
    return False


def _address(buffer: object) -> int:
    import numpy as np

    return int(np.frombuffer(buffer, dtype=np.uint8).ctypes.data)  # type: ignore[call-overload]
