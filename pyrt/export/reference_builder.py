"""The reference builder: a partition's FX graph -> a ``PYRTREF1`` reference engine.

pyrt.sim's fake TensorRT executes these engines on the CPU, so export ->
run is tested end to end without a GPU. The engine is validated by building a
:class:`pyrt.sim.refengine.RefEngine` (weights as zero-copy views), then
streamed to a file by ``RefEngine.write_to`` (the bytes of ``to_bytes()``, a
weight at a time), so a multi-GiB engine never sits in memory whole.

>>> import torch
>>> gm = torch.fx.symbolic_trace(torch.nn.ReLU())
>>> supports(next(iter(gm.graph.nodes)))
False
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, BinaryIO, cast

import torch
import torch.fx as fx
from torch._ops import OpOverload

from pyrt.errors import ExportError
from pyrt.export._graph.quantize import dequantize_weight
from pyrt.format.trt_blob import IOBinding
from pyrt.sim.refengine import DType, MemoryFormat, Ref, RefEngine, RefNode, RefProfile, RefTensor, RefWeight

# kwargs that say where a result lives, not what it is: an engine ignores them. (memory_format
# is kept: ``clone(memory_format=contiguous_format)`` is what makes a later ``view`` legal.)
_PLACEMENT_KWARGS = {"device", "layout", "pin_memory", "non_blocking"}
# SymInt arithmetic that partitions recompute from their inputs' shapes -> reference target
_SYM_TARGETS: dict[object, str] = {
    operator.add: "sym::add", operator.sub: "sym::sub", operator.mul: "sym::mul",
    operator.floordiv: "sym::floordiv", operator.mod: "sym::mod", operator.pow: "sym::pow",
    operator.neg: "sym::neg", torch.sym_max: "sym::max", torch.sym_min: "sym::min",
    dequantize_weight: "pyrt::dequantize_weight",  # to_pte(quantize=...): pyrt.sim.refengine.quant
}


class _Unencodable(Exception):
    pass


def supports(node: fx.Node) -> bool:
    """True when every argument of ``node`` has a reference-format encoding."""
    if node.op != "call_function" or not hasattr(node.target, "_schema"):
        return False
    try:
        _encode(node.args, {}, probe=True)
        _encode_kwargs(node.kwargs, {}, probe=True)
    except _Unencodable:
        return False
    return True


@dataclass(frozen=True)
class Profile:
    """Per input dim: (min, max); equal for a static dim."""

    ranges: tuple[tuple[int, int], ...]


def build(module: fx.GraphModule, profiles: list[Profile], sink: BinaryIO, *, weight_streaming: bool,
          several: list[tuple[list[Any], int]] | None = None) -> tuple[list[IOBinding], list[IOBinding]]:
    """Write the engine for ``module`` to ``sink``; returns its (inputs, outputs) bindings.

    ``several``: the engine's optimization profiles (``to_pte(profiles=...)``), each (per input position
    (min, opt, max), activation bytes); ``profiles`` then gives each input's range over all of them."""
    names: dict[Any, str] = {}
    outputs = list(next(n for n in module.graph.nodes if n.op == "output").args[0])
    for k, out in enumerate(outputs):
        names[_key(out)] = f"output_{k}"
    inputs: list[RefTensor] = []
    weights: dict[str, RefWeight] = {}
    nodes: list[RefNode] = []
    for node in module.graph.nodes:
        if node.op == "placeholder":
            names[node] = node.name
            inputs.append(_input_tensor(node, profiles[len(inputs)]))
        elif node.op == "get_attr":
            names[node] = node.target
            weights[node.target] = RefWeight.of(getattr(module, node.target), copy=False)  # a view
        elif node.op == "call_function" and node.target is operator.getitem:
            continue
        elif node.op == "call_function":
            nodes.append(_node(node, names))
    out_tensors = [_output_tensor(names[_key(o)], o) for o in outputs]
    dynamic = {t.name for t in inputs if -1 in t.shape}
    refs = [RefProfile({t.name: b for t, b in zip(inputs, bounds, strict=True) if t.name in dynamic}, memory)
            for bounds, memory in several or []]
    engine = RefEngine(inputs, out_tensors, weights, nodes, weight_streaming, refs)  # validates names, dtypes
    engine.write_to(sink)
    return [_binding(t, True) for t in inputs], [_binding(t, False) for t in out_tensors]


def _key(node: fx.Node) -> Any:
    """getitem(producer, i) and element i of producer are one value."""
    if node.op == "call_function" and node.target is operator.getitem:
        return (node.args[0], node.args[1])
    return node


def _node(node: fx.Node, names: dict[Any, str]) -> RefNode:
    val = node.meta.get("val")
    if isinstance(val, (tuple, list)):
        outs = [names.setdefault((node, i), f"{node.name}#{i}") for i in range(len(val))]
    else:
        outs = [names.setdefault(node, node.name)]
    for i, name in enumerate(outs):  # getitem nodes resolve to the element's name
        for user in node.users:
            if user.target is operator.getitem and user.args[1] == i:
                names[user] = name
    op = cast(OpOverload, node.target)  # an ATen operator unless a SymInt function of _SYM_TARGETS
    target = _SYM_TARGETS.get(node.target) or f"{op._schema.name}.{op._overloadname}"
    try:
        return RefNode(target, _encode(node.args, names), _encode_kwargs(node.kwargs, names), outs)
    except _Unencodable as exc:
        raise ExportError(f"reference builder cannot encode node {node.name!r} ({target}): {exc}") from None


def _encode(arg: Any, names: dict[Any, str], probe: bool = False) -> Any:
    if isinstance(arg, fx.Node):
        return Ref("?") if probe else Ref(names[_key(arg)] if _key(arg) in names else names[arg])
    if isinstance(arg, (list, tuple)):
        return [_encode(a, names, probe) for a in arg]
    if isinstance(arg, torch.dtype):
        return DType(str(arg).removeprefix("torch."))
    if isinstance(arg, torch.memory_format):
        return MemoryFormat(str(arg).removeprefix("torch."))
    if arg is None or isinstance(arg, (bool, int, str, float)):
        return arg  # inf, -inf and nan included (the format has a spelling for them)
    raise _Unencodable(f"argument {arg!r} of type {type(arg).__name__}")


def _encode_kwargs(kwargs: dict[str, Any], names: dict[Any, str], probe: bool = False) -> dict[str, Any]:
    return {k: _encode(v, names, probe) for k, v in kwargs.items() if k not in _PLACEMENT_KWARGS}


def _dims(val: torch.Tensor) -> tuple[int, ...]:
    return tuple(d if isinstance(d, int) else -1 for d in val.shape)


def _input_tensor(node: fx.Node, profile: Profile) -> RefTensor:
    val = node.meta["val"]
    shape = _dims(val)
    if -1 not in shape:
        return RefTensor(node.name, _dtype(val), shape)
    lo = tuple(a for a, _ in profile.ranges)
    hi = tuple(b for _, b in profile.ranges)
    return RefTensor(node.name, _dtype(val), shape, lo, hi)


def _output_tensor(name: str, node: fx.Node) -> RefTensor:
    return RefTensor(name, _dtype(node.meta["val"]), _dims(node.meta["val"]))


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _binding(t: RefTensor, is_input: bool) -> IOBinding:
    return IOBinding(t.name, t.dtype, tuple(t.shape), is_input)
