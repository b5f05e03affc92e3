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

This module runs the build; its steps live in :mod:`pyrt.export._tensorrt`: the flavour
and options (``flavour``), dynamic shapes (``shapes``), the torch side and ONNX export
(``torch_onnx``), the network and its parse (``network``), the builder config and
profile (``config``) and the engine's serialization (``serialize``).

>>> import torch
>>> from pyrt.export.trt_builder import build_engine
>>> built = build_engine(torch.nn.Linear(4, 2).eval(), (torch.randn(3, 4),),
...                      flavour="tensorrt_rtx")          # doctest: +SKIP
>>> [(b.name, b.dtype, b.shape) for b in built.inputs]    # doctest: +SKIP
[('input', 'float32', (3, 4))]
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from pyrt.errors import ExportError
from pyrt.export._tensorrt.config import configure
from pyrt.export._tensorrt.flavour import (
    BuildOptions,
    Session,
    build_options,
    logged_errors,
    open_session,
)
from pyrt.export._tensorrt.network import bindings, parse, parse_over_module_weights, strongly_typed_network
from pyrt.export._tensorrt.serialize import (
    Writable,
    build_in_memory,
    build_to_stream,
    can_stream,
    stream_writer,
    weight_bytes,
    write_out,
)
from pyrt.export._tensorrt.shapes import ShapeRange, dynamic_dims, parse_dynamic_shapes
from pyrt.export._tensorrt.torch_onnx import (
    as_module,
    check_examples,
    check_names,
    default_names,
    export_onnx,
    to_half,
)
from pyrt.format.trt_blob import IOBinding

if TYPE_CHECKING:
    import torch

log = logging.getLogger("pyrt.export")

Progress = Callable[[str], None]

STREAM, MEMORY = "stream", "memory"  # BuiltEngine.route: to_stream + IStreamWriter, or IHostMemory
STREAM_MIN = 64 << 20  # weights (bytes) from which a streamed build holds less than an in-memory one
STAGES = ("export_onnx", "parse_onnx", "build_engine", "done")  # what progress() is called with


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
    examples = check_examples(example_inputs)
    module = as_module(gm)
    names = check_names(input_names, len(examples), "input_names") or default_names(module, len(examples))
    check_names(output_names, None, "output_names")
    several = _several(dynamic_shapes)  # with several profiles, the example may sit in any one of them
    shapes = [tuple(x.shape) for x in examples] if len(several) == 1 else None
    profiles = [parse_dynamic_shapes(d, names, shapes) for d in several]
    options = build_options(weight_streaming, workspace, compute_capabilities)
    session = open_session(flavour, options)
    if fp16:
        module, examples = to_half(module, examples)
    with tempfile.TemporaryDirectory(prefix="pyrt-onnx-") as tmp:
        _stage(progress, "export_onnx")
        dims = [sorted({d for p in profiles for d in dynamic_dims(p.get(i))}) for i in range(len(examples))]
        path, weights = export_onnx(module, examples, Path(tmp), input_names, output_names, dims)
        built = _build(session, path, profiles, options, progress, out, weights)
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
    initializers: Mapping[str, Any] | None = None,
) -> BuiltEngine:
    """Build an engine from an ONNX file (its external data beside it).

    ``dynamic_shapes`` keys are ONNX input names or positions (a list of such mappings: one
    optimization profile each). I/O bindings come from
    the parsed network, inputs in the ONNX graph's order. ``out`` as for :func:`build_engine`.
    ``initializers``: ONNX initializer name -> an object with ``data_ptr()`` and ``nbytes`` whose
    bytes are already in memory (and outlive the call): the parser reads those in place instead of
    its own copy from the external data file.

    >>> build_engine_from_onnx("model.onnx", flavour="tensorrt_rtx").flavour  # doctest: +SKIP
    'tensorrt_rtx'
    """
    start = time.perf_counter()
    path = Path(onnx_path)
    if not path.is_file():
        raise ExportError(f"ONNX model {str(path)!r} does not exist or is not a file")
    profiles = [parse_dynamic_shapes(d, None, None) for d in _several(dynamic_shapes)]
    options = build_options(weight_streaming, workspace, compute_capabilities)
    built = _build(open_session(flavour, options), path, profiles, options, progress, out, initializers)
    _stage(progress, "done")
    return replace(built, build_seconds=time.perf_counter() - start)


# -- build -------------------------------------------------------------------------------------


def _several(dynamic_shapes: Any) -> list[Any]:
    """``dynamic_shapes`` as a list of optimization profiles (a list gives several, a mapping one)."""
    if isinstance(dynamic_shapes, (list, tuple)):
        if not dynamic_shapes:
            raise ExportError("dynamic_shapes=[] names no optimization profile")
        return list(dynamic_shapes)
    return [dynamic_shapes]


def _build(session: Session, path: Path, ranges: list[dict[int | str, ShapeRange]],
           options: BuildOptions, progress: Progress | None, out: Writable | None = None,
           weights: Mapping[str, Any] | None = None) -> BuiltEngine:
    trt, builder = session.trt, session.builder
    network = strongly_typed_network(session)
    parser = trt.OnnxParser(network, session.logger)  # must outlive the build: it owns weights
    if parser is None:
        raise ExportError(f"{session.name}.OnnxParser() returned None{logged_errors(session.logger)}")
    _stage(progress, "parse_onnx")
    if weights and callable(getattr(parser, "load_initializer", None)):
        parse_over_module_weights(session, parser, network, path, weights)
    else:
        parse(session, parser, network, path)
    config = configure(session, network, ranges, options)
    _stage(progress, "build_engine")
    started = time.perf_counter()
    inputs, outputs = bindings(network, True), bindings(network, False)
    streams = can_stream(builder) and weight_bytes(path, weights) >= STREAM_MIN
    writer = stream_writer(trt, out) if out is not None and streams else None
    if writer is not None:
        size = build_to_stream(session, network, config, writer, path, options)
        engine, route = None, STREAM
    else:
        engine = build_in_memory(session, network, config, path, options)
        size, route = engine.nbytes, MEMORY
        if out is not None:
            write_out(session, out, engine, path)
            engine = None  # the last reference to IHostMemory: TensorRT frees the engine now
    log.info("%s engine build took %.2f s (%s)", session.name, time.perf_counter() - started, route)
    return BuiltEngine(engine, inputs, outputs, options.weight_streaming, session.name, 0.0, size, route)


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
