"""Stage 1 of ``to_pte``: a graph whose engine nodes read their engines from uint8 attributes.

An ``nn.Module`` is exported, an ExportedProgram decomposed to core ATen and
unlifted; partitions are built into engines (spilled to the EngineStore) and
replaced by ``pyrt::execute_engine`` calls, inputs wired by position. A
Torch-TensorRT program instead has its engine calls converted as they are.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.fx as fx

from pyrt.errors import ExportError
from pyrt.export import _options as opt
from pyrt.export._builders import BuildFailed, Built, make_builder
from pyrt.export._engines import EngineStore
from pyrt.export._graph import graph_copy, inline_submodules, unlift
from pyrt.export._partition import extract, plain_aten_op, propose, replace_with_engine
from pyrt.export._spec import EngineSpec, dim_expr, symbols_from_inputs
from pyrt.export._summary import EngineSummary
from pyrt.export.convert import contains_torchtrt, convert_torchtrt

log = logging.getLogger("pyrt.export")
Options = Any  # pyrt.export.api.Options (imported lazily: api imports this module)


def stage_engines(model: Any, example_inputs: Any, options: Options, store: EngineStore
                  ) -> tuple[fx.GraphModule, Any, list[EngineSummary], Any]:
    """(graph with engine nodes, (args, kwargs) to re-export it with, engine summaries, original program)."""
    if isinstance(model, fx.GraphModule) and contains_torchtrt(model):
        gm = graph_copy(model)  # the caller's module stays as it was
        inline_submodules(gm)
        engines = convert_torchtrt(gm, None, options, store)
        return gm, (_args(example_inputs), {}), engines, None
    if isinstance(model, torch.export.ExportedProgram):
        program = model
        builder = None if contains_torchtrt(program.graph_module) else make_builder(options.builder)
    elif isinstance(model, torch.nn.Module):
        builder = make_builder(options.builder)  # a missing TensorRT fails before the slow steps
        program = _export(model, example_inputs, options.dynamic_shapes)
    else:
        raise ExportError(f"to_pte needs an nn.Module or an ExportedProgram, got {type(model).__name__}")
    if contains_torchtrt(program.graph_module):
        gm = unlift(program)
        engines = convert_torchtrt(gm, program, options, store)
    else:
        with options.progress.task("decomposing to core ATen"):
            program = program.run_decompositions()
        gm = unlift(program)
        engines = _partition_and_build(gm, builder or make_builder(options.builder), options, store)
    return gm, _example_args(program, example_inputs), engines, program


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
    shape = [d if isinstance(d, int) else int(d.node.hint) for d in val.shape]
    return torch.zeros(shape, dtype=val.dtype)


def _partition_and_build(gm: fx.GraphModule, builder: Any, options: Options, store: EngineStore
                         ) -> list[EngineSummary]:
    gm.graph.eliminate_dead_code()
    blocked: set[fx.Node] = set()
    cache: dict[tuple[str, ...], tuple[Any, Built]] = {}

    def supported(node: fx.Node) -> bool:
        return node not in blocked and plain_aten_op(node, options.forced_fallback) and builder.supports(node)

    while True:
        groups = propose(gm, supported, options.min_block_size)
        parts = []
        for nodes in groups:
            key = tuple(n.name for n in nodes)
            if key not in cache:
                part = extract(gm, nodes)
                built = _build_one(builder, part, f"b{len(store.records)}", store, options)
                if built is None:
                    blocked.update(nodes)
                    break
                cache[key] = (part, built)
            parts.append(cache[key])
        else:
            break
    return _install_engines(gm, parts, options, store)


def _build_one(builder: Any, part: Any, key: str, store: EngineStore, options: Options) -> Built | None:
    with options.progress.task(f"building {builder.name} engine ({len(part.nodes)} nodes)") as task:
        try:
            built = builder.build(part, key, store, weight_streaming=options.weight_streaming, progress=task.note)
            _check_bindings(built, part)
            return built
        except BuildFailed as exc:
            log.warning("%s could not build a partition of %s; it runs in ExecuTorch instead: %s",
                        builder.name, ", ".join(part.ops), exc)
            return None


def _install_engines(gm: fx.GraphModule, parts: list[tuple[Any, Built]], options: Options,
                     store: EngineStore) -> list[EngineSummary]:
    from pyrt.export._ops import execute_engine_op

    summaries = []
    remap: dict[fx.Node, fx.Node] = {}
    for index, (part, built) in enumerate(parts):
        info = opt.PartitionInfo(index, f"engine_{index}", part.ops)
        spec = engine_spec(built, part, options.device(info), options.budget(info))
        attr = f"_pyrt_engine_{index}"
        gm.register_buffer(attr, store.tensor(built.record), persistent=False)
        part.inputs = [remap.get(a, a) for a in part.inputs]
        replace_with_engine(gm, part, attr, spec.to_json(), execute_engine_op(), remap)
        built.record.spec = spec
        summaries.append(EngineSummary.of(info.name, built.record, spec, part.ops, "built"))
    options.device.check_all_used()
    options.budget.check_all_used()
    finish(gm)
    return summaries


def engine_spec(built: Built, part: Any, device: str, budget: int | None) -> EngineSpec:
    """The engine node's spec: the engine's own bindings plus symbolic output dims for the fake kernel."""
    in_shapes = [tuple(a.meta["val"].shape) for a in part.inputs]
    symbols = symbols_from_inputs(in_shapes)
    where = f"engine {built.record.key}"
    dims = tuple(tuple(dim_expr(s, symbols, where) for s in o.meta["val"].shape) for o in part.outputs)
    return EngineSpec(
        key=built.record.key, device=device, budget=budget, flavour=built.flavour, streamable=built.streamable,
        inputs=tuple(built.inputs), outputs=tuple(built.outputs), output_dims=dims, symbols=symbols.table,
    )


def _check_bindings(built: Built, part: Any) -> None:
    """An engine must take and give exactly its partition's tensors (count and dtype)."""
    for what, bindings, nodes in (("inputs", built.inputs, part.inputs), ("outputs", built.outputs, part.outputs)):
        if len(bindings) != len(nodes):
            raise BuildFailed(f"the engine has {len(bindings)} {what}, its partition {len(nodes)}")
        for b, n in zip(bindings, nodes, strict=True):
            want = str(n.meta["val"].dtype).removeprefix("torch.")
            if b.dtype != want:
                raise BuildFailed(f"engine {what[:-1]} {b.name!r} is {b.dtype}, the graph has {want}")


def finish(gm: fx.GraphModule) -> None:
    """Topologically order the graph, drop dead nodes and the states only engines used."""
    from torch.fx.passes.tools_common import legalize_graph

    legalize_graph(gm)
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    used = {str(n.target) for n in gm.graph.nodes if n.op == "get_attr"}
    for name, _ in list(gm.named_parameters(recurse=False)) + list(gm.named_buffers(recurse=False)):
        if name not in used:
            delattr(gm, name)
    gm.recompile()

