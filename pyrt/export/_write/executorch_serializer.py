"""Writing the .pte: ExecuTorch's own serializer, with engine blobs streamed from disk, atomically.

ExecuTorch lays out the file (``serialize_pte_binary``: flatbuffer, extended
header, 128-byte-aligned segments) from a program whose delegate data are
small stubs; pyrt swaps each stub for a :class:`BlobFile`, an ExecuTorch
``FileBackedData`` that yields the blob's header bytes and then the engine
file, so segment sizes and offsets are computed from the real blobs while
the bytes stay on disk until they are copied into the output.

With ``external_weights``, the weights ExecuTorch would keep in the .pte go to
a ``.ptd`` beside it instead; its layout is ExecuTorch's own
(``FlatTensorSerializer``), its bytes are :class:`TensorBytes`: each weight
streamed from the tensor's own memory in pieces when the file is written.

The write itself is atomic (:mod:`pyrt.export._files.atomic`, called by :mod:`pyrt.export._write.lower`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, BinaryIO

from executorch.exir._serialize._cord import Cord, FileBackedData

from pyrt.errors import ExportError
from pyrt.export.backend import STUB_MAGIC, BlobPlan, BlobSession

_CHUNK = 8 << 20


class BlobFile(FileBackedData):
    """A delegate blob as a Cord buffer: ``plan.header`` then the engine file (never loaded whole)."""

    def __init__(self, plan: BlobPlan) -> None:
        super().__init__(str(plan.engine_path), cleanup=False)
        self.plan = plan
        self._size = plan.size

    def _chunks(self) -> Any:
        yield self.plan.header
        with open(self.plan.engine_path, "rb") as f:
            while chunk := f.read(_CHUNK):
                yield chunk

    def prefix(self, size: int) -> bytes:
        out = bytearray()
        for chunk in self._chunks():
            out += chunk[: size - len(out)]
            if len(out) >= size:
                break
        return bytes(out)

    def sha256(self) -> bytes:
        digest = hashlib.sha256()
        for chunk in self._chunks():
            digest.update(chunk)
        return digest.digest()

    def to_bytes(self) -> bytes:
        return b"".join(self._chunks())

    def write_to_file(self, outfile: Any, progress: Callable[[int], Any] | None = None) -> None:
        written = 0
        for chunk in self._chunks():
            outfile.write(chunk)
            written += len(chunk)
            if progress is not None:
                progress(len(chunk))
        if written != self._size:
            raise ExportError(f"engine file {self.plan.engine_path} changed size while writing "
                              f"({written} bytes, expected {self._size})")


class TensorBytes(FileBackedData):
    """A tensor's bytes as a Cord buffer, written from its own memory in pieces (never copied whole)."""

    def __init__(self, view: memoryview, owner: Any = None) -> None:  # no file: FileBackedData's init is skipped
        self.view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
        self.owner = owner  # keeps the memory alive
        self._path = ""
        self._size = self.view.nbytes
        self._sha256 = None
        self._finalizer = None

    def prefix(self, size: int) -> bytes:
        return bytes(self.view[:size])

    def sha256(self) -> bytes:
        digest = hashlib.sha256()
        for start in range(0, self._size, _CHUNK):
            digest.update(self.view[start : start + _CHUNK])
        return digest.digest()

    def to_bytes(self) -> bytes:
        return bytes(self.view)

    def write_to_file(self, outfile: Any, progress: Callable[[int], Any] | None = None) -> None:
        for start in range(0, self._size, _CHUNK):
            chunk = self.view[start : start + _CHUNK]
            outfile.write(chunk)
            if progress is not None:
                progress(chunk.nbytes)


def external_data_cord(entries: dict[str, tuple[TensorBytes, Any]], alignment: int = 16) -> Cord:
    """The .ptd of ``{key: (bytes, executorch TensorLayout)}``, laid out by ExecuTorch's FlatTensorSerializer.

    Entries sharing one ``TensorBytes`` (tied weights) share one segment, as in ExecuTorch.
    """
    from executorch.exir._serialize.data_serializer import DataEntry, DataPayload
    from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer

    buffers: list[Any] = []
    index: dict[int, int] = {}
    named = {}
    for key, (data, layout) in entries.items():
        if id(data) not in index:
            index[id(data)] = len(buffers)
            buffers.append(data)
        named[key] = DataEntry(index[id(data)], alignment, layout)
    return FlatTensorSerializer().serialize(DataPayload(buffers=buffers, named_data=named))


def streaming_program_cord(manager: Any, session: BlobSession, config: Any) -> Cord:
    """The .pte of ``manager`` (an ExecutorchProgramManager built with stubs) with real blobs."""
    from executorch.exir._serialize._program import PTEFile, serialize_pte_binary

    program = manager.executorch_program
    by_identity: dict[tuple[bytes, str], BlobFile] = {}
    for inline in program.backend_delegate_data:
        data = inline.data
        if isinstance(data, bytes) and data.startswith(STUB_MAGIC):
            plan = session.stubs.get(data)
            if plan is None:
                raise ExportError("a delegate holds a pyrt stub from another export session")
            inline.data = by_identity.setdefault((plan.header, plan.engine_sha256), BlobFile(plan))
    emitter = getattr(manager, "_emitter_output", None)
    pte = PTEFile(program=program, mutable_data=getattr(emitter, "mutable_data", None),
                  named_data=_pte_named_data(getattr(manager, "_named_data", None)))
    return serialize_pte_binary(
        pte,
        extract_delegate_segments=True,
        segment_alignment=config.segment_alignment,
        constant_tensor_alignment=config.constant_tensor_alignment,
        delegate_alignment=config.delegate_alignment,
    )


def _pte_named_data(store: Any) -> Any:
    """The named data ExecuTorch would put in the .pte (a backend's own external named data is not supported)."""
    if store is None or not getattr(store, "buffers", None) or not getattr(store, "pte_data", None):
        return None
    if getattr(store, "external_data", None):
        raise ExportError("a backend stored external (.ptd) named data, which pyrt's writer does not produce")
    return store


def write_cord(cord: Cord, f: BinaryIO, progress: Callable[[int], Any]) -> None:
    """Stream a Cord to ``f``, reporting bytes as they go."""
    buffers = getattr(cord, "_buffers", None)
    if buffers is None:  # a future Cord layout: let it write itself
        cord.write_to_file(f)
        progress(len(cord))
        return
    for item in buffers:
        if isinstance(item, (BlobFile, TensorBytes)):
            item.write_to_file(f, progress)
        elif isinstance(item, bytes):
            f.write(item)
            progress(len(item))
        else:
            item.write_to_file(f)
            progress(len(item))
