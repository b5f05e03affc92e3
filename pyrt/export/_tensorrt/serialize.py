"""Serializing a built engine: in memory (``IHostMemory``) or streamed to ``out`` through the
flavour's ``IStreamWriter``, in bounded chunks, every failure an ExportError.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from pyrt.errors import ExportError
from pyrt.export._tensorrt.flavour import BuildOptions, Session, logged_errors

OUT_CHUNK = 64 << 20  # most bytes one out.write() call gets


class Writable(Protocol):
    """Where a streamed engine goes: a file opened for writing, or any object with ``write``."""

    def write(self, data: Any, /) -> Any: ...


def build_in_memory(session: Session, network: Any, config: Any, path: Path, options: BuildOptions) -> memoryview:
    serialized = session.builder.build_serialized_network(network, config)
    if serialized is None or serialized.nbytes == 0:
        raise ExportError(f"{session.name} build_serialized_network returned no engine for {path.name}"
                          f"{logged_errors(session.logger)}{_hint(options)}")
    return memoryview(serialized).cast("B")


def weight_bytes(path: Path, weights: Mapping[str, Any] | None) -> int:
    """The engine's weights, roughly its size: the module's tensors, else the ONNX model's folder
    (the model and its external data; a shared folder only overestimates, which streams)."""
    if weights:
        return sum(int(getattr(t, "nbytes", 0)) for t in weights.values())
    return sum(f.stat().st_size for f in path.parent.iterdir() if f.is_file())


def can_stream(builder: Any) -> bool:
    return callable(getattr(builder, "build_serialized_network_to_stream", None))


def build_to_stream(session: Session, network: Any, config: Any, writer: Any, path: Path,
                     options: BuildOptions) -> int:
    ok = session.builder.build_serialized_network_to_stream(network, config, writer)
    if writer.error is not None:
        raise ExportError(f"writing the {session.name} engine for {path.name} failed after {writer.size} bytes: "
                          f"{type(writer.error).__name__}: {writer.error}") from writer.error
    if not ok or writer.size == 0:
        raise ExportError(f"{session.name} build_serialized_network_to_stream returned no engine for {path.name}"
                          f"{logged_errors(session.logger)}{_hint(options)}")
    return writer.size


def stream_writer(trt: ModuleType, out: Writable) -> Any:
    """An ``IStreamWriter`` of flavour ``trt`` passing each chunk on to ``out`` (None without one).

    TensorRT calls ``write(data)`` with one piece of the engine (TensorRT-RTX 1.7: at most
    64 MiB); the piece goes to ``out`` before the call returns, so nothing accumulates.
    An exception never crosses back into TensorRT: it is kept, the call reports 0 bytes
    written (which fails the build), and the build raises it as an ExportError.
    """
    base = getattr(trt, "IStreamWriter", None)
    if base is None:
        return None

    class SpillWriter(base):  # type: ignore[misc, valid-type]  # base is the flavour's class
        def __init__(self) -> None:
            super().__init__()  # a pybind11 base class must be initialised explicitly
            self.size = 0
            self.calls = 0
            self.largest = 0
            self.error: BaseException | None = None

        def write(self, data: Any, *rest: Any) -> int:
            if self.error is not None:
                return 0
            try:
                view = _written_bytes(data, rest)
                _write_chunks(out, view)
            except BaseException as exc:  # kept and re-raised by build_to_stream, never into TensorRT
                self.error = exc
                return 0
            self.size += view.nbytes
            self.calls += 1
            self.largest = max(self.largest, view.nbytes)
            return view.nbytes

    return SpillWriter()


def _written_bytes(data: Any, rest: tuple[Any, ...]) -> memoryview:
    """The piece TensorRT hands ``IStreamWriter.write``: ``bytes`` (TensorRT-RTX 1.7.1's Python
    override gets those), or the binding's documented ``(capsule, size)`` pair, read in place."""
    try:
        return memoryview(data).cast("B")
    except TypeError:
        if not rest or type(data).__name__ != "PyCapsule":
            raise
    import ctypes

    api = ctypes.pythonapi
    api.PyCapsule_GetName.restype, api.PyCapsule_GetName.argtypes = ctypes.c_char_p, [ctypes.py_object]
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    address = api.PyCapsule_GetPointer(data, api.PyCapsule_GetName(data))
    size = int(rest[0])
    return memoryview((ctypes.c_char * size).from_address(address)).cast("B") if size else memoryview(b"")


def _write_chunks(out: Writable, view: memoryview) -> None:
    for start in range(0, view.nbytes, OUT_CHUNK):
        out.write(view[start : start + OUT_CHUNK])


def write_out(session: Session, out: Writable, engine: memoryview, path: Path) -> None:
    """An in-memory engine to ``out``; a failure is an ExportError as in the streamed build."""
    written = 0
    try:
        for start in range(0, engine.nbytes, OUT_CHUNK):
            piece = engine[start : start + OUT_CHUNK]
            out.write(piece)
            written += piece.nbytes
    except Exception as exc:  # whatever out raises (OSError: disk full)
        raise ExportError(f"writing the {session.name} engine for {path.name} failed after {written} bytes: "
                          f"{type(exc).__name__}: {exc}") from exc


def _hint(options: BuildOptions) -> str:
    if "CURRENT" in (options.compute_capabilities or ()):
        return " (compute capability 'current' needs a visible CUDA GPU)"
    return ""
