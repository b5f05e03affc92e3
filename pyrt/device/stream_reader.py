"""TensorRT's ``IStreamReaderV2`` over a read-only mapping: an engine served in zero-copy slices.

An engine of ``pyrt.engine.STREAM_READER_MIN_BYTES`` or more is handed to TensorRT through
this reader as memoryview slices of the file's mapping, of at most ``limit`` bytes each
(``pyrt.engine.STREAM_CHUNK_BYTES``), so TensorRT never holds a second full host copy of
streamable weights; each slice's file
pages are dropped from the process once TensorRT has copied it.
"""

from __future__ import annotations

from typing import Any

from pyrt.format.mapped import release_pages


def view_reader(module: Any, view: memoryview, limit: int) -> Any:
    """An ``IStreamReaderV2`` of ``module`` serving zero-copy slices of ``view`` (None if the flavour has none).

    TensorRT asks for exact byte counts and asks again for what a short read left out;
    the binding copies out of any buffer, so a memoryview slice needs no ``bytes()`` copy.
    Constructing the real reader base dlopens libcuda, and raises RuntimeError where it cannot.
    """
    base = getattr(module, "IStreamReaderV2", None)
    seek_position = getattr(module, "SeekPosition", None)
    if base is None or seek_position is None:
        return None
    origins = {seek_position.SET: lambda r: 0, seek_position.CUR: lambda r: r.pos,
               seek_position.END: lambda r: view.nbytes}

    class ViewReader(base):  # type: ignore[misc, valid-type]  # base is the flavour's class
        def __init__(self) -> None:
            super().__init__()  # TensorRT's pybind base must be initialised explicitly
            self.pos = 0
            self.served: tuple[int, int] | None = None  # the last slice handed out (TensorRT copies it after)

        def read(self, num_bytes: int, stream: int) -> memoryview:
            self.release()  # the previous slice has been copied by now: its file pages may go
            n = max(0, min(num_bytes, limit, view.nbytes - self.pos))
            chunk = view[self.pos : self.pos + n]  # empty only at the end: TensorRT then aborts
            self.served = (self.pos, self.pos + n)
            self.pos += n
            return chunk

        def release(self) -> None:
            """Drop the file pages of the slice served last (they leave this process's RSS)."""
            if self.served is not None:
                start, end = self.served
                release_pages(view[start:end])
                self.served = None

        def seek(self, offset: int, where: Any) -> bool:
            origin = origins.get(where)
            if origin is None or not 0 <= origin(self) + offset <= view.nbytes:
                return False
            self.pos = origin(self) + offset
            return True

    return ViewReader()
