"""Spilled engines: each engine goes to its own file as soon as it exists.

Engines live in a private directory next to the target file while an export
runs (named after its process, see :mod:`pyrt.export._files.tempfiles`); the graph
sees each one as a uint8 tensor memory-mapped from its file
(``torch.from_file``, nothing read until touched), and the .pte writer copies
them from disk. So at most one engine is ever held in memory (the one a
TensorRT builder just returned), however many engines a program has.

>>> import tempfile
>>> with EngineStore(tempfile.gettempdir()) as store:
...     rec = store.add_bytes("engine_0", b"\\x01\\x02")
...     rec.size, store.tensor(rec).tolist()
(2, [1, 2])
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import torch

from pyrt.errors import ExportError
from pyrt.export._files.sparse_file import HoleWriter
from pyrt.export._files.tempfiles import engine_dir_prefix
from pyrt.export._graph.spec import EngineSpec

_CHUNK = 64 << 20


@dataclass
class EngineRecord:
    """A spilled engine and what the summary reports about it."""

    key: str
    path: Path
    size: int
    sha256: str
    spec: EngineSpec | None = None
    build_seconds: float = 0.0
    ops: tuple[str, ...] = ()
    source: str = "built"  # "built" by pyrt, or "converted" from a Torch-TensorRT engine
    extra: dict[str, Any] = field(default_factory=dict)


class _HashingWriter:
    """A write-only file wrapper that counts and hashes what passes through (zero runs become holes)."""

    def __init__(self, f: BinaryIO) -> None:
        self.f, self.size, self.hash = HoleWriter(f), 0, hashlib.sha256()

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.hash.update(view)
        self.f.write(view)
        self.size += view.nbytes
        return view.nbytes


class EngineStore:
    """A temporary directory of engine files, removed on close."""

    def __init__(self, directory: str | Path) -> None:
        try:
            self.dir = Path(tempfile.mkdtemp(prefix=engine_dir_prefix(), dir=directory))
        except OSError as exc:
            raise ExportError(f"cannot create a working directory in {str(directory)!r} (engines are spilled "
                              f"next to the target): {exc.strerror or exc}") from None
        self.records: dict[str, EngineRecord] = {}

    def add_stream(self, key: str, write: Callable[[Any], Any]) -> EngineRecord:
        """Spill an engine produced by ``write(sink)``."""
        if key in self.records:
            raise ExportError(f"engine key {key!r} is used twice")
        path = self.dir / f"{len(self.records)}.engine"
        try:
            with open(path, "wb") as f:
                sink = _HashingWriter(f)
                write(sink)
                sink.f.finish()
        except BaseException:
            path.unlink(missing_ok=True)  # a failed build leaves no partial engine behind
            raise
        if sink.size == 0:
            raise ExportError(f"engine {key!r} is empty")
        record = EngineRecord(key, path, sink.size, sink.hash.hexdigest())
        self.records[key] = record
        return record

    def add_bytes(self, key: str, data: Any) -> EngineRecord:
        view = memoryview(data).cast("B")

        def write(sink: Any) -> None:
            for start in range(0, view.nbytes, _CHUNK):
                sink.write(view[start : start + _CHUNK])

        return self.add_stream(key, write)

    def tensor(self, record: EngineRecord) -> torch.Tensor:
        """The engine as a 1-D uint8 tensor mapped from its file (copy-on-write, read lazily)."""
        return torch.from_file(str(record.path), shared=False, size=record.size, dtype=torch.uint8)

    def close(self) -> None:
        self.records.clear()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> EngineStore:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
