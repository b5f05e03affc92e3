"""Drop the file pages an engine build read: a checkpoint's weights leave the process once they are in an engine.

A checkpoint's weights are memory-mapped from its shards (transformers maps safetensors copy-on-write), so the
pages a build touches are file pages: they count in the process's RSS until the kernel needs the memory, and a
13B checkpoint's 26 GB would all end up mapped in. After each engine is built, :func:`release_file_pages` tells
the kernel (``madvise(MADV_DONTNEED)``) that the pages of its weights are not needed; touched again, they are read
back from the file. Only pages that cannot lose a byte are released: those of shared file mappings, and those of
private (copy-on-write) file mappings that are still the file's own page (``/proc/self/pagemap``: present and a
file page, or absent and not swapped). A page something wrote to is anonymous memory, never released; so is all
other anonymous memory. Elsewhere than Linux nothing is released.

>>> import torch
>>> release_file_pages([torch.zeros(1024)])   # anonymous memory: left alone
0
"""

from __future__ import annotations

import ctypes
import io
import logging
import mmap
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

log = logging.getLogger("pyrt.export")
_PAGE = mmap.PAGESIZE
_MADV_DONTNEED = 4  # Linux
_PRESENT, _SWAPPED, _FILE = 1 << 63, 1 << 62, 1 << 61  # /proc/PID/pagemap entry bits


@dataclass(frozen=True)
class FileSpan:
    """One file mapping of this process: ``[start, end)``, whether it is private (copy-on-write), the file."""

    start: int
    end: int
    private: bool
    path: str


def file_spans(maps: str = "/proc/self/maps") -> list[FileSpan]:
    """This process's mappings of files (anonymous memory, ``[heap]`` and the like left out); [] without
    ``/proc``."""
    spans = []
    try:
        with open(maps) as fh:
            for line in fh:
                fields = line.split(maxsplit=5)
                if len(fields) < 6 or not fields[5].startswith("/"):
                    continue
                lo, hi = fields[0].split("-")
                spans.append(FileSpan(int(lo, 16), int(hi, 16), fields[1].endswith("p"), fields[5].rstrip("\n")))
    except OSError:
        return []
    return spans


def release_file_pages(tensors: Iterable[object]) -> int:
    """Drop the pages of ``tensors`` that are a file's own (see the module); returns the bytes advised away
    (whatever of them was resident; anything that is not a CPU tensor is skipped).

    A page a tensor shares with a neighbour is released too: it comes back from the file when touched.
    """
    spans = file_spans()
    libc = _libc() if spans else None
    if libc is None:
        return 0
    runs: list[tuple[int, int]] = []
    with _Pagemap() as pagemap:
        for lo, hi in _extents(tensors):
            for span in spans:
                first = max(lo, span.start) // _PAGE * _PAGE
                last = min(-(-min(hi, span.end) // _PAGE) * _PAGE, span.end)
                if last > first:
                    runs.extend(pagemap.safe_runs(first, last) if span.private else [(first, last)])
    released = 0
    for a, b in _merged(runs):
        if libc.madvise(ctypes.c_void_p(a), ctypes.c_size_t(b - a), _MADV_DONTNEED) == 0:
            released += b - a
        else:
            log.debug("madvise(%#x, %d) failed: errno %d", a, b - a, ctypes.get_errno())
    return released


def _extents(tensors: Iterable[object]) -> list[tuple[int, int]]:
    out = []
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or t.numel() == 0:
            continue
        if t.is_contiguous():
            out.append((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()))
        else:
            storage = t.untyped_storage()
            out.append((storage.data_ptr(), storage.data_ptr() + storage.nbytes()))
    return out


def _merged(runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Overlapping or touching runs made one (neighbouring tensors share their boundary pages).

    >>> _merged([(8, 12), (0, 4), (4, 6)])
    [(0, 6), (8, 12)]
    """
    out: list[tuple[int, int]] = []
    for a, b in sorted(runs):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


class _Pagemap:
    """``/proc/self/pagemap``: which pages of a private file mapping are still the file's own."""

    def __init__(self) -> None:
        self.fh: io.FileIO | None = None

    def __enter__(self) -> _Pagemap:
        try:
            self.fh = open("/proc/self/pagemap", "rb", buffering=0)  # noqa: SIM115 (closed in __exit__)
        except OSError:
            self.fh = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fh is not None:
            self.fh.close()

    def safe_runs(self, first: int, last: int) -> list[tuple[int, int]]:
        """Runs of pages in ``[first, last)`` whose release loses nothing: none without pagemap."""
        if self.fh is None:
            return []
        count = (last - first) // _PAGE
        try:
            self.fh.seek(first // _PAGE * 8)
            raw = self.fh.read(count * 8)
        except OSError:
            return []
        entries = np.frombuffer(raw, dtype=np.uint64)
        if entries.size != count:
            return []
        present = (entries & np.uint64(_PRESENT)) != 0
        swapped = (entries & np.uint64(_SWAPPED)) != 0
        file_page = (entries & np.uint64(_FILE)) != 0
        safe = ~swapped & (~present | file_page)
        edges = np.flatnonzero(np.diff(np.concatenate(([0], safe.view(np.int8), [0]))))
        return [(first + int(s) * _PAGE, first + int(e) * _PAGE) for s, e in zip(edges[::2], edges[1::2], strict=True)]


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.madvise.restype = ctypes.c_int
        return libc
    except (OSError, AttributeError):
        return None


__all__ = ["FileSpan", "file_spans", "release_file_pages"]
