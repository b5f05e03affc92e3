"""``to_pte``: PyTorch model (or Torch-TensorRT program) -> .pte with TensorRT delegates.

Flow: torch.export -> core ATen -> partitions (engines) and fallback ops ->
one engine per partition, spilled to disk -> a graph whose engine nodes read
their engine from a uint8 tensor attribute (``get_attr``) -> torch.export
again -> ExecuTorch ``to_edge_transform_and_lower`` with
:class:`~pyrt.export.backend.TensorRTPartitioner` -> ``to_executorch``
(delegate blobs in segments) -> atomic write. A program that is one engine
call between its inputs and outputs skips ExecuTorch's lowering: the same
file is written by :mod:`pyrt.export._write.direct`.

>>> import torch
>>> summary = to_pte(torch.nn.Linear(4, 2), "lin.pte", (torch.randn(3, 4),),
...                  builder="reference")                       # doctest: +SKIP
>>> [(e.name, e.device) for e in summary.engines]                # doctest: +SKIP
[('engine_0', 'cuda:0')]
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from pyrt.errors import ExportError
from pyrt.export._engines.engine_graph import stage_engines
from pyrt.export._engines.progress import Progress
from pyrt.export._files.engine_store import EngineStore
from pyrt.export._files.tempfiles import sigterm_cleans, sweep
from pyrt.export._write.lower import Lowered, lower, reexport
from pyrt.export.options import (
    DEFAULT_BUILDER,
    DEFAULT_DEVICE,
    DEFAULT_MIN_BLOCK_SIZE,
    DEFAULT_WRITER,
    ExportOptions,
    make_options,
)
from pyrt.export.summary import EngineSummary, ExportSummary, QuantSummary
from pyrt.format.weight_quant import DEFAULT_GROUP_SIZE
from pyrt.logs import third_party_quiet

log = logging.getLogger("pyrt.export")


def to_pte(
    model_or_exported_program: Any,
    path: str | Path,
    example_inputs: tuple[Any, ...] | None = None,
    *,
    torch_executed_ops: Any = (),
    min_block_size: int = DEFAULT_MIN_BLOCK_SIZE,
    device: Any = DEFAULT_DEVICE,
    weight_streaming: bool = False,
    weight_streaming_budget: Any = None,
    builder: str = DEFAULT_BUILDER,
    dynamic_shapes: Any = None,
    compile_specs: Any = None,
    progress: bool | Progress | None = None,
    writer: str = DEFAULT_WRITER, external_weights: bool = False, profiles: Any = None,
    quantize: str | None = None, group_size: int = DEFAULT_GROUP_SIZE,
) -> ExportSummary:
    """Export a model to a .pte whose TensorRT-able parts run as TensorRT engines.

    ``model_or_exported_program``: an ``nn.Module`` (exported with ``example_inputs`` and
    ``dynamic_shapes``), a ``torch.export.ExportedProgram``, or a Torch-TensorRT compiled
    program (``tensorrt::execute_engine`` nodes; its engines are kept as they are).
    ``torch_executed_ops``: operators (``"aten.relu.default"``, ``torch.ops.aten.relu``, ...) forced to run in
    ExecuTorch; ops no builder can build fall back too. ``min_block_size``: fewest compute ops worth an engine.
    ``device``: engines' CUDA device; a device, a mapping (partition index or name, or
    ``"*"`` -> device) or a callable ``PartitionInfo -> device``. Torch-TensorRT engines
    keep the device recorded in each engine.
    ``weight_streaming``: streamable weights; ``weight_streaming_budget``: bytes per engine (int, mapping, callable).
    ``dynamic_shapes``: torch.export's, for an ``nn.Module`` (an ExportedProgram keeps its own).
    ``builder``: "auto" (tensorrt, else tensorrt_rtx), "tensorrt", "tensorrt_rtx", "reference".
    ``compile_specs``: extra raw compile specs for every delegate.
    ``progress``: None = bar on a TTY, True/False = force on/off (always logged to "pyrt.export").
    ``writer``: "pyrt" streams engines from disk, "executorch" uses ExecuTorch's in-memory writer.
    ``external_weights``: the weights of operators that run in ExecuTorch go to a ``.ptd`` beside
    the .pte (``model.pte`` -> ``model.ptd``), keyed by name, for ``Program(path, data=...)`` and
    ExecuTorch's ``load_program(path, data_path=...)``; engines keep theirs inside the .pte.
    ``profiles``: ``[{input: {"min", "opt", "max"}}, ...]``: one optimization profile each (``_engines/profiles.py``).
    ``quantize``: None, "int8", "int4": weight-only quantization of the engines' linear layers, one scale per
    ``group_size`` inputs of an output row, else per row (``pyrt.format.weight_quant``; README "Quantized weights").

    What runs in engines is what torch.onnx can export (docs/engine_building.md,
    "Partitioning"); ``summary.fallback_reasons`` says why each other op runs in ExecuTorch.
    Buffers the model mutates (a static KV cache) become program state kept in the engines'
    device memory; a model that mutates its inputs is refused.

    Returns an :class:`ExportSummary`. Raises ExportError (or BudgetError) on bad options,
    before any work, and on partitioning problems before any engine is built; the file at
    ``path`` is replaced atomically or left untouched.
    """
    started = time.perf_counter()
    options = make_options(torch_executed_ops=torch_executed_ops, min_block_size=min_block_size, device=device,
                           weight_streaming=weight_streaming, weight_streaming_budget=weight_streaming_budget,
                           builder=builder, dynamic_shapes=dynamic_shapes, compile_specs=compile_specs,
                           progress=progress, writer=writer, external_weights=external_weights, profiles=profiles,
                           quantize=quantize, group_size=group_size)
    summary = write_pte(model_or_exported_program, path, options, example_inputs)
    return replace(summary, seconds=time.perf_counter() - started)


def write_pte(model: Any, path: str | Path, options: ExportOptions, example_inputs: tuple[Any, ...] | None = None,
              constant_methods: dict[str, Any] | None = None) -> ExportSummary:
    """:func:`to_pte` with its options made already (:func:`~pyrt.export.options.make_options`, by the entry point
    that took them); ``constant_methods``: ExecuTorch constant methods (name -> value) written beside ``forward``."""
    started = time.perf_counter()
    target = _target(path)
    engines, lowered, reasons = _write(model, example_inputs, options, target, constant_methods)
    return ExportSummary(str(target), lowered.file_size, tuple(engines), dict(lowered.fallback_ops),
                         options.builder, time.perf_counter() - started, lowered.data_path, lowered.data_size,
                         reasons, quantization=QuantSummary.merged([e.quantization for e in engines if e.quantization]))


def _write(model: Any, example_inputs: tuple[Any, ...] | None, options: ExportOptions, target: Path,
           constant_methods: dict[str, Any] | None) -> tuple[list[EngineSummary], Lowered, dict[str, str]]:
    """The export's work: engines staged to disk, the engine graph re-exported, lowered and written
    to ``target``. Temporary files go on every exit, SIGTERM included. Returns (engines, what was
    written, fallback op -> reason)."""
    sweep(target.parent)  # temporary files of exports that were killed before they could clean up
    with sigterm_cleans(), third_party_quiet(), EngineStore(target.parent) as store:
        gm, args, engines, original, reasons = stage_engines(model, example_inputs, options, store)
        with options.progress.task("re-exporting the engine graph", stage="write"):
            program = reexport(gm, args, original, options.dynamic_shapes)
        del gm
        lowered = lower(program, engines, store, target, options, constant_methods)
    log.info("wrote %s: %d bytes, %d engine(s)", target, lowered.file_size, len(engines))
    return engines, lowered, reasons


def _target(path: Any) -> Path:
    try:
        target = Path(path)
    except TypeError:
        raise ExportError(f"path={path!r} is not a file path") from None
    if "\0" in str(target):
        raise ExportError(f"path {str(target)!r} contains a NUL byte")
    try:
        if target.is_dir():
            raise ExportError(f"path {str(target)!r} is a directory")
        if not target.parent.is_dir():
            raise ExportError(f"the directory of {str(target)!r} does not exist")
        return target.resolve()
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop (Python < 3.13)
        raise ExportError(f"path {str(target)!r}: {getattr(exc, 'strerror', None) or exc}") from None


__all__ = ["to_pte", "write_pte", "make_options", "ExportOptions", "ExportSummary", "EngineSummary"]
