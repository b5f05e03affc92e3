"""Build serialized TensorRT engines from PyTorch modules.

The route is torch -> ONNX (``torch.onnx.export(dynamo=True)``) -> the flavour's
``OnnxParser`` -> a strongly typed network -> a serialized engine. Given ``out``
(anything with ``write``), the engine goes there while TensorRT serializes it
(``build_serialized_network_to_stream`` with an ``IStreamWriter``), so no whole
engine is ever held in host memory; a flavour without it falls back to
``build_serialized_network``. A streamed build holds a fixed buffer of about
64 MiB (TensorRT-RTX 1.7), more than a small engine in memory, so an engine whose
weights are under :data:`STREAM_MIN` is built in memory and then written to
``out``. torch, onnx and tensorrt are imported only inside the functions that
need them. See docs/engine_building.md for why the ONNX
parser and what it cannot do.

>>> import torch
>>> from pyrt.export.trt_builder import build_engine
>>> built = build_engine(torch.nn.Linear(4, 2).eval(), (torch.randn(3, 4),),
...                      flavour="tensorrt_rtx")          # doctest: +SKIP
>>> [(b.name, b.dtype, b.shape) for b in built.inputs]    # doctest: +SKIP
[('input', 'float32', (3, 4))]
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import logging
import re
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

from pyrt import cuda as cuda_seam
from pyrt.device import tensorrt_seam
from pyrt.device.tensorrt_seam import shared_logger
from pyrt.errors import ExportError
from pyrt.format.trt_blob import IOBinding

if TYPE_CHECKING:
    import torch

log = logging.getLogger("pyrt.export")

Progress = Callable[[str], None]
ShapeRange = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]  # (min, opt, max)

BUILDER_FLAVOURS = ("tensorrt", "tensorrt_rtx")  # the order "auto" tries them in
STREAM, MEMORY = "stream", "memory"  # BuiltEngine.route: to_stream + IStreamWriter, or IHostMemory
OUT_CHUNK = 64 << 20  # most bytes one out.write() call gets
STREAM_MIN = 64 << 20  # weights (bytes) from which a streamed build holds less than an in-memory one
RUNTIME_ONLY_FLAVOURS = ("tensorrt_lean", "tensorrt_dispatch")
STAGES = ("export_onnx", "parse_onnx", "build_engine", "done")  # what progress() is called with

# TensorRT DataType member name -> pyrt dtype string (IOBinding.dtype).
_DTYPES = {
    "FLOAT": "float32", "HALF": "float16", "BF16": "bfloat16", "INT8": "int8", "INT32": "int32",
    "INT64": "int64", "BOOL": "bool", "UINT8": "uint8", "FP8": "float8_e4m3fn",
}


class Writable(Protocol):
    """Where a streamed engine goes: a file opened for writing, or any object with ``write``."""

    def write(self, data: Any, /) -> Any: ...


@dataclass(frozen=True)
class BuiltEngine:
    """A serialized engine and its I/O, as the TR01 blob needs them.

    ``engine`` is a zero-copy memoryview of TensorRT's ``IHostMemory`` (the view keeps it
    alive), or None when the build wrote the engine to ``out``. ``size``: engine bytes.
    ``route``: ``"stream"`` (``build_serialized_network_to_stream``) or ``"memory"``
    (``build_serialized_network``). ``inputs`` follow the module's argument order,
    ``outputs`` the engine's order; names are the engine's own tensor names, -1 marks a
    dynamic dimension. ``build_seconds`` covers the whole build: ONNX export, parsing and
    engine build.
    """

    engine: memoryview | None
    inputs: list[IOBinding]
    outputs: list[IOBinding]
    streamable_weights: bool
    flavour: str
    build_seconds: float
    size: int = 0
    route: str = MEMORY


@dataclass
class _Session:
    """One flavour's builder with the logger that collects its error lines."""

    trt: ModuleType
    name: str
    logger: Any
    builder: Any


@dataclass(frozen=True)
class _Options:
    weight_streaming: bool
    workspace: int | None
    compute_capabilities: tuple[str, ...] | None  # ComputeCapability member names


def build_engine(
    gm: Any,
    example_inputs: Sequence[torch.Tensor],
    *,
    flavour: str | ModuleType = "auto",
    weight_streaming: bool = False,
    dynamic_shapes: Mapping[str | int, Mapping[str, Sequence[int]]] | None = None,
    fp16: bool = False,
    workspace: int | None = None,
    compute_capabilities: Sequence[str] | None = None,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    progress: Progress | None = None,
    out: Writable | None = None,
) -> BuiltEngine:
    """Export ``gm`` to ONNX and build a strongly typed TensorRT engine from it.

    ``flavour``: "auto" (tensorrt, else tensorrt_rtx), "tensorrt", "tensorrt_rtx" or a module.
    ``dynamic_shapes``: ``{input: {"min": shape, "opt": shape, "max": shape}}``, the input
    named by position, by ``input_names`` or by ``forward``'s parameter name; inputs left out
    are static at their example shape. ``fp16``: build from a float16 copy of the module, so
    floating inputs and outputs become float16 (strongly typed networks take no FP16 flag).
    ``compute_capabilities`` (TensorRT-RTX only), e.g. ``["sm86", "sm120"]`` or ``["current"]``;
    None keeps TensorRT-RTX's portable default, which builds on a machine without a GPU.
    ``out``: write the engine there as TensorRT serializes it (``BuiltEngine.engine`` is
    then None); without it the engine comes back in memory. Every failure raises ExportError.

    >>> built = build_engine(torch.nn.Linear(4, 2), (torch.randn(3, 4),))  # doctest: +SKIP
    >>> built.outputs[0].shape                                           # doctest: +SKIP
    (3, 2)
    """
    start = time.perf_counter()
    examples = _check_examples(example_inputs)
    module = _as_module(gm)
    names = _check_names(input_names, len(examples), "input_names") or _default_names(module, len(examples))
    _check_names(output_names, None, "output_names")
    ranges = parse_dynamic_shapes(dynamic_shapes, names, [tuple(x.shape) for x in examples])
    options = _options(weight_streaming, workspace, compute_capabilities)
    session = _open_session(flavour, options)
    if fp16:
        module, examples = _to_half(module, examples)
    with tempfile.TemporaryDirectory(prefix="pyrt-onnx-") as tmp:
        _stage(progress, "export_onnx")
        dims = [_dynamic_dims(ranges.get(i)) for i in range(len(examples))]
        path, weights = _export_onnx(module, examples, Path(tmp), input_names, output_names, dims)
        built = _build(session, path, ranges, options, progress, out, weights)
        del weights
    _check_io(built, examples, input_names, output_names)
    built = replace(built, build_seconds=time.perf_counter() - start)
    log.info("built a %s engine: %d bytes (%s) in %.2f s", built.flavour, built.size, built.route,
             built.build_seconds)
    _stage(progress, "done")
    return built


def build_engine_from_onnx(
    onnx_path: str | Path,
    *,
    flavour: str | ModuleType = "auto",
    weight_streaming: bool = False,
    dynamic_shapes: Mapping[str | int, Mapping[str, Sequence[int]]] | None = None,
    workspace: int | None = None,
    compute_capabilities: Sequence[str] | None = None,
    progress: Progress | None = None,
    out: Writable | None = None,
) -> BuiltEngine:
    """Build an engine from an ONNX file (its external data beside it).

    ``dynamic_shapes`` keys are ONNX input names or positions. I/O bindings come from
    the parsed network, inputs in the ONNX graph's order. ``out`` as for :func:`build_engine`.

    >>> build_engine_from_onnx("model.onnx", flavour="tensorrt_rtx").flavour  # doctest: +SKIP
    'tensorrt_rtx'
    """
    start = time.perf_counter()
    path = Path(onnx_path)
    if not path.is_file():
        raise ExportError(f"ONNX model {str(path)!r} does not exist or is not a file")
    ranges = parse_dynamic_shapes(dynamic_shapes, None, None)
    options = _options(weight_streaming, workspace, compute_capabilities)
    built = _build(_open_session(flavour, options), path, ranges, options, progress, out)
    _stage(progress, "done")
    return replace(built, build_seconds=time.perf_counter() - start)


# -- flavour -----------------------------------------------------------------------------------


def resolve_flavour(flavour: str | ModuleType = "auto") -> ModuleType:
    """The TensorRT module that builds for ``flavour``; ExportError says why none can.

    >>> resolve_flavour("tensorrt_lean")
    Traceback (most recent call last):
    ...
    pyrt.errors.ExportError: flavour 'tensorrt_lean' is a runtime-only TensorRT package and has no builder; use 'tensorrt' or 'tensorrt_rtx' to build engines
    """  # noqa: E501 (a doctest's expected message is one line)
    return _open_session(flavour, _options(False, None, None)).trt


def _open_session(flavour: str | ModuleType, options: _Options) -> _Session:
    if isinstance(flavour, ModuleType):
        return _session_for(flavour, options)
    if flavour == "auto":
        return _auto_session(options)
    if flavour in RUNTIME_ONLY_FLAVOURS:
        raise ExportError(_runtime_only(flavour))
    if flavour not in BUILDER_FLAVOURS:
        raise ExportError(f"flavour {flavour!r} is not one of 'auto', {', '.join(map(repr, BUILDER_FLAVOURS))}")
    return _session_for(_import(flavour), options)


def _auto_session(options: _Options) -> _Session:
    reasons = []
    for name in BUILDER_FLAVOURS:
        try:
            return _session_for(_import(name), options)
        except ExportError as exc:
            reasons.append(str(exc))
    raise ExportError("flavour 'auto' found no TensorRT that can build engines ("
                      + "; ".join(reasons) + "; tensorrt_lean and tensorrt_dispatch are runtime-only)")


def _import(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ExportError(f"flavour {name!r} is not importable: {exc}") from exc


def _session_for(trt: ModuleType, options: _Options) -> _Session:
    name = trt.__name__.split(".")[0]
    if name in RUNTIME_ONLY_FLAVOURS:
        raise ExportError(_runtime_only(name))
    missing = [a for a in ("Builder", "OnnxParser", "ILogger") if not hasattr(trt, a)]
    if missing:
        raise ExportError(f"flavour {name!r} has no {', '.join(missing)}: it cannot build engines from ONNX")
    if options.compute_capabilities is not None and not hasattr(trt, "ComputeCapability"):
        raise ExportError(f"compute_capabilities was given but flavour {name!r} has no ComputeCapability "
                          "API (only TensorRT-RTX targets compute capabilities)")

    logger = shared_logger(trt)  # TensorRT keeps one logger per process: share the runtime's
    logger.messages.take()
    try:
        builder = trt.Builder(logger)
    except Exception as exc:  # TensorRT raises for a failed factory (e.g. no GPU for tensorrt)
        raise ExportError(f"{name}.Builder() failed: {exc} {_errors(logger)}".rstrip()) from exc
    if builder is None:
        raise ExportError(f"{name}.Builder() returned None {_errors(logger)}".rstrip())
    return _Session(trt, name, logger, builder)


def _runtime_only(name: str) -> str:
    return (f"flavour {name!r} is a runtime-only TensorRT package and has no builder; "
            "use 'tensorrt' or 'tensorrt_rtx' to build engines")


def _errors(logger: Any) -> str:
    text = logger.messages.take()
    return f"; TensorRT said: {text}" if text else ""


# -- build -------------------------------------------------------------------------------------


def _build(session: _Session, path: Path, ranges: dict[int | str, ShapeRange],
           options: _Options, progress: Progress | None, out: Writable | None = None,
           weights: Mapping[str, Any] | None = None) -> BuiltEngine:
    trt, builder = session.trt, session.builder
    network = _strongly_typed_network(session)
    parser = trt.OnnxParser(network, session.logger)  # must outlive the build: it owns weights
    if parser is None:
        raise ExportError(f"{session.name}.OnnxParser() returned None{_errors(session.logger)}")
    _stage(progress, "parse_onnx")
    if weights and callable(getattr(parser, "load_initializer", None)):
        _parse_over_module_weights(session, parser, network, path, weights)
    else:
        _parse(session, parser, network, path)
    config = _configure(session, network, ranges, options)
    _stage(progress, "build_engine")
    started = time.perf_counter()
    inputs, outputs = _bindings(network, True), _bindings(network, False)
    streams = _can_stream(builder) and _weight_bytes(path, weights) >= STREAM_MIN
    writer = _stream_writer(trt, out) if out is not None and streams else None
    if writer is not None:
        size = _build_to_stream(session, network, config, writer, path, options)
        engine, route = None, STREAM
    else:
        engine = _build_in_memory(session, network, config, path, options)
        size, route = engine.nbytes, MEMORY
        if out is not None:
            _write_out(session, out, engine, path)
            engine = None  # the last reference to IHostMemory: TensorRT frees the engine now
    log.info("%s engine build took %.2f s (%s)", session.name, time.perf_counter() - started, route)
    return BuiltEngine(engine, inputs, outputs, options.weight_streaming, session.name, 0.0, size, route)


def _build_in_memory(session: _Session, network: Any, config: Any, path: Path, options: _Options) -> memoryview:
    serialized = session.builder.build_serialized_network(network, config)
    if serialized is None or serialized.nbytes == 0:
        raise ExportError(f"{session.name} build_serialized_network returned no engine for {path.name}"
                          f"{_errors(session.logger)}{_hint(options)}")
    return memoryview(serialized).cast("B")


def _weight_bytes(path: Path, weights: Mapping[str, Any] | None) -> int:
    """The engine's weights, roughly its size: the module's tensors, else the ONNX model's folder
    (the model and its external data; a shared folder only overestimates, which streams)."""
    if weights:
        return sum(int(getattr(t, "nbytes", 0)) for t in weights.values())
    return sum(f.stat().st_size for f in path.parent.iterdir() if f.is_file())


def _can_stream(builder: Any) -> bool:
    return callable(getattr(builder, "build_serialized_network_to_stream", None))


def _build_to_stream(session: _Session, network: Any, config: Any, writer: Any, path: Path,
                     options: _Options) -> int:
    ok = session.builder.build_serialized_network_to_stream(network, config, writer)
    if writer.error is not None:
        raise ExportError(f"writing the {session.name} engine for {path.name} failed after {writer.size} bytes: "
                          f"{type(writer.error).__name__}: {writer.error}") from writer.error
    if not ok or writer.size == 0:
        raise ExportError(f"{session.name} build_serialized_network_to_stream returned no engine for {path.name}"
                          f"{_errors(session.logger)}{_hint(options)}")
    return writer.size


def _stream_writer(trt: ModuleType, out: Writable) -> Any:
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
            except BaseException as exc:  # kept and re-raised by _build_to_stream, never into TensorRT
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


def _write_out(session: _Session, out: Writable, engine: memoryview, path: Path) -> None:
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


def _hint(options: _Options) -> str:
    if "CURRENT" in (options.compute_capabilities or ()):
        return " (compute capability 'current' needs a visible CUDA GPU)"
    return ""


def _strongly_typed_network(session: _Session) -> Any:
    """TensorRT 11 / RTX: create_network(0) is strongly typed; TensorRT 10 needs the flag."""
    trt, builder = session.trt, session.builder
    flag = getattr(getattr(trt, "NetworkDefinitionCreationFlag", None), "STRONGLY_TYPED", None)
    network = builder.create_network(0)
    if network is not None and (flag is None or network.get_flag(flag)):
        return network
    if flag is not None:
        network = builder.create_network(1 << int(flag))
        if network is not None and network.get_flag(flag):
            return network
    raise ExportError(f"{session.name} could not create a strongly typed network{_errors(session.logger)}")


def _parse(session: _Session, parser: Any, network: Any, path: Path) -> None:
    _check_parsed(session, parser, network, path, parser.parse_from_file(str(path)))


def _parse_over_module_weights(session: _Session, parser: Any, network: Any, path: Path,
                               weights: Mapping[str, Any]) -> None:
    """Parse with the module's own tensors as the network's weights (no parser copy of them).

    ``parse_from_file`` reads every external initializer into memory the parser owns: a
    second copy of the model's weights. Instead the model (weights external, so small) is
    loaded with ``load_model_proto`` and each initializer that is a torch tensor of the
    exported module is handed over by address with ``load_initializer``; the tensors
    outlive the parser (the caller holds them until the build returns).
    """
    if not parser.load_model_proto(path.read_bytes(), str(path)):
        _check_parsed(session, parser, network, path, False)
    for name, tensor in weights.items():
        if not parser.load_initializer(name, tensor.data_ptr(), tensor.nbytes):
            raise ExportError(f"{session.name} OnnxParser refused initializer {name!r} ({tensor.nbytes} bytes of "
                              f"{tensor.dtype}){_errors(session.logger)}")
    _check_parsed(session, parser, network, path, parser.parse_model_proto())


def _check_parsed(session: _Session, parser: Any, network: Any, path: Path, ok: bool) -> None:
    if ok and parser.num_errors == 0:
        if network.num_outputs == 0:  # protobuf decoding is lenient: junk bytes parse as an empty graph
            raise ExportError(f"{session.name} OnnxParser found no outputs in {str(path)!r}: not an ONNX "
                              "model, or one that computes nothing")
        return
    problems = [_parser_error(parser.get_error(i)) for i in range(parser.num_errors)]
    raise ExportError(f"{session.name} OnnxParser rejected {path.name}: "
                      + ("; ".join(problems) or "no parser error recorded") + _errors(session.logger))


def _parser_error(err: Any) -> str:
    node, name, op = err.node(), err.node_name(), err.node_operator()
    where = f"node {node} {name!r} (op {op})" if op or name else f"node {node}"
    return f"{where}: {getattr(err.code(), 'name', err.code())}: {err.desc()}"


def _configure(session: _Session, network: Any, ranges: dict[int | str, ShapeRange], options: _Options) -> Any:
    trt = session.trt
    config = session.builder.create_builder_config()
    if config is None:
        raise ExportError(f"{session.name} create_builder_config returned None{_errors(session.logger)}")
    if options.weight_streaming:
        config.set_flag(trt.BuilderFlag.WEIGHT_STREAMING)
        if not config.get_flag(trt.BuilderFlag.WEIGHT_STREAMING):
            raise ExportError(f"{session.name} did not keep BuilderFlag.WEIGHT_STREAMING")
    if options.workspace is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace)
        if config.get_memory_pool_limit(trt.MemoryPoolType.WORKSPACE) != options.workspace:
            raise ExportError(f"{session.name} did not keep workspace={options.workspace}")
    if options.compute_capabilities is not None:
        _set_compute_capabilities(session, config, options.compute_capabilities)
    _add_profile(session, network, config, ranges)
    return config


def _set_compute_capabilities(session: _Session, config: Any, names: tuple[str, ...]) -> None:
    members = session.trt.ComputeCapability.__members__
    unknown = [n for n in names if n not in members]
    if unknown:
        raise ExportError(f"{session.name} has no compute capability {', '.join(unknown)} "
                          f"(it offers {', '.join(m for m in members if m != 'NONE')})")
    if "CURRENT" in names:
        _check_current_device(session)
    caps = [members[n] for n in names]
    config.num_compute_capabilities = len(caps)
    if config.num_compute_capabilities != len(caps):
        raise ExportError(f"{session.name} did not keep num_compute_capabilities={len(caps)}")
    for i, cap in enumerate(caps):
        if not config.set_compute_capability(cap, i) or config.get_compute_capability(i) != cap:
            raise ExportError(f"{session.name} refused compute capability {cap.name} at index {i}"
                              f"{_errors(session.logger)}")


def _check_current_device(session: _Session) -> None:
    """``CURRENT`` on a GPU the flavour cannot run on builds an engine that runs nowhere: refuse it."""
    seam = cuda_seam.current()
    if seam.device_count() == 0:
        return  # TensorRT itself reports that 'current' needs a visible GPU
    info = seam.devices()[0]
    refusal = tensorrt_seam.unsupported_device(session.trt, info.compute_capability)
    if refusal is not None:
        raise ExportError(f"compute capability 'current' is device {info}, and {refusal}: the engine would run "
                          f"nowhere; build with full TensorRT, or name a supported compute capability")


def _add_profile(session: _Session, network: Any, config: Any, ranges: dict[int | str, ShapeRange]) -> None:
    tensors = [network.get_input(i) for i in range(network.num_inputs)]
    by_name = {t.name: i for i, t in enumerate(tensors)}
    for key in ranges:
        if (by_name.get(key) if isinstance(key, str) else key if 0 <= key < len(tensors) else None) is None:
            raise ExportError(f"dynamic_shapes names input {key!r}, but the network's inputs are "
                              f"{list(by_name)}")
    profile = session.builder.create_optimization_profile()
    used = False
    for i, tensor in enumerate(tensors):
        rng = ranges.get(i, ranges.get(tensor.name))
        shape = tuple(int(d) for d in tensor.shape)
        if rng is None:
            if -1 in shape:
                raise ExportError(f"input {i} ({tensor.name!r}) has dynamic shape {shape} but dynamic_shapes "
                                  "gives it no min/opt/max")
            continue
        _check_range_fits(i, tensor.name, shape, rng)
        try:  # the binding raises RuntimeError for a shape setDimensions refuses, TypeError for a non-Dims
            profile.set_shape(tensor.name, *rng)
        except (RuntimeError, TypeError) as exc:
            raise ExportError(f"dynamic_shapes for input {tensor.name!r}: {session.name} refused {rng}: {exc}") from exc
        used = True
    if used and config.add_optimization_profile(profile) < 0:
        raise ExportError(f"{session.name} refused the optimization profile {ranges}{_errors(session.logger)}")


def _check_range_fits(i: int, name: str, shape: tuple[int, ...], rng: ShapeRange) -> None:
    lo, _, hi = rng
    if len(lo) != len(shape):
        raise ExportError(f"dynamic_shapes for input {i} ({name!r}) has rank {len(lo)}, the network input "
                          f"has shape {shape}")
    for d, size in enumerate(shape):
        if size != -1 and not lo[d] == hi[d] == size:
            raise ExportError(f"dynamic_shapes asks dim {d} of input {i} ({name!r}) to range {lo[d]}..{hi[d]}, "
                              f"but the network fixed it to {size} (the ONNX model has a static dim there: "
                              "torch.export specialised it, so check the model's code)")


def _bindings(network: Any, inputs: bool) -> list[IOBinding]:
    count = network.num_inputs if inputs else network.num_outputs
    get = network.get_input if inputs else network.get_output
    return [_binding(get(i), inputs) for i in range(count)]


def _binding(tensor: Any, is_input: bool) -> IOBinding:
    kind = getattr(tensor.dtype, "name", str(tensor.dtype))
    if kind not in _DTYPES:
        raise ExportError(f"engine {'input' if is_input else 'output'} {tensor.name!r} has TensorRT dtype {kind}, "
                          f"which pyrt cannot bind (supported: {', '.join(_DTYPES)})")
    return IOBinding(tensor.name, _DTYPES[kind], tuple(int(d) for d in tensor.shape), is_input)


def _options(weight_streaming: bool, workspace: int | None, caps: Sequence[str] | None) -> _Options:
    if not isinstance(weight_streaming, bool):
        raise ExportError(f"weight_streaming must be a bool, got {weight_streaming!r}")
    if workspace is not None and (isinstance(workspace, bool) or not isinstance(workspace, int) or workspace <= 0):
        raise ExportError(f"workspace must be a positive number of bytes, got {workspace!r}")
    return _Options(weight_streaming, workspace, None if caps is None else parse_compute_capabilities(caps))


def parse_compute_capabilities(caps: Sequence[str]) -> tuple[str, ...]:
    """Normalise target names to TensorRT-RTX ComputeCapability member names.

    >>> parse_compute_capabilities(["sm86", "8.9", "SM_120"])
    ('SM86', 'SM89', 'SM120')
    """
    if isinstance(caps, (str, bytes)) or not isinstance(caps, Sequence) or not caps:
        raise ExportError(f"compute_capabilities must be a non-empty list such as ['sm86'], got {caps!r}")
    names = tuple(_capability_name(c, i) for i, c in enumerate(caps))
    if len(set(names)) != len(names):
        raise ExportError(f"compute_capabilities {list(caps)!r} repeats a target")
    if "CURRENT" in names and len(names) > 1:
        raise ExportError(f"compute_capabilities {list(caps)!r}: 'current' must be the only target")
    return names


_KNOWN_CAPABILITIES = ("CURRENT", "SM75", "SM80", "SM86", "SM89", "SM120", "SM121")


def _capability_name(cap: Any, index: int) -> str:
    text = getattr(cap, "name", cap)
    if not isinstance(text, str):
        raise ExportError(f"compute_capabilities[{index}] = {cap!r} is not a string such as 'sm86'")
    key = text.strip().upper().replace("_", "").replace(".", "")
    key = "SM" + key if key.isdigit() else key
    if key not in _KNOWN_CAPABILITIES:
        raise ExportError(f"compute_capabilities[{index}] = {cap!r} is not one of "
                          f"{', '.join(k.lower() for k in _KNOWN_CAPABILITIES)}")
    return key


# -- dynamic shapes ----------------------------------------------------------------------------


def parse_dynamic_shapes(
    spec: Mapping[Any, Any] | None,
    names: Sequence[str] | None,
    example_shapes: Sequence[tuple[int, ...]] | None,
) -> dict[int | str, ShapeRange]:
    """Check a ``{input: {"min","opt","max"}}`` spec; keys become positions when ``names`` is given.

    >>> parse_dynamic_shapes({"x": {"min": [1, 4], "opt": [8, 4], "max": [32, 4]}}, ["x"], [(8, 4)])
    {0: ((1, 4), (8, 4), (32, 4))}
    """
    if spec is None:
        return {}
    if not isinstance(spec, Mapping):
        raise ExportError(f"dynamic_shapes must be a dict of {{input: {{'min','opt','max'}}}}, "
                          f"got {type(spec).__name__}")
    out: dict[int | str, ShapeRange] = {}
    for key, value in spec.items():
        slot = _input_slot(key, names)
        rng = _parse_range(key, value)
        if example_shapes is not None:
            # The ignore below: callers that pass example shapes also pass names, which makes slot a position.
            _check_example_in_range(key, rng, example_shapes[slot])  # type: ignore[index]
        if slot in out:
            raise ExportError(f"dynamic_shapes gives input {key!r} twice (by name and by position)")
        out[slot] = rng
    return out


def _input_slot(key: Any, names: Sequence[str] | None) -> int | str:
    if isinstance(key, bool) or not isinstance(key, (int, str)):
        raise ExportError(f"dynamic_shapes key {key!r} must be an input name or position")
    if names is None:
        return key
    if isinstance(key, int):
        if not 0 <= key < len(names):
            raise ExportError(f"dynamic_shapes key {key} is not an input position (the module takes {len(names)})")
        return key
    if key not in names:
        raise ExportError(f"dynamic_shapes key {key!r} is not an input name; the inputs are {list(names)}")
    return list(names).index(key)


def _parse_range(key: Any, value: Any) -> ShapeRange:
    if not isinstance(value, Mapping) or set(value) != {"min", "opt", "max"}:
        got = sorted(map(str, value)) if isinstance(value, Mapping) else type(value).__name__
        raise ExportError(f"dynamic_shapes[{key!r}] must be a dict with exactly 'min', 'opt', 'max'; got {got}")
    lo, opt, hi = (_shape(key, k, value[k]) for k in ("min", "opt", "max"))
    if not len(lo) == len(opt) == len(hi):
        raise ExportError(f"dynamic_shapes[{key!r}]: min {lo}, opt {opt}, max {hi} differ in rank")
    for d, (a, b, c) in enumerate(zip(lo, opt, hi, strict=True)):
        if not 0 <= a <= b <= c:
            raise ExportError(f"dynamic_shapes[{key!r}] dim {d}: need 0 <= min <= opt <= max, got {a}, {b}, {c}")
    return lo, opt, hi


def _shape(key: Any, which: str, value: Any) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not all(
            isinstance(d, int) and not isinstance(d, bool) for d in value):
        raise ExportError(f"dynamic_shapes[{key!r}][{which!r}] must be a list of ints, got {value!r}")
    return tuple(value)


def _check_example_in_range(key: Any, rng: ShapeRange, example: tuple[int, ...]) -> None:
    lo, _, hi = rng
    if len(lo) != len(example):
        raise ExportError(f"dynamic_shapes[{key!r}] has rank {len(lo)}, its example input has shape {example}")
    for d, size in enumerate(example):
        if not lo[d] <= size <= hi[d] or (lo[d] == hi[d] != size):
            raise ExportError(f"dynamic_shapes[{key!r}] dim {d} spans {lo[d]}..{hi[d]}, but the example "
                              f"input has size {size} there")


def _dynamic_dims(rng: ShapeRange | None) -> list[int]:
    return [] if rng is None else [d for d, (a, c) in enumerate(zip(rng[0], rng[2], strict=True)) if a != c]


# -- torch side --------------------------------------------------------------------------------


def _check_examples(example_inputs: Any) -> tuple[torch.Tensor, ...]:
    import torch

    if not isinstance(example_inputs, (tuple, list)):
        raise ExportError(f"example_inputs must be a tuple of tensors, got {type(example_inputs).__name__}")
    for i, x in enumerate(example_inputs):
        if not isinstance(x, torch.Tensor):
            raise ExportError(f"example_inputs[{i}] is a {type(x).__name__}, not a torch.Tensor")
    return tuple(example_inputs)


def _as_module(gm: Any) -> torch.nn.Module:
    import torch

    if isinstance(gm, torch.export.ExportedProgram):
        return gm.module()
    if not isinstance(gm, torch.nn.Module):
        raise ExportError(f"build_engine needs a torch.nn.Module or fx.GraphModule, got {type(gm).__name__}")
    return gm


def _check_names(names: Sequence[str] | None, count: int | None, what: str) -> list[str] | None:
    if names is None:
        return None
    if isinstance(names, str) or not all(isinstance(n, str) and n for n in names):
        raise ExportError(f"{what} must be a list of non-empty strings, got {names!r}")
    if len(set(names)) != len(names):
        raise ExportError(f"{what} {list(names)!r} repeats a name")
    if count is not None and len(names) != count:
        raise ExportError(f"{what} has {len(names)} names for {count} example inputs")
    return list(names)


def _default_names(module: torch.nn.Module, count: int) -> list[str]:
    """forward()'s positional parameter names: what dynamic_shapes may call the inputs."""
    try:
        params = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):
        return [f"input_{i}" for i in range(count)]
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return names[:count] if len(names) >= count else [f"input_{i}" for i in range(count)]


def _to_half(module: torch.nn.Module, examples: tuple[torch.Tensor, ...]) -> tuple[Any, tuple[Any, ...]]:
    """A float16 copy of the module and its floating example inputs (the original is untouched)."""
    import copy

    import torch

    half = copy.deepcopy(module).to(torch.float16)
    return half, tuple(x.to(torch.float16) if x.is_floating_point() else x for x in examples)


def _export_onnx(module: torch.nn.Module, examples: tuple[torch.Tensor, ...], directory: Path,
                 input_names: Sequence[str] | None, output_names: Sequence[str] | None,
                 dims: list[list[int]]) -> tuple[Path, dict[str, Any]]:
    """torch.onnx.export (dynamo) with weights as external data, so models over 2 GiB export.

    Returns the model's path and the initializers whose bytes are already in memory (the
    module's own tensors, small folded constants), which the parser can use in place.
    """
    import torch

    path = directory / "model.onnx"
    dynamic = tuple({d: torch.export.Dim.DYNAMIC for d in ds} or None for ds in dims) if any(dims) else None
    chatter = io.StringIO()
    try:
        with contextlib.redirect_stdout(chatter):
            program = torch.onnx.export(module, examples, dynamo=True, optimize=False, input_names=input_names,
                                        output_names=output_names, dynamic_shapes=dynamic)
            if program is None:
                raise ExportError(f"torch.onnx.export returned no program for {type(module).__name__}")
            _optimize(program)
            program.save(str(path), external_data=True)
    except Exception as exc:  # torch.export / onnx conversion errors come in many types
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))  # torch colours its export errors
        raise ExportError(f"torch.onnx.export failed for {type(module).__name__}: "
                          f"{type(exc).__name__}: {text}") from exc
    finally:
        if chatter.getvalue().strip():
            log.debug("torch.onnx.export: %s", chatter.getvalue().strip())
    if not path.is_file():
        raise ExportError(f"torch.onnx.export wrote no model at {path}")
    return path, _module_initializers(program)


FOLD_LIMIT = 1 << 20  # bytes: constants above this are left for TensorRT to fold


def _optimize(program: Any) -> None:
    """torch.onnx's optimization, except that large weights are never transposed in memory.

    onnxscript always folds a Transpose of a constant, whatever its size: for a
    decomposed ``linear`` that is a transposed copy of every weight, held until the build
    ends. TensorRT folds such a transpose itself while building, so it is left in the graph.
    """
    from onnxscript import optimizer

    def keep_large_transposes(node: Any) -> bool | None:
        if node.op_type == "Transpose" and any(
                v is not None and v.const_value is not None and v.const_value.nbytes > FOLD_LIMIT for v in node.inputs):
            return False
        return None  # onnxscript's own rules

    try:
        optimizer.optimize_ir(program.model, should_fold=keep_large_transposes)
    except TypeError:  # an onnxscript without should_fold: its default folding
        program.optimize()


class _Weight:
    """An initializer's bytes in memory the exporter already holds: address, size, dtype."""

    def __init__(self, owner: Any, ptr: int, nbytes: int, dtype: Any) -> None:
        self.owner, self.ptr, self.nbytes, self.dtype = owner, ptr, nbytes, dtype  # owner keeps the bytes alive

    def data_ptr(self) -> int:
        return self.ptr


def _module_initializers(program: Any) -> dict[str, _Weight]:
    """ONNX initializers whose bytes are in memory already: the module's own tensors
    (``TorchTensor.raw``) and arrays the exporter folded, which the parser can read in place."""
    import numpy as np
    import torch

    out: dict[str, _Weight] = {}
    try:
        initializers = program.model.graph.initializers.items()
    except AttributeError:  # another ONNXProgram layout: the parser reads the external data file
        return out
    for name, value in initializers:
        raw = getattr(value.const_value, "raw", None)
        size = getattr(value.const_value, "nbytes", -1)
        if isinstance(raw, torch.Tensor) and raw.device.type == "cpu" and raw.is_contiguous() and raw.nbytes == size:
            out[name] = _Weight(raw, raw.data_ptr(), size, raw.dtype)
        elif isinstance(raw, np.ndarray) and raw.flags.c_contiguous and raw.nbytes == size:
            out[name] = _Weight(raw, raw.ctypes.data, size, raw.dtype)
    return {k: w for k, w in out.items() if w.nbytes > 0}


def _check_io(built: BuiltEngine, examples: tuple[torch.Tensor, ...], input_names: Sequence[str] | None,
              output_names: Sequence[str] | None) -> None:
    """The engine must take the module's arguments one for one, in order and dtype."""
    if len(built.inputs) != len(examples):
        raise ExportError(f"the engine has {len(built.inputs)} inputs {[b.name for b in built.inputs]} but the "
                          f"module takes {len(examples)}: ONNX export dropped or added an input")
    for i, (binding, x) in enumerate(zip(built.inputs, examples, strict=True)):
        want = str(x.dtype).removeprefix("torch.")
        if binding.dtype != want:
            raise ExportError(f"input {i} ({binding.name!r}) is {want} in the module but {binding.dtype} in the "
                              f"{built.flavour} engine (TensorRT has no {want} I/O; cast the model)")
    for what, want_names, got in (("input", input_names, built.inputs), ("output", output_names, built.outputs)):
        if want_names is not None and [b.name for b in got] != list(want_names):
            raise ExportError(f"engine {what} names {[b.name for b in got]} differ from "
                              f"{what}_names {list(want_names)}")


def _stage(progress: Progress | None, stage: str) -> None:
    log.debug("stage %s", stage)
    if progress is not None:
        progress(stage)
