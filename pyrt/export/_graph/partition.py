"""Split a flat ATen graph into engine partitions and fallback ops.

A node may join an engine when it is a pure ATen operator on tensors (and
SymInts), it is not forced to fall back (``torch_executed_ops``) and the
builder says it can build it (:func:`refusal` gives the reason when not).
torch's ``CapabilityBasedPartitioner`` groups such nodes into cycle-free
partitions (layer group by layer group when the decoder is cut: its memory is
quadratic in the nodes it sees); partitions with fewer than ``min_block_size`` compute
ops fall back too. Each partition becomes a standalone GraphModule (its
weights are ``get_attr`` constants inside it, its inputs numbered
placeholders in first-use order) and is then replaced in the parent graph by
one ``pyrt::execute_engine`` call whose inputs are wired by position.

>>> import torch
>>> gm = torch.fx.symbolic_trace(torch.nn.ReLU())
>>> propose(gm, lambda n: False, min_block_size=1)
[]
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.fx as fx
from torch._ops import OpOverload
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from pyrt.errors import ExportError
from pyrt.export._graph.passes import is_sym_node, label_sizes, live_nodes, materialize
from pyrt.export._graph.spec import dim_expr, symbols_from_inputs
from pyrt.export.options import node_op_names

FORCED = "forced by torch_executed_ops"
ENGINE_DTYPES = frozenset({"float32", "float16", "bfloat16", "int64", "int32", "int8", "uint8", "bool"})
NON_COMPUTE = (operator.getitem,)


@dataclass
class Extracted:
    """One partition as a standalone module, and how it connects to its parent graph."""

    module: fx.GraphModule
    nodes: list[fx.Node]
    inputs: list[fx.Node]  # parent values feeding the module's placeholders, by position
    outputs: list[fx.Node]  # parent nodes whose values the module returns, by position

    @property
    def ops(self) -> tuple[str, ...]:
        names = (node_op_names(n.target) for n in self.nodes)
        return tuple(sorted({n[0] for n in names if n is not None}))


def dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def is_tensor_node(node: Any) -> bool:
    return isinstance(node, fx.Node) and isinstance(node.meta.get("val"), torch.Tensor)


def refusal(node: fx.Node, forced: Mapping[fx.Node, str]) -> str | None:
    """Why ``node`` cannot join an engine whatever the builder, or None when it may.

    ``forced``: nodes ``torch_executed_ops`` keeps out (see ``pyrt.export._graph.passes.forced_nodes``).
    Arguments may be tensors or SymInts (shape arithmetic is recomputed inside each engine).
    """
    if node.op != "call_function":
        return "not an operator call"
    names = node_op_names(node.target)
    if names is None or not names[1].startswith("aten::"):
        return "not an ATen operator"
    if node in forced:
        return f"{FORCED} ({forced[node]})"
    op = cast(OpOverload, node.target)  # fx types call_function targets as Callable | str
    if op._schema.is_mutable:
        return "mutates its arguments in place"
    if _is_random(node):
        return "random (nondeterministic_seeded)"
    val = node.meta.get("val")
    outs = list(val) if isinstance(val, (tuple, list)) else [val]
    tensors = [v for v in outs if isinstance(v, torch.Tensor)]
    if not outs or len(tensors) != len(outs):
        return "returns something other than tensors"
    for v in tensors:
        if dtype_name(v) not in ENGINE_DTYPES:
            return f"{dtype_name(v)} result (engines take {', '.join(sorted(ENGINE_DTYPES))})"
    for a in node.all_input_nodes:
        if is_sym_node(a):
            continue
        if not is_tensor_node(a):
            return f"argument {a.name!r} is neither a tensor nor a SymInt"
        if dtype_name(a.meta["val"]) not in ENGINE_DTYPES:
            return f"{dtype_name(a.meta['val'])} argument {a.name!r}"
    return None


def _is_random(node: fx.Node) -> bool:
    """Tagged nondeterministic_seeded, unless its dropout probability is 0 or it is not training."""
    op = cast(OpOverload, node.target)
    if torch.Tag.nondeterministic_seeded not in getattr(op, "tags", ()):
        return False
    args = {a.name: (node.args[i] if i < len(node.args) else node.kwargs.get(a.name, a.default_value))
            for i, a in enumerate(op._schema.arguments)}
    if "dropout_p" in args:
        return args["dropout_p"] not in (0, 0.0)
    return args.get("train", True) is not False


class _Support(OperatorSupportBase):
    def __init__(self, supported: Callable[[fx.Node], bool]) -> None:
        self.supported = supported

    def is_node_supported(self, submodules: Any, node: fx.Node) -> bool:
        if node.op == "call_function" and node.target in NON_COMPUTE:
            producer = node.args[0]
            return isinstance(producer, fx.Node) and self.supported(producer)
        return self.supported(node)


def propose(gm: fx.GraphModule, supported: Callable[[fx.Node], bool], min_block_size: int,
            regions: Sequence[Sequence[fx.Node]] | None = None) -> list[list[fx.Node]]:
    """Partitions (node lists in graph order), ordered by their last node.

    An engine call takes the place of its partition's last node, so this is the
    order the engines (and ExecuTorch's delegates) end up in.

    ``regions``: disjoint node lists in graph order, each *convex* (no path between two of its nodes leaves it:
    layer groups, :meth:`~pyrt.export._graph.layer_groups.GroupPlan.regions`), partitioned one at a time, so no
    partition spans two. torch's partitioner keeps every node's set of downstream nodes, memory quadratic in the
    nodes it sees: 1.5 GiB for a whole 96-layer decoder, a group's share for one group. None: the whole graph.
    """
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    found = _partitions(gm, supported) if regions is None else \
        [part for nodes in regions for part in _region_partitions(nodes, supported)]
    groups = [sorted(g, key=order.__getitem__) for g in found]
    groups = [g for g in groups if _compute_count(g) >= min_block_size and has_runtime_input(g)]
    return sorted(groups, key=lambda g: order[g[-1]])


def _partitions(module: fx.GraphModule, supported: Callable[[fx.Node], bool]) -> list[list[fx.Node]]:
    """torch's cycle-free partitions of ``module``."""
    partitioner = CapabilityBasedPartitioner(module, _Support(supported), allows_single_node_partition=True)
    return [list(p.nodes) for p in partitioner.propose_partitions()]


def _region_partitions(nodes: Sequence[fx.Node], supported: Callable[[fx.Node], bool]) -> list[list[fx.Node]]:
    """:func:`_partitions` of a copy of the region ``nodes`` (:func:`_region`), as nodes of the parent graph.
    ``supported`` is asked of the parent's nodes; the copy's placeholders are never supported."""
    module, original = _region(nodes)
    found = _partitions(module, lambda node: node in original and supported(original[node]))
    return [[original[n] for n in part] for part in found]


def _region(nodes: Sequence[fx.Node]) -> tuple[fx.GraphModule, dict[fx.Node, fx.Node]]:
    """A module of ``nodes``' calls alone, and copy -> parent node for each call.

    What a call reads from outside the region, and the region's placeholders and ``get_attr`` nodes, are
    placeholders of the copy (first use first); nothing outside the region is in the copy's graph, so the
    partitioner's reachability sets stay within it.
    """
    inside = set(nodes)
    graph = fx.Graph()
    stand_in: dict[fx.Node, fx.Node] = {}
    for n in nodes:
        if n.op != "call_function":
            stand_in[n] = graph.placeholder(f"in_{len(stand_in)}")
        else:
            for a in n.all_input_nodes:
                if a not in inside and a not in stand_in:
                    stand_in[a] = graph.placeholder(f"in_{len(stand_in)}")
    original: dict[fx.Node, fx.Node] = {}
    for n in nodes:
        if n.op == "call_function":
            copy = graph.node_copy(n, stand_in.__getitem__)
            stand_in[n] = copy
            original[copy] = n
    return fx.GraphModule(torch.nn.Module(), graph), original


def _compute_count(nodes: list[fx.Node]) -> int:
    return sum(1 for n in nodes if n.target not in NON_COMPUTE)


def has_runtime_input(nodes: list[fx.Node]) -> bool:
    """A partition fed only by constants would be an engine with no inputs: leave it to ExecuTorch."""
    inside = set(nodes)
    return any(a not in inside and a.op != "get_attr" and not is_sym_node(a) for n in nodes for a in n.all_input_nodes)


class UnknownSize(ExportError):
    """A partition needs a size that none of its inputs' shapes determines."""

    def __init__(self, message: str, users: list[fx.Node]) -> None:
        super().__init__(message)
        self.users = users


def extract(gm: fx.GraphModule, nodes: list[fx.Node], state_inputs: Collection[str] = ()) -> Extracted:
    """A GraphModule computing ``nodes``: external values become ``input_i`` placeholders in
    first-use order, ``get_attr`` weights are carried inside, used-outside values are returned.

    SymInt arguments computed outside are recomputed inside from the inputs' shapes
    (:class:`UnknownSize` names the nodes when no input determines one). ``get_attr``
    targets in ``state_inputs`` (mutable buffers) are inputs, not baked-in weights.
    """
    inside = set(nodes)
    inputs: list[fx.Node] = []
    weights: list[fx.Node] = []
    sizes: list[fx.Node] = []
    for n in nodes:
        for a in n.all_input_nodes:
            if a not in inside:
                if is_sym_node(a):
                    bucket = sizes
                elif a.op == "get_attr" and str(a.target) not in state_inputs:
                    bucket = weights
                else:
                    bucket = inputs
                if a not in bucket:
                    bucket.append(a)
    outputs = [n for n in nodes if any(u not in inside for u in n.users)]
    for out in outputs:
        if not isinstance(out.meta.get("val"), torch.Tensor):
            raise ExportError(f"partition output {out.name!r} is not a tensor; it cannot leave an engine")
    root = torch.nn.Module()
    graph = fx.Graph()
    env: dict[fx.Node, Any] = {}
    for i, a in enumerate(inputs):
        env[a] = graph.placeholder(f"input_{i}")
        env[a].meta = dict(a.meta)
    for i, w in enumerate(weights):
        root.register_buffer(f"weight_{i}", _attr_tensor(gm, w))
        env[w] = graph.get_attr(f"weight_{i}")
        env[w].meta = dict(w.meta)
        env[w].meta["pyrt_source"] = str(w.target)  # the weight's name in the model, for reports
    if sizes:
        _recompute_sizes(graph, env, inputs, sizes, inside)
    for n in nodes:
        env[n] = graph.node_copy(n, env.__getitem__)
    graph.output(tuple(env[o] for o in outputs))
    module = fx.GraphModule(root, graph)
    module.eval()
    module.meta["range_constraints"] = gm.meta.get("range_constraints")
    return Extracted(module, nodes, inputs, outputs)


def _recompute_sizes(graph: fx.Graph, env: dict[fx.Node, Any], inputs: list[fx.Node], sizes: list[fx.Node],
                     inside: set[fx.Node]) -> None:
    """``env[size]`` := FX nodes (or an int) computing each outside SymInt from the inputs' shapes."""
    shapes = [tuple(a.meta["val"].shape) if is_tensor_node(a) else () for a in inputs]
    symbols = symbols_from_inputs(shapes)
    dims = {name: (env[inputs[i]], d, c, o) for name, (i, d, c, o) in symbols.table.items()}
    for size in sizes:
        value = size.meta["val"]
        if isinstance(value, int):
            env[size] = value
            continue
        try:
            tree = dim_expr(value, symbols, f"size {size.name!r}")
        except ExportError as exc:
            users = [u for u in size.users if u in inside]
            raise UnknownSize(f"{exc} (needed by {', '.join(u.name for u in users)})", users) from None
        last = next(reversed(graph.nodes), None)
        new = materialize(graph, tree, dims)
        if isinstance(new, fx.Node) and last is not None:  # (a symbol's tree always reads an input)
            label_sizes(last, new, value)
        env[size] = new


def _attr_tensor(gm: fx.GraphModule, node: fx.Node) -> torch.Tensor:
    value: Any = gm
    for part in str(node.target).split("."):
        value = getattr(value, part)
    if not isinstance(value, torch.Tensor):
        raise ExportError(f"partition weight {node.target!r} is a {type(value).__name__}, not a tensor")
    return value.detach()


def replace_with_engine(gm: fx.GraphModule, part: Extracted, engine_attr: str, spec_json: str,
                        call_target: Any, remap: dict[fx.Node, fx.Node]) -> fx.Node:
    """Swap the partition for ``call_target([inputs...], get_attr(engine_attr), spec_json)``.

    ``part.inputs`` are wired by position; ``remap`` learns which getitem now stands
    for each replaced output (a later partition's inputs may name them). The graph
    may be out of order afterwards: legalize it once all partitions are replaced.
    """
    inside = set(part.nodes)
    graph = gm.graph
    with graph.inserting_after(part.nodes[-1]):
        engine = graph.get_attr(engine_attr)
    with graph.inserting_after(engine):
        call = graph.call_function(call_target, (list(part.inputs), engine, spec_json))
    call.meta["val"] = [o.meta["val"] for o in part.outputs]
    last = call
    for i, out in enumerate(part.outputs):
        with graph.inserting_after(last):
            item = graph.call_function(operator.getitem, (call, i))
        item.meta = {"val": out.meta["val"]}
        out.replace_all_uses_with(item, delete_user_cb=lambda user: user not in inside)
        remap[out] = item
        last = item
    for node in reversed(part.nodes):
        graph.erase_node(node)
    return call


def check_outputs_live(gm: fx.GraphModule, parts: list[Extracted]) -> None:
    """Every engine output must reach something ExecuTorch keeps, or ExecuTorch drops it.

    ExecuTorch deletes unused delegate outputs (and assertion ops), yet a TensorRT
    engine still binds every output. Raised before any engine is built.
    """
    live = live_nodes(gm)
    problems = []
    for index, part in enumerate(parts):
        inside = set(part.nodes)
        for out in part.outputs:
            users = [u for u in out.users if u not in inside]
            if not any(u in live for u in users):
                named = ", ".join(f"{u.name!r} ({u.target})" for u in users)
                problems.append(f"partition {index}: {out.name!r} ({out.target}) is used only by {named}")
    if problems:
        raise ExportError(
            "engine outputs would feed only nodes that compute nothing ExecuTorch keeps, so ExecuTorch would "
            "drop them while the engine still binds them: " + "; ".join(problems) + ". Remove those nodes from "
            "the graph (assertion ops are removed automatically) or add their operators to torch_executed_ops")
