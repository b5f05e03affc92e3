"""Turn Torch-TensorRT engine calls into ``pyrt::execute_engine`` nodes, keeping the engines.

Handles ``tensorrt::execute_engine(inputs, engine)`` calls (engine objects reached
through ``get_attr`` after :func:`pyrt.export._graph.fx.unlift` resolved them via the
graph signature) and ``call_module`` nodes of runtime modules holding an
``engine`` attribute. Each engine's ``target_device`` comes from the engine's own
device info, so a program spread over two GPUs keeps each engine on its own.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

from pyrt.errors import ExportError
from pyrt.export._files.engine_store import EngineRecord, EngineStore
from pyrt.export._graph.engine_op import execute_engine_op
from pyrt.export._graph.fx import finish, resolve_custom_obj
from pyrt.export._graph.spec import EngineSpec, dim_expr, symbols_from_inputs
from pyrt.export.options import ExportOptions, PartitionInfo
from pyrt.export.summary import EngineSummary
from pyrt.export.torchtrt import decode_state, engine_state, is_execute_engine
from pyrt.format.trt_blob import IOBinding


def contains_torchtrt(gm: torch.nn.Module) -> bool:
    """True when any (sub)graph calls ``tensorrt::execute_engine`` or a TensorRT runtime module."""
    for module in gm.modules():
        if isinstance(module, fx.GraphModule):
            for node in module.graph.nodes:
                if node.op == "call_function" and is_execute_engine(node.target):
                    return True
        elif _is_runtime_module(module):
            return True
    return False


def _is_runtime_module(module: Any) -> bool:
    return not isinstance(module, fx.GraphModule) and hasattr(module, "engine") and isinstance(module, torch.nn.Module)


def convert_torchtrt(gm: fx.GraphModule, program: torch.export.ExportedProgram | None, options: ExportOptions,
                     store: EngineStore) -> list[EngineSummary]:
    """Replace every engine call of ``gm`` in place; returns the engines in graph order."""
    summaries: list[EngineSummary] = []
    infos: list[PartitionInfo] = []
    dropped: set[str] = set()
    for node in list(gm.graph.nodes):
        found = _engine_call(gm, node)
        if found is None:
            continue
        inputs, obj, where, engine_node = found
        index = len(summaries)
        info = PartitionInfo(index, f"engine_{index}", ())
        infos.append(info)
        record, spec = _spill(obj, where, inputs, node, f"t{index}", options.budget(info), store)
        attr = f"_pyrt_engine_{index}"
        gm.register_buffer(attr, store.tensor(record), persistent=False)
        with gm.graph.inserting_before(node):
            engine = gm.graph.get_attr(attr)
            call = gm.graph.call_function(execute_engine_op(), (inputs, engine, spec.to_json()))
        _swap(gm, node, call)
        if engine_node is not None and not engine_node.users:
            gm.graph.erase_node(engine_node)
            dropped.add(str(engine_node.target))
        record.spec = spec
        summaries.append(EngineSummary.of(info.name, record, spec, (), "converted"))
    options.budget.check_all_used(infos)
    _drop_unused_attrs(gm, dropped)
    finish(gm)
    return summaries


def _engine_call(gm: fx.GraphModule, node: fx.Node) -> tuple[list[Any], Any, str, fx.Node | None] | None:
    if node.op == "call_function" and is_execute_engine(node.target):
        engine_node = node.args[1]
        where = f"engine call {node.name!r}"
        if not isinstance(engine_node, fx.Node):
            raise ExportError(f"{where}: its engine argument is {engine_node!r}, not a graph value")
        obj = resolve_custom_obj(engine_node, root=gm)
        if obj is None:
            raise ExportError(f"{where}: engine {engine_node.name!r} ({engine_node.op}) cannot be resolved")
        return list(node.args[0]), obj, where, engine_node  # type: ignore[arg-type]  # fx Argument union: a list
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        if _is_runtime_module(module):
            return list(node.args), module.engine, f"engine module {node.target!r}", None
    return None


def _spill(obj: Any, where: str, inputs: list[Any], node: fx.Node, key: str, budget: int | None,
           store: EngineStore) -> tuple[EngineRecord, EngineSpec]:
    engine = decode_state(engine_state(obj, where), where)
    in_vals = [_val(a, f"{where} input {i}") for i, a in enumerate(inputs)]
    out_vals = node.meta.get("val")
    out_vals = [out_vals] if isinstance(out_vals, torch.Tensor) else out_vals
    if not isinstance(out_vals, (list, tuple)) or not all(isinstance(v, torch.Tensor) for v in out_vals):
        raise ExportError(f"{where}: has no output metadata (meta['val']); torch.export the program first")
    if len(engine.input_names) != len(in_vals) or len(engine.output_names) != len(out_vals):
        raise ExportError(
            f"{where}: engine {engine.name!r} binds {len(engine.input_names)} inputs / {len(engine.output_names)} "
            f"outputs, the call has {len(in_vals)} / {len(out_vals)}")
    symbols = symbols_from_inputs([tuple(v.shape) for v in in_vals])
    spec = EngineSpec(
        key=key, device=f"cuda:{engine.device_index}", budget=budget, flavour="torch_tensorrt",
        inputs=tuple(_binding(n, v, True) for n, v in zip(engine.input_names, in_vals, strict=True)),
        outputs=tuple(_binding(n, v, False) for n, v in zip(engine.output_names, out_vals, strict=True)),
        output_dims=tuple(tuple(dim_expr(s, symbols, where) for s in v.shape) for v in out_vals),
        symbols=symbols.table, aliased_io=engine.aliased_io, hardware_compatible=engine.hardware_compatible,
        serialized_metadata=engine.serialized_metadata, target_platform=engine.target_platform,
    )
    record = store.add_bytes(key, engine.engine)
    return record, spec


def _swap(gm: fx.GraphModule, old: fx.Node, call: fx.Node) -> None:
    """``call`` returns a list; a runtime module that returned a bare tensor is read through [0]."""
    val = old.meta["val"]
    if isinstance(val, torch.Tensor):
        call.meta["val"] = [val]
        with gm.graph.inserting_after(call):
            item = gm.graph.call_function(operator.getitem, (call, 0))
        item.meta["val"] = val
        old.replace_all_uses_with(item)
    else:
        call.meta["val"] = list(val)
        old.replace_all_uses_with(call)
    gm.graph.erase_node(old)


def _val(arg: Any, where: str) -> torch.Tensor:
    val = arg.meta.get("val") if isinstance(arg, fx.Node) else None
    if not isinstance(val, torch.Tensor):
        raise ExportError(f"{where} is not a tensor with metadata (meta['val'])")
    return val


def _binding(name: str, val: torch.Tensor, is_input: bool) -> IOBinding:
    shape = tuple(d if isinstance(d, int) else -1 for d in val.shape)
    return IOBinding(name, str(val.dtype).removeprefix("torch."), shape, is_input)


def _drop_unused_attrs(gm: fx.GraphModule, dropped: set[str]) -> None:
    """Engine objects and runtime modules that no node reaches any more."""
    used = {str(n.target) for n in gm.graph.nodes if n.op in ("get_attr", "call_module")}
    for name in dropped - used:
        if "." not in name and hasattr(gm, name):
            delattr(gm, name)
    for name, module in list(gm.named_children()):
        if name not in used and _is_runtime_module(module):
            delattr(gm, name)
