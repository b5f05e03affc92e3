"""Sequential file writes that leave long runs of zero bytes as holes (sparse files).

A write is looked at in ``HOLE_MIN`` blocks; an all-zero block is skipped with
a seek instead of written; :meth:`HoleWriter.finish` sets the final size, so a
trailing hole still counts. Reading the file gives the same bytes either way (holes read as
zeros); only disk space and write time differ. Engines and weights rarely hold
megabytes of zeros, but placeholder and test models do, and a 4 GiB hole costs
nothing to write or copy.

>>> import io
>>> w = HoleWriter(io.BytesIO())
>>> w.write(b"ab"), w.write(b"x" + bytes(2 * HOLE_MIN)), w.write(b"cd"), w.holes
(2, 2097153, 2, 1)
>>> w.finish(); w.f.getvalue() == b"ab" + b"x" + bytes(2 * HOLE_MIN) + b"cd"
True
"""

from __future__ import annotations

import os
from typing import Any, BinaryIO

HOLE_MIN = 1 << 20  # the block size looked at: an all-zero block of a write becomes a hole


class HoleWriter:
    """Wraps a binary file open for writing at its end; ``write`` is the only method callers need."""

    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.size = 0  # bytes "written", holes included
        self.holes = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        n = view.nbytes
        if n < HOLE_MIN:
            self.f.write(view)
        else:
            for start in range(0, n, HOLE_MIN):
                block = view[start : start + HOLE_MIN]
                if block.nbytes == HOLE_MIN and _all_zero(block):
                    self.f.seek(HOLE_MIN, os.SEEK_CUR)
                    self.holes += 1
                else:
                    self.f.write(block)
        self.size += n
        return n

    def flush(self) -> None:
        self.f.flush()

    def finish(self) -> None:
        """Give the file its full size (a trailing hole has not extended it yet)."""
        self.f.truncate(self.f.tell())


def _all_zero(view: memoryview) -> bool:
    import numpy as np

    return not np.count_nonzero(np.frombuffer(view, dtype=np.uint8))
