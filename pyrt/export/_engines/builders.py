"""Builders behind ``to_pte(builder=...)``: "reference", or TensorRT via pyrt.export.trt_builder.

A builder answers two questions: can this FX node go into an engine
(``supports``), and what engine does this partition make (``build``, which
spills the engine to the :class:`EngineStore` and returns its bindings). It is made
once per export with its final settings (the quantization plan, the optimization
profiles of the program's symbols) and never changed.

>>> make_builder("reference").name
'reference'
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import torch
import torch.fx as fx

from pyrt.errors import ExportError
from pyrt.export import reference_builder, trt_builder
from pyrt.export._engines import onnx_quant
from pyrt.export._engines.dims import check_outputs, hint_shape, is_dynamic, min_opt_max, shape_ranges
from pyrt.export._engines.profiles import activation_bytes, input_bounds
from pyrt.export._engines.to_onnx import Unavailable, export_partition
from pyrt.export._files.engine_store import EngineRecord, EngineStore
from pyrt.export._graph.fx import graph_copy
from pyrt.export._graph.partition import Extracted
from pyrt.export._graph.passes import onnx_translates
from pyrt.export._graph.quantize import quantize_partition
from pyrt.export._tensorrt.flavour import resolve_flavour
from pyrt.export.summary import QuantSummary
from pyrt.export.trt_builder import BuiltEngine, Progress, Writable
from pyrt.format.trt_blob import IOBinding
from pyrt.format.weight_quant import Scheme

log = logging.getLogger("pyrt.export")


@dataclass
class Built:
    record: EngineRecord
    inputs: list[IOBinding]
    outputs: list[IOBinding]
    streamable: bool
    flavour: str
    quantization: QuantSummary | None = None


def quantized_module(part: Extracted, scheme: Scheme | None) -> tuple[fx.GraphModule, QuantSummary | None]:
    """The module an engine is built from: the partition's own, or a copy with its linear weights quantized."""
    if scheme is None:
        return part.module, None
    module = graph_copy(part.module)
    module.meta.update(part.module.meta)
    summary = quantize_partition(module, scheme)
    return module, summary


class BuildFailed(ExportError):
    """A partition could not be built; its ops fall back to ExecuTorch."""


SymbolProfiles = list[dict[Any, tuple[int, int, int]]]  # per profile: each symbol -> (min, opt, max)


def make_builder(flavour: str | ModuleType, quantize: Scheme | None = None,
                 symbol_profiles: SymbolProfiles | None = None) -> Builder:
    """The builder of ``flavour`` ("reference", a TensorRT flavour's name, or the TensorRT module
    :class:`~pyrt.export.options.ExportOptions` found), with its final settings: ``quantize`` (to_pte(quantize=...))
    and ``symbol_profiles`` (to_pte(profiles=...), per profile)."""
    if flavour == "reference":
        return ReferenceBuilder(quantize, symbol_profiles)
    module = flavour if isinstance(flavour, ModuleType) else resolve_flavour(flavour)
    return TensorRTBuilder(module, quantize, symbol_profiles)


def converts(node: fx.Node) -> bool:
    """What TensorRT can take: ops torch.onnx translates (the route every builder's engines
    go through on a GPU); everything when torch.onnx's registry is unavailable."""
    return onnx_translates(node.target) is not False


@dataclass(frozen=True)
class ReferenceBuilder:
    """Reference engines (``PYRTREF1``) for pyrt.sim's fake TensorRT.

    It accepts exactly what the TensorRT builders accept, so both partition a graph
    the same way; every such op must encode (``reference_builder.supports``).
    """

    quantize: Scheme | None = None
    symbol_profiles: SymbolProfiles | None = None
    name: ClassVar[str] = "reference"

    def supports(self, node: fx.Node) -> bool:
        return converts(node) and reference_builder.supports(node)

    def build(self, part: Extracted, key: str, store: EngineStore, *, weight_streaming: bool,
              progress: Progress | None = None) -> Built:
        limits = part.module.meta.get("range_constraints")
        profiles = [reference_builder.Profile(shape_ranges(a.meta["val"], a.name, limits)) for a in part.inputs]
        check_outputs(part)
        io: dict[str, Any] = {}
        several = None
        if self.symbol_profiles:
            several = [([input_bounds(a.meta["val"], sym) for a in part.inputs], activation_bytes(part.module, sym))
                       for sym in self.symbol_profiles]
            profiles = [reference_builder.Profile(tuple(
                (min(p[0][k][0][d] for p in several), max(p[0][k][2][d] for p in several))
                for d in range(len(a.meta["val"].shape)))) for k, a in enumerate(part.inputs)]

        module, quantized = quantized_module(part, self.quantize)

        def write(sink: Any) -> None:
            io["bindings"] = reference_builder.build(module, profiles, sink, weight_streaming=weight_streaming,
                                                     several=several)

        record, seconds = _timed(lambda: store.add_stream(key, write))
        record.build_seconds = seconds
        record.extra["route"] = "stream"  # the reference builder writes straight into the spill file
        inputs, outputs = io["bindings"]
        has_weights = any(n.op == "get_attr" for n in module.graph.nodes)
        return Built(record, inputs, outputs, weight_streaming and has_weights, "reference", quantized)


@dataclass(frozen=True)
class TensorRTBuilder:
    """Builds through ``pyrt.export.trt_builder.build_engine`` (ONNX -> TensorRT / TensorRT-RTX) with ``module``,
    the TensorRT flavour found for the export."""

    module: ModuleType
    quantize: Scheme | None = None
    symbol_profiles: SymbolProfiles | None = None

    @property
    def name(self) -> str:
        return self.module.__name__.split(".")[0]

    def supports(self, node: fx.Node) -> bool:
        return converts(node)

    def build(self, part: Extracted, key: str, store: EngineStore, *, weight_streaming: bool,
              progress: Progress | None = None) -> Built:
        vals = [a.meta["val"] for a in part.inputs]
        limits = part.module.meta.get("range_constraints")
        ranges: dict[int | str, dict[str, list[int]]] = {
            i: min_opt_max(v, a.name, limits)
            for i, (v, a) in enumerate(zip(vals, part.inputs, strict=True)) if is_dynamic(v)}
        check_outputs(part)
        several = [{i: dict(zip(("min", "opt", "max"), map(list, input_bounds(v, sym)), strict=True))
                    for i, v in enumerate(vals) if is_dynamic(v)} for sym in self.symbol_profiles or []]
        shapes: Any = several or ranges
        names = [f"input_{i}" for i in range(len(vals))]
        outs = [f"output_{i}" for i in range(len(part.outputs))]
        result: dict[str, Any] = {}
        module, quantized = quantized_module(part, self.quantize)
        lifted = onnx_quant.lift(module) if quantized is not None else []

        def write(sink: Any) -> None:  # the engine goes to its spill file as TensorRT serializes it
            try:
                result["built"] = self._build_direct(module, lifted, shapes, names, outs, weight_streaming, progress,
                                                     sink)
            except Unavailable as exc:
                if lifted:
                    raise BuildFailed(f"quantized engines are built through pyrt's ONNX translation, which is "
                                      f"unavailable here: {exc}") from exc
                log.debug("direct ONNX translation unavailable (%s); using torch.onnx.export", exc)
                examples = [_example(v, a.name, limits) for v, a in zip(vals, part.inputs, strict=True)]
                result["built"] = trt_builder.build_engine(
                    module, examples, flavour=self.module,
                    weight_streaming=weight_streaming, dynamic_shapes=shapes or None, input_names=names,
                    output_names=outs, progress=progress, out=sink)

        try:
            record = store.add_stream(key, write)
        except ExportError as exc:
            raise BuildFailed(str(exc)) from exc
        built = result["built"]
        record.build_seconds = built.build_seconds
        record.extra["route"] = built.route
        return Built(record, list(built.inputs), list(built.outputs), built.streamable_weights, built.flavour,
                     quantized)

    def _build_direct(self, module: fx.GraphModule, lifted: list[onnx_quant.Lifted], ranges: Any, names: list[str],
                      outs: list[str], weight_streaming: bool, progress: Progress | None,
                      out: Writable | None = None) -> BuiltEngine:
        """ONNX straight from the partition's graph (``pyrt.export._engines.to_onnx``), its lifted
        dequantizations put back as INT8 / INT4 constants (:mod:`.onnx_quant`), then parse and build."""
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="pyrt-onnx-") as tmp:
            if progress is not None:
                progress("export_onnx")
            in_memory = callable(getattr(self.module.OnnxParser, "load_initializer", None))
            path, weights = export_partition(module, Path(tmp) / "model.onnx", names + [x.name for x in lifted], outs,
                                             in_memory)
            if lifted:  # the quantized constants go beside the model in their own file; the rest stays referenced
                onnx_quant.attach_dequantize(path, lifted)
            built = trt_builder.build_engine_from_onnx(
                path, flavour=self.module, weight_streaming=weight_streaming,
                dynamic_shapes=_by_name(ranges, names), progress=progress, out=out, initializers=weights)
            del weights
        got = ([b.name for b in built.inputs], [b.name for b in built.outputs])
        if got != (names, outs):
            raise ExportError(f"the {built.flavour} engine binds {got[0]} -> {got[1]}, expected {names} -> {outs}")
        return replace(built, build_seconds=time.perf_counter() - started)


Builder = ReferenceBuilder | TensorRTBuilder  # what make_builder gives


def _by_name(ranges: Any, names: list[str]) -> Any:
    """Ranges keyed by position -> keyed by ONNX input name; a list (several profiles) item by item."""
    if isinstance(ranges, list):
        return [_by_name(r, names) for r in ranges]
    return {names[int(i)]: r for i, r in ranges.items()} or None


def _example(t: torch.Tensor, name: str, constraints: Any = None) -> torch.Tensor:
    return torch.zeros(hint_shape(t, name, constraints), dtype=t.dtype)


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start
