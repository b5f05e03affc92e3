"""The engine graph, stage 1 of ``to_pte``: a graph whose engine nodes read their engines from uint8 attributes.

An ``nn.Module`` is exported, an ExportedProgram put through the graph passes
(:mod:`pyrt.export._graph.pass_order`: decomposed to the ops torch.onnx translates, unlifted,
assertions removed, shape arithmetic recomputed from the inputs); partitions are built into
engines (spilled to the EngineStore) and replaced by ``pyrt::execute_engine`` calls, inputs
wired by position. A Torch-TensorRT program instead has its engine calls converted as they are.
"""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from typing import Any

import torch
import torch.fx as fx

from pyrt.errors import ExportError
from pyrt.export import options as opt
from pyrt.export._engines.builders import Builder, BuildFailed, Built, make_builder
from pyrt.export._engines.dims import size_hint
from pyrt.export._engines.profiles import symbol_profiles
from pyrt.export._files.engine_store import EngineStore
from pyrt.export._files.page_release import release_file_pages
from pyrt.export._graph.datadep import bounded_outputs
from pyrt.export._graph.engine_op import execute_engine_op
from pyrt.export._graph.fx import finish, graph_copy, inline_submodules, unlift
from pyrt.export._graph.layer_groups import GroupPlan, cut, spread
from pyrt.export._graph.partition import (
    NON_COMPUTE,
    Extracted,
    UnknownSize,
    check_outputs_live,
    extract,
    has_runtime_input,
    is_tensor_node,
    propose,
    refusal,
    replace_with_engine,
)
from pyrt.export._graph.pass_order import prepare_graph
from pyrt.export._graph.passes import is_sym_node
from pyrt.export._graph.spec import EngineSpec, dim_expr, symbols_from_inputs
from pyrt.export.convert import contains_torchtrt, convert_torchtrt
from pyrt.export.options import ExportOptions, node_op_names
from pyrt.export.summary import EngineSummary

log = logging.getLogger("pyrt.export")


def stage_engines(model: Any, example_inputs: Any, options: ExportOptions, store: EngineStore
                  ) -> tuple[fx.GraphModule, Any, list[EngineSummary], Any, dict[str, str]]:
    """(graph with engine nodes, (args, kwargs) to re-export it with, engine summaries, original program,
    fallback op -> reason)."""
    if isinstance(model, fx.GraphModule) and contains_torchtrt(model):
        _keeps_its_engines(options)
        gm = graph_copy(model)  # the caller's module stays as it was
        inline_submodules(gm)
        engines = convert_torchtrt(gm, None, options, store)
        return gm, (_args(example_inputs), {}), engines, None, {}
    program = _program(model, example_inputs, options)
    if contains_torchtrt(program.graph_module):
        _keeps_its_engines(options)
        gm = unlift(program)
        engines = convert_torchtrt(gm, program, options, store)
        return gm, _example_args(program, example_inputs), engines, program, {}
    profiles = None if options.profiles is None else symbol_profiles(program, options.profiles)
    builder = make_builder(options.flavour, options.quantize, profiles)
    program, gm, forced = prepare_graph(program, options.forced_fallback, options.progress)
    _release_weights(program)
    engines, reasons = _partition_and_build(gm, builder, options, store, forced,
                                            gm.meta.get("mutable_buffers", frozenset()))
    return gm, _example_args(program, example_inputs), engines, program, reasons


def _program(model: Any, example_inputs: Any, options: ExportOptions) -> torch.export.ExportedProgram:
    """The program to build engines for: ``model`` itself, or an ``nn.Module`` exported."""
    if isinstance(model, torch.export.ExportedProgram):
        return model
    if not isinstance(model, torch.nn.Module):
        raise ExportError(f"to_pte needs an nn.Module or an ExportedProgram, got {type(model).__name__}")
    with options.progress.task("exporting with torch.export", stage="export"):
        return _export(model, example_inputs, options.dynamic_shapes)


def _release_weights(program: torch.export.ExportedProgram) -> None:
    """torch.export may have read every weight (a 7B checkpoint's 13 GB of mapped pages were all resident after
    it): their file pages leave the process before the first build, which reads back only its own group's."""
    released = release_file_pages([*program.state_dict.values(), *program.constants.values()])
    if released:
        log.info("%d MiB of file-backed weight pages released before the engine builds", released >> 20)


def _keeps_its_engines(options: ExportOptions) -> None:
    """A Torch-TensorRT program's engines are kept as they were built: ``quantize=`` cannot apply to them."""
    if options.quantize is not None:
        raise ExportError(f"quantize={options.quantize.name!r}: a Torch-TensorRT program's engines are kept as they "
                          "were built; quantize the model before compiling it, or export the model itself")


def _args(example_inputs: Any) -> tuple[Any, ...]:
    if example_inputs is None:
        raise ExportError("example_inputs are required to export an nn.Module")
    return tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)


def _export(model: torch.nn.Module, example_inputs: Any, dynamic_shapes: Any) -> torch.export.ExportedProgram:
    """torch.export in eval mode (the caller's module gets its training flag back afterwards)."""
    args = _args(example_inputs)
    training = model.training
    model.eval()
    try:
        return torch.export.export(model, args, dynamic_shapes=dynamic_shapes, strict=False)
    except Exception as exc:  # torch.export raises many error types
        raise ExportError(f"torch.export failed for {type(model).__name__}: {type(exc).__name__}: {exc}") from exc
    finally:
        model.train(training)


def _example_args(program: torch.export.ExportedProgram, example_inputs: Any) -> tuple[Any, Any]:
    """(args, kwargs) for re-export: the program's own examples, else zeros shaped like its inputs."""
    if program.example_inputs is not None:
        return program.example_inputs
    if example_inputs is not None and program.call_spec.in_spec is None:
        return _args(example_inputs), {}
    user = set(program.graph_signature.user_inputs)
    leaves = [_zeros_like(n.meta.get("val")) for n in program.graph.nodes if n.op == "placeholder" and n.name in user]
    if program.call_spec.in_spec is None:
        return tuple(leaves), {}
    return torch.utils._pytree.tree_unflatten(leaves, program.call_spec.in_spec)


def _zeros_like(val: Any) -> Any:
    if not isinstance(val, torch.Tensor):
        return val
    shape = [size_hint(d, "example input", i) for i, d in enumerate(val.shape)]
    return torch.zeros(shape, dtype=val.dtype)


class _Planner:
    """Partitions -> engines, with a reason for every op left to ExecuTorch.

    Every partition is extracted and checked before any engine is built (an engine
    output ExecuTorch would drop is an ExportError naming the nodes). A partition
    that fails to build has its culprit ops found (named in the error, else by
    building each op alone, cached) and moved out; the rest is partitioned again.
    """

    def __init__(self, gm: fx.GraphModule, builder: Builder, options: ExportOptions, store: EngineStore,
                 forced: dict[fx.Node, str], state_inputs: frozenset[str] = frozenset(),
                 groups: GroupPlan | None = None) -> None:
        self.gm, self.builder, self.options, self.store = gm, builder, options, store
        self.forced, self.state_inputs, self.groups = forced, state_inputs, groups
        self.regions = None if groups is None else groups.regions()  # max_engine_size: no engine spans two groups
        self.blocked: dict[fx.Node, str] = {}
        self.built: dict[tuple[str, ...], tuple[Extracted, Built]] = {}
        self.probes: dict[Any, bool] = {}
        self.extracted: dict[tuple[str, ...], Extracted] = {}

    def supported(self, node: fx.Node) -> bool:
        return node not in self.blocked and refusal(node, self.forced) is None and self.builder.supports(node)

    def plan(self) -> list[Extracted]:
        """Partitions that extract cleanly: sizes known, outputs expressible, all outputs live.

        Every round that does not return blocks at least one more node (else ExportError),
        so this ends after at most as many rounds as the graph has nodes; a partition that
        did not change since an earlier round is not extracted again.
        """
        while True:
            groups = propose(self.gm, self.supported, self.options.min_block_size, self.regions)
            try:
                parts = [self._extract(g) for g in groups]
            except UnknownSize as exc:
                if not exc.users:
                    raise ExportError(str(exc)) from None
                self._block(exc.users, f"needs a size no engine input determines: {exc}")
                continue
            unexpressible = [o for p in parts for o in _unexpressible_outputs(p)]
            if unexpressible:
                self._block(unexpressible, "data-dependent output shape")
                continue
            check_outputs_live(self.gm, parts)
            return parts

    def _extract(self, nodes: list[fx.Node]) -> Extracted:
        key = tuple(n.name for n in nodes)
        if key in self.built:
            return self.built[key][0]
        if key not in self.extracted:
            self.extracted[key] = extract(self.gm, nodes, self.state_inputs)
        return self.extracted[key]

    def _block(self, nodes: Any, reason: str) -> None:
        """Keep ``nodes`` out of engines (a getitem by its producer: the partitioner follows that)."""
        fresh = []
        for n in nodes:
            if n.op == "call_function" and n.target in NON_COMPUTE and isinstance(n.args[0], fx.Node):
                n = n.args[0]
            if n not in self.blocked:
                self.blocked[n] = reason
                fresh.append(n)
        if not fresh:  # the next round would propose the same partitions again
            names = ", ".join(sorted({n.name for n in nodes}))
            raise ExportError(f"partitioning made no progress: {names} already left engines ({reason})")

    def run(self) -> list[tuple[Extracted, Built]]:
        while True:
            parts = self.plan()
            done = []
            for part in parts:
                key = tuple(n.name for n in part.nodes)
                if key not in self.built:
                    built, error = _build_one(self.builder, part, f"b{len(self.store.records)}", self.store,
                                              self.options)
                    if built is None:
                        self._block(self._culprits(part, error), f"build failed: {_short(error)}")
                        break
                    self.built[key] = (part, built)
                done.append(self.built[key])
            else:
                return done

    def _culprits(self, part: Extracted, error: str) -> list[fx.Node]:
        """The nodes to move out after ``part`` failed to build."""
        named = [n for n in part.nodes if _mentions(error, n)]
        if named:
            return _with_items(named)
        failing = [n for n in part.nodes if n.target not in NON_COMPUTE and not self._probe(n)]
        if failing:
            ops = sorted({str(n.target) for n in failing})
            log.info("%s: ops that fail alone: %s", self.builder.name, ", ".join(ops))
            return _with_items(failing)
        return list(part.nodes)

    def _probe(self, node: fx.Node) -> bool:
        """Does ``node`` build as an engine on its own? (cached per op and argument signature)"""
        key = (node.target, _signature(node))
        if key not in self.probes:
            try:
                nodes = _with_items([node])
                single = extract(self.gm, nodes, self.state_inputs)
            except ExportError:
                single = None
            if single is None or not has_runtime_input(nodes):
                self.probes[key] = True  # cannot be tried alone: do not blame it
                return True
            built, _ = _build_one(self.builder, single, f"probe{len(self.store.records)}", self.store,
                                  self.options, quiet=True)
            self.probes[key] = built is not None
        return self.probes[key]

    def reasons(self, parts: list[tuple[Extracted, Built]]) -> dict[str, str]:
        """Op name (``aten::relu``) -> why its nodes outside engines are there."""
        inside = {n for part, _ in parts for n in part.nodes}
        out: dict[str, list[str]] = {}
        for node in self.gm.graph.nodes:
            if node.op != "call_function" or node in inside or node.target in NON_COMPUTE or is_sym_node(node):
                continue
            if node.target is torch.ops.aten.copy_.default and str(node.args[0].target) in self.state_inputs:
                continue  # a buffer's write-back (ExecuTorch's mutable-buffer copy), not a fallback op
            names = node_op_names(node.target)
            if names is None:
                continue
            why = self.blocked.get(node) or refusal(node, self.forced)
            if why is None and not self.builder.supports(node):
                why = f"{NO_CONVERTER} ({self.builder.name} cannot take {names[0]})"
            why = why or (f"in a block smaller than min_block_size={self.options.min_block_size} "
                          "or fed only by constants")
            reasons = out.setdefault(names[1], [])
            if why not in reasons:
                reasons.append(why)
        return {op: "; ".join(r) for op, r in sorted(out.items())}


NO_CONVERTER = "no converter"


def _partition_and_build(gm: fx.GraphModule, builder: Builder, options: ExportOptions, store: EngineStore,
                         forced: dict[fx.Node, str] | None = None, state_inputs: frozenset[str] = frozenset()
                         ) -> tuple[list[EngineSummary], dict[str, str]]:
    gm.graph.eliminate_dead_code()
    groups = None if options.max_engine_size is None else cut(gm, options.max_engine_size, state_inputs)
    planner = _Planner(gm, builder, options, store, forced or {}, state_inputs, groups)
    parts = planner.run()
    reasons = planner.reasons(parts)
    for op, why in reasons.items():
        log.info("fallback %s: %s", op, why)
    return _install_engines(gm, parts, options, store, groups), reasons


def _short(text: str, limit: int = 240) -> str:
    """The start of a (long) build error for the summary; the log keeps all of it."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _mentions(text: str, node: fx.Node) -> bool:
    """The error names this node (by FX name) or its operator (aten.x.y / aten::x.y)."""
    names = node_op_names(node.target)
    words = set(re.findall(r"[A-Za-z0-9_.:]+", text))
    if node.name in words:
        return True
    return names is not None and (names[0] in words or names[0].replace("::", ".") in words)


def _with_items(nodes: list[fx.Node]) -> list[fx.Node]:
    """``nodes`` plus the getitem nodes reading them (they follow their producer)."""
    out = list(nodes)
    for n in nodes:
        out.extend(u for u in n.users if u.target in NON_COMPUTE and u not in out)
    return out


def _signature(node: fx.Node) -> tuple[Any, ...]:
    def sig(a: Any) -> Any:
        val = a.meta.get("val") if isinstance(a, fx.Node) else None
        if isinstance(val, torch.Tensor):
            return (str(val.dtype), val.dim())
        if isinstance(a, (list, tuple)):
            return tuple(sig(x) for x in a)
        return repr(a) if not isinstance(a, fx.Node) else "sym"

    return sig(node.args) + tuple(sorted((k, sig(v)) for k, v in node.kwargs.items()))


def _unexpressible_outputs(part: Extracted) -> list[fx.Node]:
    """Outputs whose shape neither an input dimension determines nor a finite bound limits.

    (nonzero's size is data-dependent but bounded by its input's element count: such an
    output stays, planned at its bound; see ``pyrt.export._graph.datadep``.)
    """
    symbols = symbols_from_inputs([tuple(a.meta["val"].shape) for a in part.inputs if is_tensor_node(a)])
    bad = []
    for out in part.outputs:
        try:
            for d in out.meta["val"].shape:
                dim_expr(d, symbols, out.name, unbacked={})
        except ExportError:
            bad.append(out)
    return bad


def _build_one(builder: Builder, part: Extracted, key: str, store: EngineStore, options: ExportOptions,
               quiet: bool = False) -> tuple[Built | None, str]:
    what = f"building {builder.name} engine ({len(part.nodes)} nodes)"
    with options.progress.task(what if not quiet else f"probing {builder.name} on {part.ops}", stage="build") as task:
        try:
            try:
                built = builder.build(part, key, store, weight_streaming=options.weight_streaming,
                                      progress=task.note)
            finally:  # its weights are in the engine now (or it failed): their file pages leave the process
                released = release_file_pages(part.module.buffers())
            if released:
                log.info("engine %s: %d MiB of file-backed weight pages released", key, released >> 20)
            built.record.extra["released_bytes"] = released
            _check_bindings(built, part)
            return built, ""
        except BuildFailed as exc:
            if not quiet:
                log.warning("%s could not build a partition of %s; its culprit ops run in ExecuTorch instead: %s",
                            builder.name, ", ".join(part.ops), exc)
            return None, str(exc)


def _install_engines(gm: fx.GraphModule, parts: list[tuple[Extracted, Built]], options: ExportOptions,
                     store: EngineStore, groups: GroupPlan | None = None) -> list[EngineSummary]:
    summaries = []
    remap: dict[fx.Node, fx.Node] = {}
    infos = [opt.PartitionInfo(index, f"engine_{index}", part.ops) for index, (part, _) in enumerate(parts)]
    spread_over = [] if groups is None or not options.devices else spread(groups.groups, options.devices)
    for info, (part, built) in zip(infos, parts, strict=True):
        index = info.index
        group = None if groups is None else groups.node_group[part.nodes[-1]]
        layers = "" if groups is None or group is None else groups.groups[group].layers
        device = spread_over[group] if spread_over and group is not None else options.device(info)
        spec = replace(engine_spec(built, part, device, options.budget(info)), layers=layers,
                       weight_bytes=_weight_bytes(part) if layers else 0)
        attr = f"_pyrt_engine_{index}"
        gm.register_buffer(attr, store.tensor(built.record), persistent=False)
        part.inputs = [remap.get(a, a) for a in part.inputs]
        replace_with_engine(gm, part, attr, spec.to_json(), execute_engine_op(), remap)
        built.record.spec = spec
        built.record.extra["quantization"] = built.quantization
        bounded = bounded_outputs(spec, [o.meta["val"] for o in part.outputs])
        summaries.append(replace(EngineSummary.of(info.name, built.record, spec, part.ops, "built", bounded),
                                 layers=layers, weight_bytes=_weight_bytes(part)))
    if not spread_over:
        options.device.check_all_used(infos)
    options.budget.check_all_used(infos)
    finish(gm)
    return summaries


def _weight_bytes(part: Extracted) -> int:
    """Bytes of the weights the partition's engine carries (before any quantization)."""
    return sum(b.numel() * b.element_size() for b in part.module.buffers())


def engine_spec(built: Built, part: Extracted, device: str, budget: int | None) -> EngineSpec:
    """The engine node's spec: the engine's own bindings plus symbolic output dims for the fake kernel."""
    in_shapes = [tuple(a.meta["val"].shape) for a in part.inputs]
    symbols = symbols_from_inputs(in_shapes)
    where = f"engine {built.record.key}"
    unbacked: dict[str, int] = {}
    dims = tuple(tuple(dim_expr(s, symbols, where, unbacked) for s in o.meta["val"].shape) for o in part.outputs)
    quantized = built.quantization
    return EngineSpec(
        key=built.record.key, device=device, budget=budget, flavour=built.flavour, streamable=built.streamable,
        inputs=tuple(built.inputs), outputs=tuple(built.outputs), output_dims=dims, symbols=symbols.table,
        data_dependent=unbacked, quantization=quantized.spec().to_json() if quantized and quantized.layers else "",
    )


def _check_bindings(built: Built, part: Extracted) -> None:
    """An engine must take and give exactly its partition's tensors (count and dtype)."""
    for what, bindings, nodes in (("inputs", built.inputs, part.inputs), ("outputs", built.outputs, part.outputs)):
        if len(bindings) != len(nodes):
            raise BuildFailed(f"the engine has {len(bindings)} {what}, its partition {len(nodes)}")
        for b, n in zip(bindings, nodes, strict=True):
            want = str(n.meta["val"].dtype).removeprefix("torch.")
            if b.dtype != want:
                raise BuildFailed(f"engine {what[:-1]} {b.name!r} is {b.dtype}, the graph has {want}")

