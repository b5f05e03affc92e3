"""A partition's graph -> an ONNX file, translated from the graph pyrt already has.

``torch.onnx.export(module)`` would trace the partition again (``torch.export``),
trace it once more to decompose it, load torch.onnx's registry (about 1.5 s) and
only then translate. A partition is already a decomposed, metadata-carrying ATen
graph, so pyrt wraps it in an ``ExportedProgram`` by hand (weights lifted to
buffer inputs, no trace), lets torch.onnx decompose only when an op needs it
(one it does not translate directly), and translates with the registry
partitioning already loaded. torch.onnx's translation and optimizer are the same
as on the public route.

That uses torch.onnx internals (``torch.onnx._internal.exporter._core``); when they
are missing, changed or fail, :func:`export_partition` raises :class:`Unavailable`
and the caller takes the public ``torch.onnx.export`` route instead.

>>> import torch
>>> gm = torch.fx.symbolic_trace(torch.nn.ReLU())
>>> [n.op for n in partition_program(gm).graph.nodes]    # doctest: +SKIP
['placeholder', 'call_function', 'output']
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

from pyrt.export._graph.passes import onnx_registry
from pyrt.export._tensorrt import torch_onnx

log = logging.getLogger("pyrt.export")


class Unavailable(Exception):
    """torch.onnx's internals are not what this module expects: use the public route."""


def partition_program(module: fx.GraphModule) -> torch.export.ExportedProgram:
    """An ExportedProgram over a copy of ``module``'s graph: ``get_attr`` weights become
    buffer inputs (first), placeholders user inputs, outputs user outputs. No tracing."""
    from torch.export.graph_signature import (
        ExportGraphSignature,
        InputKind,
        InputSpec,
        OutputKind,
        OutputSpec,
        TensorArgument,
    )

    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    specs, state = [], {}
    for node in module.graph.nodes:
        if node.op == "get_attr":
            target = str(node.target)
            env[node] = graph.placeholder(f"b_{target}")
            env[node].meta = dict(node.meta)
            specs.append(InputSpec(InputKind.BUFFER, TensorArgument(env[node].name), target, persistent=True))
            state[target] = _attr(module, target)
    for node in module.graph.nodes:
        if node.op == "placeholder":
            env[node] = graph.placeholder(node.name)
            env[node].meta = dict(node.meta)
            specs.append(InputSpec(InputKind.USER_INPUT, TensorArgument(env[node].name), None))
    out_specs = []
    for node in module.graph.nodes:
        if node.op in ("placeholder", "get_attr"):
            continue
        if node.op == "output":
            results = [env[o] for o in node.args[0]]
            graph.output(tuple(results))
            out_specs = [OutputSpec(OutputKind.USER_OUTPUT, TensorArgument(r.name), None) for r in results]
        else:
            env[node] = graph.node_copy(node, env.__getitem__)
    root = torch.nn.Module()
    for target, value in state.items():
        root.register_buffer(target, value)
    gm = fx.GraphModule(root, graph)
    constraints = module.meta.get("range_constraints") or {}
    return torch.export.ExportedProgram(
        root=gm, graph=gm.graph, graph_signature=ExportGraphSignature(specs, out_specs), state_dict=state,
        range_constraints=dict(constraints), module_call_graph=[], constants={})


def _attr(module: torch.nn.Module, target: str) -> torch.Tensor:
    value: Any = module
    for part in target.split("."):
        value = getattr(value, part)
    return value


def export_partition(module: fx.GraphModule, path: Path, input_names: Sequence[str],
                     output_names: Sequence[str], in_memory: bool = False) -> tuple[Path, dict[str, torch_onnx.Weight]]:
    """Write ``module`` (an extracted partition) to ``path`` as ONNX with external weights.

    Returns the path and the initializers whose bytes are already in memory (the partition's own
    weights, by name), which the parser reads in place instead of its own copy from the file;
    weights are never transposed into copies (``torch_onnx.optimize_keeping_weights``).
    ``in_memory``: those weights are referenced but not written (the parser takes them with
    ``load_initializer``), so the ONNX step writes no copy of the model to disk.
    Raises :class:`Unavailable` when this route cannot be used or fails (the caller then
    takes the public route, which reports a genuine failure in its own words).
    """
    try:
        from torch.onnx._internal.exporter import _core, _fx_passes, _ir_passes
    except ImportError as exc:
        raise Unavailable(str(exc)) from exc
    registry = onnx_registry()
    needed = [(_core, "_exported_program_to_onnx_program"), (_core, "_prepare_exported_program_for_export"),
              (_fx_passes, "insert_type_promotion_nodes"), (_ir_passes, "rename_inputs"),
              (_ir_passes, "rename_outputs")]
    missing = [name for mod, name in needed if not hasattr(mod, name)]
    if registry is None or missing:
        raise Unavailable(f"torch.onnx lacks {missing or 'its registry'}")
    chatter = io.StringIO()
    try:
        with contextlib.redirect_stdout(chatter):
            program = _prepared(partition_program(module), registry, _core, _fx_passes)
            onnx_program = _core._exported_program_to_onnx_program(program, registry=registry)
            torch_onnx.optimize_keeping_weights(onnx_program)
            _ir_passes.rename_inputs(onnx_program.model, list(input_names))
            _ir_passes.rename_outputs(onnx_program.model, list(output_names))
            weights = torch_onnx.module_initializers(onnx_program)
            if in_memory:
                torch_onnx.save_referencing(onnx_program, path, weights)
            else:
                onnx_program.save(str(path), external_data=True)
    except Exception as exc:  # torch.onnx raises many error types
        raise Unavailable(f"{type(exc).__name__}: {_plain(exc)}") from exc
    finally:
        if chatter.getvalue().strip():
            log.debug("torch.onnx: %s", chatter.getvalue().strip())
    return path, weights


def _prepared(program: torch.export.ExportedProgram, registry: Any, core: Any, passes: Any
              ) -> torch.export.ExportedProgram:
    """torch.onnx's preparation: decompositions only when an op is not translated directly."""
    direct = all(registry.is_registered(n.target) for n in program.graph.nodes
                 if n.op == "call_function" and not _is_python_op(n.target))
    if not direct:
        log.debug("partition has ops torch.onnx decomposes first; running its decompositions")
        return core._prepare_exported_program_for_export(program, registry=registry)
    passes.insert_type_promotion_nodes(program.graph_module)
    return program


def _is_python_op(target: Any) -> bool:
    return getattr(target, "__module__", None) in ("_operator", "operator") or target in (
        torch.sym_max, torch.sym_min, torch.sym_float, torch.sym_int)


def _plain(exc: BaseException) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
