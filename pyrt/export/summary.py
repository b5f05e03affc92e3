"""What ``to_pte`` returns: the engines it wrote and what runs outside them.

>>> s = ExportSummary("m.pte", 4096, (), {"aten::relu": 1}, "reference", 0.5,
...                   fallback_reasons={"aten::relu": "forced by torch_executed_ops (aten::relu)"})
>>> print(s)
m.pte: 4.0 KiB, 0 engine(s), builder reference, 0.50 s
fallback ops (run in ExecuTorch): aten::relu x1
  aten::relu: forced by torch_executed_ops (aten::relu)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyrt.format.trt_blob import IOBinding
from pyrt.format.weight_quant import SpecInfo

if TYPE_CHECKING:
    from pyrt.export._files.engine_store import EngineRecord
    from pyrt.export._graph.spec import EngineSpec
    from pyrt.export.stage_meter import StageRecord


LISTED = 6  # layer names a summary line lists before "and N more"


@dataclass(frozen=True)
class QuantizedLayer:
    """One quantized linear layer: its weight's name in the model, ``[rows, cols]`` = [out, in] features,
    its group (``cols``: one scale per row), the bytes of its stored values and of its scales."""

    name: str
    rows: int
    cols: int
    group: int
    value_bytes: int
    scale_bytes: int
    values: str = ""  # the engine's weight names for the stored values and the scales
    scales: str = ""
    transposed: bool = False

    @property
    def per_row(self) -> bool:
        return self.group == self.cols


@dataclass
class QuantSummary:
    """An engine's weight quantization: the layers quantized (and which got one scale per row), the layers
    left in the model's dtype and why, the bytes of both (``other_bytes``: the engine's float weights)."""

    scheme: str
    group_size: int
    layers: list[QuantizedLayer] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    other_bytes: int = 0

    @property
    def weight_bytes(self) -> int:
        return sum(q.value_bytes + q.scale_bytes for q in self.layers)

    @property
    def per_row(self) -> list[str]:
        return [q.name for q in self.layers if q.per_row]

    @classmethod
    def merged(cls, parts: list[QuantSummary]) -> QuantSummary | None:
        """One summary of several engines' (None when there are none)."""
        if not parts:
            return None
        out = cls(parts[0].scheme, parts[0].group_size)
        for p in parts:
            out.layers += p.layers
            out.skipped += p.skipped
            out.other_bytes += p.other_bytes
        return out

    def stored_names(self) -> set[str]:
        return {n for q in self.layers for n in (q.values, q.scales)}

    def spec(self) -> SpecInfo:
        """What the engine's compile spec says (:data:`pyrt.format.weight_quant.SPEC_KEY`)."""
        return SpecInfo(self.scheme, self.group_size, len(self.layers), len(self.per_row), self.weight_bytes,
                        self.other_bytes)

    def __str__(self) -> str:
        names = self.per_row
        listed = ", ".join(names[:LISTED]) + (f" and {len(names) - LISTED} more" if len(names) > LISTED else "")
        rows = f"; one scale per row (input size not a multiple of {self.group_size}): {listed}"
        text = (f"{self.scheme} g{self.group_size}: {len(self.layers)} linear layer(s), {_size(self.weight_bytes)} "
                f"values + scales, {_size(self.other_bytes)} other weights" + (rows if self.per_row else ""))
        return text + "".join(f"; kept {name} ({why})" for name, why in self.skipped)


@dataclass(frozen=True)
class EngineSummary:
    """One engine: ``size`` is the serialized engine's bytes (the TR01 blob adds a small header).

    ``route``: how the engine reached disk: "stream" (written as it was serialized),
    "memory" (a TensorRT without a stream writer returned it whole, then it was spilled),
    or "" (a converted Torch-TensorRT engine).
    """

    name: str
    key: str
    size: int
    device: str
    flavour: str
    weight_streaming_budget: int | None
    streamable_weights: bool
    build_seconds: float
    ops: tuple[str, ...]
    inputs: tuple[IOBinding, ...]
    outputs: tuple[IOBinding, ...]
    source: str  # "built" by pyrt or "converted" from a Torch-TensorRT engine
    route: str = ""
    # outputs whose shape only the run knows (nonzero, masked_select, ...): name -> the upper-bound
    # shape the program plans them at (ExecuTorch's DYNAMIC_BOUND)
    bounded_outputs: tuple[tuple[str, tuple[int, ...]], ...] = ()
    quantization: QuantSummary | None = None  # to_pte(quantize=...): what the engine's linear layers became
    layers: str = ""  # max_engine_size: the decoder layers this engine holds ("0-3", "4-7+head"; "": no cut)
    weight_bytes: int = 0  # bytes of the weights its partition carried (before quantization)
    released_bytes: int = 0  # file-backed weight pages (a checkpoint's) dropped from the process after its build

    @classmethod
    def of(cls, name: str, record: EngineRecord, spec: EngineSpec, ops: tuple[str, ...], source: str,
           bounded_outputs: tuple[tuple[str, tuple[int, ...]], ...] = ()) -> EngineSummary:
        return cls(name, record.key, record.size, spec.device, spec.flavour, spec.budget, spec.streamable,
                   record.build_seconds, ops, spec.inputs, spec.outputs, source, record.extra.get("route", ""),
                   bounded_outputs, record.extra.get("quantization"),
                   released_bytes=record.extra.get("released_bytes", 0))


@dataclass(frozen=True)
class ExportSummary:
    """The written file(s), its engines and the operators left to ExecuTorch.

    ``fallback_ops``: ExecuTorch operator name -> count in the lowered program.
    ``fallback_reasons``: operator name -> why partitioning left it out of engines
    (forced by torch_executed_ops, no converter, build failed: ..., ...), for the
    operators as partitioning saw them (ExecuTorch may decompose them further).
    """

    path: str
    file_size: int
    engines: tuple[EngineSummary, ...]
    fallback_ops: dict[str, int]
    builder: str
    seconds: float
    data_path: str | None = None  # the .ptd written beside the .pte (external_weights=True)
    data_size: int = 0
    fallback_reasons: dict[str, str] = field(default_factory=dict)
    route: str = ""  # decoder_to_pte: how the decoder was wrapped, "pyrt" or "upstream"
    route_reason: str = ""  # why that route (the upstream route's failure, or the caller's choice)
    constant_methods: dict[str, Any] = field(default_factory=dict)  # ExecuTorch's LLM metadata methods
    quantization: QuantSummary | None = None  # quantize=...: every engine's (or the portable program's) layers
    stages: tuple[StageRecord, ...] = ()  # checkpoint_to_pte: time and memory of load, export, build, write
    tokenizer: str | None = None  # checkpoint_to_pte: the tokenizer folder kept beside the .pte
    grouping: str = ""  # decoder_to_pte: one engine or layer groups, and why (pyrt.export.engine_size)

    def __str__(self) -> str:
        lines = [f"{self.path}: {_size(self.file_size)}, {len(self.engines)} engine(s), builder {self.builder}, "
                 f"{self.seconds:.2f} s"]
        if self.data_path is not None:
            lines.append(f"external weights: {self.data_path}: {_size(self.data_size)}")
        for e in self.engines:
            budget = "" if e.weight_streaming_budget is None else f", budget {_size(e.weight_streaming_budget)}"
            layers = f", layers {e.layers}, {_size(e.weight_bytes)} of weights" if e.layers else ""
            lines.append(f"  {e.name}: {_size(e.size)} on {e.device} ({e.flavour}, {len(e.ops)} op kinds, "
                         f"{len(e.inputs)} in / {len(e.outputs)} out{budget}{layers})")
            lines.extend(f"    {out}: data-dependent shape, planned at its bound {list(shape)}"
                         for out, shape in e.bounded_outputs)
            if e.quantization is not None:
                lines.append(f"    weights: {e.quantization}")
        if self.quantization is not None and not self.engines:
            lines.append(f"weights: {self.quantization}")
        ops = ", ".join(f"{k} x{v}" for k, v in sorted(self.fallback_ops.items())) or "none"
        lines.append(f"fallback ops (run in ExecuTorch): {ops}")
        lines.extend(f"  {op}: {why}" for op, why in sorted(self.fallback_reasons.items()))
        if self.grouping:
            lines.append(f"engines: {self.grouping}")
        if self.route:
            lines.append(f"decoder route: {self.route}" + (f" ({self.route_reason})" if self.route_reason else ""))
        if self.constant_methods:
            lines.append("constant methods: " + ", ".join(f"{k}={v!r}" for k, v in self.constant_methods.items()))
        if self.tokenizer:
            lines.append(f"tokenizer: {self.tokenizer}")
        lines.extend(f"stage {r}" for r in self.stages)
        return "\n".join(lines)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
