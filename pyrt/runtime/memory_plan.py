"""One GPU memory plan per program: what each device's memory goes to, and ``budget="fit"``.

The weight-streaming budget decides how much of the weights stay on the GPU; what is
left for them is the device's memory minus everything else the program holds. The
plan is made after the engines are deserialized (TensorRT then holds their
non-streamable weights, and reports each engine's activation and streaming-scratch
sizes) and before any execution context exists. Per device:

    free after engines load
      - arenas             the methods' device-resident planned memory
      - activations        one shared area per method (:mod:`pyrt.device.scratch`), else one per engine
      - streaming scratch  TensorRT's staging room of each streaming engine
      - graphs             a reserve per method captured as CUDA graphs (``cuda_graphs=True``)
      - headroom           left free for the caller's tensors (``headroom=``: bytes or a share of the GPU)
      = left for resident weights, split across the device's streamable engines in proportion
        to their streamable bytes (exact integer sum, each clamped to its streamable size)

``budget="fit"`` applies that split. Whatever the budget, a plan whose fixed items do not fit
even at budget 0 is a :class:`~pyrt.errors.ResourceError` naming the largest items, raised
before any context exists (and, for the arenas alone, before any engine is deserialized).

>>> from pyrt.runtime.memory_plan import EngineMemory, plan_memory
>>> engines = [EngineMemory(0, "forward/delegate0", 0, 600, 10, 50, "forward"),
...            EngineMemory(1, "forward/delegate1", 0, 200, 10, 80, "forward")]
>>> plan = plan_memory(engines, {0: (700, 1000)}, headroom="10%")
>>> [(d.available, d.budget) for d in plan.devices], plan.budgets
([(500, 500)], {0: 375, 1: 125})
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

from pyrt.device.scratch import SharedScratch
from pyrt.errors import BudgetError, ResourceError
from pyrt.streaming import BudgetSpec, parse_budget, split_proportionally

__all__ = ["DEFAULT_HEADROOM", "GRAPH_RESERVE_BYTES", "DevicePlan", "EngineMemory", "MemoryPlan",
           "check_arenas", "device_arenas", "engine_memory", "format_bytes", "graph_reserve", "plan_memory"]

DEFAULT_HEADROOM = "5%"  # of each GPU's memory, for the caller's tensors, fragmentation and other libraries
GRAPH_RESERVE_BYTES = 64 << 20  # per captured method and device: a reserve, not a measurement


@dataclass(frozen=True)
class EngineMemory:
    """What one deserialized engine will need on its device, before its context exists."""

    index: int
    name: str
    device: int
    streamable: int
    streaming_scratch: int
    activation: int
    group: str | None  # the shared activation area it belongs to (None: its own)


@dataclass(frozen=True)
class DevicePlan:
    """One device's memory, item by item (bytes)."""

    device: int
    total: int
    free: int  # free once the engines are deserialized, before contexts and arenas
    arenas: int
    activations: int
    activations_unshared: int
    streaming_scratch: int
    graphs: int
    headroom: int
    streamable: int
    budget: int  # streamable weights kept resident (the split of "fit", or what was applied)
    engines: tuple[str, ...] = ()

    @property
    def streamed(self) -> int:
        return self.streamable - self.budget

    @property
    def fixed(self) -> int:
        """Everything but the weights' budget and the headroom."""
        return self.arenas + self.activations + self.streaming_scratch + self.graphs

    @property
    def available(self) -> int:
        """What is left for resident weights (negative: the fixed items do not fit)."""
        return self.free - self.fixed - self.headroom

    @property
    def activation_saved(self) -> int:
        return self.activations_unshared - self.activations

    def items(self) -> list[tuple[str, int]]:
        return [("weights resident (budget)", self.budget), ("weights streamed", self.streamed),
                ("activations (shared)", self.activations), ("streaming scratch", self.streaming_scratch),
                ("arenas", self.arenas), ("graphs", self.graphs), ("headroom", self.headroom)]


@dataclass(frozen=True)
class MemoryPlan:
    """Per device plans, and the budget each streamable engine gets (engine index -> bytes)."""

    devices: tuple[DevicePlan, ...]
    budgets: dict[int, int] = field(default_factory=dict)
    fit: bool = False
    headroom: str = DEFAULT_HEADROOM

    def device(self, index: int) -> DevicePlan:
        for d in self.devices:
            if d.device == index:
                return d
        raise KeyError(index)

    def with_budgets(self, applied: Mapping[int, int | None], engines: Sequence[EngineMemory]) -> MemoryPlan:
        """The same plan, reporting ``applied`` budgets (what TensorRT read back) instead of the split."""
        per_device: dict[int, int] = {}
        for e in engines:
            per_device[e.device] = per_device.get(e.device, 0) + int(applied.get(e.index) or 0)
        return replace(self, devices=tuple(replace(d, budget=per_device.get(d.device, 0)) for d in self.devices),
                       budgets={k: int(v) for k, v in applied.items() if v is not None})

    def explain(self) -> str:
        """How each device's memory was divided, in words."""
        lines = []
        for d in self.devices:
            lines.append(
                f"device {d.device}: {format_bytes(d.total)} GPU, {format_bytes(d.free)} free once the engines "
                f"are loaded; arenas {format_bytes(d.arenas)}, activations {format_bytes(d.activations)} "
                f"(shared; {format_bytes(d.activations_unshared)} unshared), streaming scratch "
                f"{format_bytes(d.streaming_scratch)}, graphs {format_bytes(d.graphs)}, headroom "
                f"{format_bytes(d.headroom)} ({self.headroom}) leave {format_bytes(max(d.available, 0))} for "
                f"weights; {'split' if self.fit else 'budget applied'}: {format_bytes(d.budget)} of "
                f"{format_bytes(d.streamable)} streamable resident across {len(d.engines)} engines")
        return "\n".join(lines)

    def table(self) -> str:
        """The plan as a table: one column per device."""
        rows = [("", *(f"cuda:{d.device}" for d in self.devices)),
                ("GPU memory", *(format_bytes(d.total) for d in self.devices)),
                ("free after engines load", *(format_bytes(d.free) for d in self.devices))]
        for k, (name, _) in enumerate(self.devices[0].items() if self.devices else []):
            rows.append((name, *(format_bytes(d.items()[k][1]) for d in self.devices)))
        rows.append(("activations saved by sharing", *(format_bytes(d.activation_saved) for d in self.devices)))
        width = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        return "\n".join("  ".join(c.ljust(width[0]) if i == 0 else c.rjust(width[i]) for i, c in enumerate(r))
                         for r in rows)

    def as_dict(self) -> dict[str, Any]:
        return {"fit": self.fit, "headroom": self.headroom, "budgets": dict(self.budgets),
                "devices": [{"device": d.device, "total": d.total, "free": d.free, **{
                    k.split(" (")[0].replace(" ", "_"): v for k, v in d.items()},
                    "activations_unshared": d.activations_unshared, "streamable": d.streamable,
                    "engines": list(d.engines)} for d in self.devices]}


def format_bytes(n: int) -> str:
    """``1536 MiB`` -> ``'1.50 GiB'``; exact bytes below 1 KiB."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if abs(n) >= 1 << shift:
            return f"{n / (1 << shift):.2f} {unit}"
    return f"{n} B"


def _headroom(spec: Any, total: int) -> int:
    parsed = parse_budget(spec, source="headroom")
    if parsed is None or parsed.kind == "auto":
        raise BudgetError(f"headroom: {spec!r} must be bytes ('2GiB', 2_000_000_000) or a share of the GPU "
                          f"('5%', 0.05)")
    if parsed.kind == "share":
        share = parsed.value
        assert isinstance(share, Fraction)
        return share.numerator * total // share.denominator
    return int(parsed.value or 0)


def check_headroom(spec: Any) -> None:
    """A BudgetError naming ``spec`` unless it is a valid headroom."""
    _headroom(spec, 0)


def _activations(engines: Sequence[EngineMemory]) -> tuple[int, int]:
    """(bytes with the shared areas, bytes with one area per engine) of one device's engines."""
    groups: dict[str, int] = {}
    own = 0
    for e in engines:
        if e.group is None:
            own += e.activation
        else:
            groups[e.group] = max(groups.get(e.group, 0), e.activation)
    return own + sum(groups.values()), sum(e.activation for e in engines)


def plan_memory(engines: Sequence[EngineMemory], devices: Mapping[int, tuple[int, int]], *,
                arenas: Mapping[int, int] | None = None, graphs: Mapping[int, int] | None = None,
                headroom: Any = DEFAULT_HEADROOM, fit: bool = True, source: str = "memory plan") -> MemoryPlan:
    """The plan for ``engines`` on ``devices`` (ordinal -> (free, total) once the engines are loaded).

    ResourceError naming the largest items when a device's arenas, activations, streaming
    scratch and graphs exceed its free memory even at budget 0 (the headroom aside: it only
    shrinks the weights' share).
    """
    arenas, graphs = arenas or {}, graphs or {}
    plans, budgets = [], {}
    for dev in sorted(set(devices) | {e.device for e in engines} | set(arenas)):
        free, total = devices.get(dev, (0, 0))
        mine = [e for e in engines if e.device == dev]
        shared, unshared = _activations(mine)
        d = DevicePlan(dev, total, free, arenas.get(dev, 0), shared, unshared,
                       sum(e.streaming_scratch for e in mine if e.streamable), graphs.get(dev, 0),
                       _headroom(headroom, total), sum(e.streamable for e in mine), 0, tuple(e.name for e in mine))
        if d.fixed > d.free:
            raise ResourceError(_too_big(d, mine, source))
        streaming = [e for e in mine if e.streamable]
        parts = split_proportionally(max(d.available, 0), [e.streamable for e in streaming])
        budgets.update({e.index: p for e, p in zip(streaming, parts, strict=True)})
        plans.append(replace(d, budget=sum(parts)))
    text = headroom if isinstance(headroom, str) else str(BudgetSpec("bytes", headroom)) if isinstance(
        headroom, int) else f"{float(headroom):.0%}"
    return MemoryPlan(tuple(plans), budgets, fit, text)


def _too_big(d: DevicePlan, engines: Sequence[EngineMemory], source: str) -> str:
    items = [("arenas", d.arenas), ("graph reserve", d.graphs)]
    items += [(f"{e.name} activations", e.activation) for e in engines]
    items += [(f"{e.name} streaming scratch", e.streaming_scratch) for e in engines if e.streamable]
    largest = sorted((i for i in items if i[1]), key=lambda i: -i[1])[:4]
    named = ", ".join(f"{what} {format_bytes(n)}" for what, n in largest)
    return (f"{source}: device {d.device} cannot hold the program even with every weight streamed: "
            f"{format_bytes(d.fixed)} needed beside the weights ({named}; activations "
            f"{format_bytes(d.activations)} shared), {format_bytes(d.free)} free of {format_bytes(d.total)} "
            f"once the engines are loaded")


def check_arenas(arenas: Mapping[int, int], devices: Mapping[int, tuple[int, int]], source: str) -> None:
    """ResourceError before any engine is deserialized when a device's arenas alone exceed its free memory."""
    for dev, need in sorted(arenas.items()):
        free, total = devices.get(dev, (0, 0))
        if need > free:
            raise ResourceError(f"{source}: device {dev} cannot hold the program's device arenas: "
                                f"{format_bytes(need)} needed, {format_bytes(free)} free of {format_bytes(total)}")


def engine_memory(delegates: Sequence[Any]) -> list[EngineMemory]:
    """The facts of every loaded engine of ``delegates`` (:class:`pyrt.runtime.delegates.TensorRTDelegate`)."""
    out = []
    for d in delegates:
        e = d.engine
        out.append(EngineMemory(d.global_index, d.name, d.device, e.streamable_weights_size,
                                e.weight_streaming_scratch_memory_size, e.activation_bytes,
                                None if e.scratch is None else e.scratch.label))
    return out


def device_arenas(load_plans: Sequence[Any]) -> dict[int, int]:
    """device -> bytes of the methods' device-resident planned arenas (:class:`MethodLoadPlan`\\ s)."""
    out: dict[int, int] = {}
    for load_plan in load_plans:
        sizes = load_plan.xplan.non_const_buffer_sizes
        for mem, dev in load_plan.arena_devices.items():
            out[dev] = out.get(dev, 0) + int(sizes[mem])
    return out


def graph_reserve(load_plans: Sequence[Any], cuda_graphs: bool) -> dict[int, int]:
    """device -> the CUDA-graph reserve: :data:`GRAPH_RESERVE_BYTES` per method using it (when captured)."""
    out: dict[int, int] = {}
    if cuda_graphs:
        for load_plan in load_plans:
            for dev in {d.device for d in load_plan.delegates}:
                out[dev] = out.get(dev, 0) + GRAPH_RESERVE_BYTES
    return out


def share_scratch(delegates: Sequence[Any], cuda: Any) -> list[SharedScratch]:
    """One :class:`SharedScratch` per (method, device): engines that never run at the same time."""
    groups: dict[tuple[str, int], SharedScratch] = {}
    for d in delegates:
        key = (d.method, d.device)
        if key not in groups:
            groups[key] = SharedScratch(cuda, d.device, f"method {d.method!r} on device {d.device}")
        groups[key].join(d.engine)
        d.engine.scratch = groups[key]
    return list(groups.values())


def scratches(delegates: Sequence[Any]) -> list[SharedScratch]:
    """The shared activation scratches of ``delegates``' engines, each once."""
    out: list[SharedScratch] = []
    for d in delegates:
        s = getattr(d.engine, "scratch", None)
        if s is not None and all(s is not o for o in out):
            out.append(s)
    return out


def close_engines(delegates: Sequence[Any]) -> None:
    """Close every engine (contexts first), then free the activation memory they shared."""
    shared = scratches(delegates)
    for d in delegates:
        if d.engine is not None:
            d.engine.close()
            d.engine = None
    for s in shared:
        s.close()
