"""The graph passes before partitioning, each on its own: decomposition, assertions, symbolic sizes, forced ops.

:mod:`pyrt.export._graph.pass_order` runs them, in the one order an export uses.

* :func:`decomposition_table`: core ATen decompositions, except for operators
  torch.onnx translates whole (``linear``, ``scaled_dot_product_attention``,
  ``lstm``, ``softmax``...): those stay one node, as the ONNX exporter (the route
  to TensorRT) would keep them, for both builders. (SDPA's decomposition also
  breaks dynamic shapes.) Every op left is core ATen or one ONNX translates, so
  one that falls back still lowers through ExecuTorch (never a ``prims`` op).
* :func:`onnx_translates`: what TensorRT can take is what torch.onnx can export:
  ops it translates, or decomposes itself before translating.
* :func:`strip_assertions`: ``aten._assert_tensor_metadata`` (left by ``.to()``) and
  the other assertion ops check what the engine's bindings already fix; ExecuTorch
  deletes them during lowering. Left in, they keep their inputs alive as engine
  outputs that ExecuTorch then drops.
* :func:`canonicalize_sizes`: every SymInt node is recomputed from the graph's
  inputs' shapes, so shape arithmetic never sits between two engine ops (the
  partitioner would otherwise split there to avoid a cycle).
* :func:`forced_nodes`: ``torch_executed_ops`` matched through decompositions
  (``aten.softmax.int`` matches the ``_softmax`` it became), via node provenance.
* :func:`live_nodes`: what ExecuTorch keeps of a graph (the partitioner checks engine outputs
  against it; the writer counts the fallback ops in it).

>>> sorted(str(op) for op in assertion_ops())[:2]
['aten._assert_async.default', 'aten._assert_async.msg']
"""

from __future__ import annotations

import functools
import logging
import operator
import re
from collections.abc import Collection
from typing import Any

import torch
import torch.fx as fx

from pyrt.errors import ExportError
from pyrt.export._graph.spec import dim_expr, symbols_from_inputs
from pyrt.export.options import canonical_op_name, node_op_names

log = logging.getLogger("pyrt.export")
_OVERLOAD = re.compile(r"[A-Za-z_]\w*\.\w+\.\w+")  # how an OpOverload prints: namespace.op.overload

SYM_OPS: dict[str, Any] = {  # expression-tree operator -> FX target (pyrt.export._graph.spec trees)
    "+": operator.add, "*": operator.mul, "//": operator.floordiv, "%": operator.mod, "pow": operator.pow,
    "max": torch.sym_max, "min": torch.sym_min,
}


def assertion_ops() -> frozenset[Any]:
    """Ops that only check and compute nothing (ExecuTorch's and torch.onnx's removal lists)."""
    aten = torch.ops.aten
    return frozenset({
        aten._assert_tensor_metadata.default, aten._assert_scalar.default, aten._assert_async.default,
        aten._assert_async.msg, aten.sym_constrain_range.default, aten.sym_constrain_range_for_size.default,
    })


@functools.lru_cache(maxsize=1)
def onnx_registry() -> Any:
    """torch.onnx's translation registry (what the ONNX route can express); None if unavailable."""
    quiet = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        from torch.onnx._internal.exporter import _registration

        return _registration.ONNXRegistry.from_torchlib()
    except Exception as exc:  # private API: degrade to core ATen and "let the builder decide"
        log.debug("torch.onnx registry unavailable (%s); partitioning core ATen", exc)
        return None
    finally:
        quiet.setLevel(level)


def onnx_translates(target: Any) -> bool | None:
    """Whether torch.onnx can export ``target``: it has a translation, or a decomposition
    torch.onnx applies itself; None when torch.onnx's registry is unavailable."""
    registry = onnx_registry()
    if registry is None:
        return None
    try:
        return bool(registry.is_registered(target)) or target in _onnx_decompositions()
    except Exception:  # an odd target (a Python callable the registry cannot key)
        return False


@functools.lru_cache(maxsize=1)
def _onnx_decompositions() -> frozenset[Any]:
    """Ops torch.onnx decomposes before translating (its "ONNX-friendly" table)."""
    try:
        from torch.onnx._internal.exporter import _decomp

        kept = set(_decomp.get_onnx_implemented_overloads(onnx_registry()))
        return frozenset(_decomp.create_onnx_friendly_decomposition_table(kept))
    except Exception as exc:  # private API
        log.debug("torch.onnx decomposition table unavailable (%s)", exc)
        return frozenset()


@functools.lru_cache(maxsize=1)
def decomposition_table() -> dict[Any, Any]:
    """Core ATen decompositions, minus the ops torch.onnx translates whole (see the module docstring)."""
    table = dict(torch.export.default_decompositions().items())
    registry = onnx_registry()
    if registry is None:
        table.pop(torch.ops.aten.scaled_dot_product_attention.default, None)
        return table
    return {op: fn for op, fn in table.items() if not _registered(registry, op)}


def _registered(registry: Any, op: Any) -> bool:
    try:
        return bool(registry.is_registered(op))
    except Exception:  # a target the registry cannot key
        return False


def decompose(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``run_decompositions`` with :func:`decomposition_table`, errors as ExportError."""
    try:
        return program.run_decompositions(decomposition_table())
    except Exception as exc:  # torch raises many error types from decompositions
        raise ExportError(f"decomposing the program failed: {type(exc).__name__}: {exc}") from exc


def strip_assertions(gm: fx.GraphModule) -> list[str]:
    """Erase assertion nodes (see the module docstring); returns the erased nodes' names."""
    asserts = assertion_ops()
    gone = []
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target in asserts:
            gone.append(node.name)
            gm.graph.erase_node(node)
    if gone:
        log.debug("removed %d assertion node(s): %s", len(gone), ", ".join(gone[:8]))
    return gone


def live_nodes(gm: fx.GraphModule) -> set[fx.Node]:
    """Nodes the graph's output depends on, and side-effecting calls other than assertions: what ExecuTorch
    keeps. Assertions are known by their schema name, so an ATen graph and an edge-dialect one read alike."""
    asserts = {str(op._schema.name) for op in assertion_ops()}
    stack = [n for n in gm.graph.nodes if n.op == "output" or (
        n.op == "call_function" and n.is_impure() and getattr(getattr(n.target, "_schema", None), "name", "")
        not in asserts)]
    live: set[fx.Node] = set()
    while stack:
        node = stack.pop()
        if node not in live:
            live.add(node)
            stack.extend(node.all_input_nodes)
    return live


# -- symbolic sizes ------------------------------------------------------------------------------


def is_sym_node(node: Any) -> bool:
    """A call computing a SymInt (``sym_size``, shape arithmetic), not a tensor."""
    return (isinstance(node, fx.Node) and node.op == "call_function"
            and isinstance(node.meta.get("val"), (torch.SymInt, int)) and not isinstance(node.meta["val"], bool))


def sym_value(node: fx.Node) -> Any:
    return node.meta["val"]


def materialize(graph: fx.Graph, tree: Any, dims: dict[str, tuple[fx.Node, int, int, int]]) -> Any:
    """FX nodes computing a ``pyrt.export._graph.spec`` expression tree (an int stays a literal).

    ``dims``: symbol -> (tensor node, dim, coeff, offset), meaning ``size = coeff * symbol + offset``.
    Nodes are inserted at the graph's current insertion point.
    """
    if isinstance(tree, int):
        return tree
    op, *args = tree
    if op == "sym":
        tensor, dim, coeff, offset = dims[args[0]]
        size: Any = graph.call_function(torch.ops.aten.sym_size.int, (tensor, dim))
        if offset:
            size = graph.call_function(operator.sub, (size, offset))
        if coeff != 1:
            size = graph.call_function(operator.floordiv, (size, coeff))
        return size
    vals = [materialize(graph, a, dims) for a in args]
    out = vals[0]
    for v in vals[1:]:
        out = graph.call_function(SYM_OPS[op], (out, v))
    return out


def canonicalize_sizes(gm: fx.GraphModule) -> int:
    """Recompute every SymInt node from the graph inputs' shapes (see the module docstring).

    A SymInt the inputs' shapes cannot express (a data-dependent size) is left as it is.
    Returns how many nodes were replaced.
    """
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)]
    targets = [n for n in gm.graph.nodes if is_sym_node(n) and not _reads_placeholder(n)]
    if not targets or not placeholders:
        return 0
    symbols = symbols_from_inputs([tuple(p.meta["val"].shape) for p in placeholders])
    dims = {name: (placeholders[i], d, c, o) for name, (i, d, c, o) in symbols.table.items()}
    point = placeholders[-1].next  # new nodes go right after the inputs, in order
    replaced = 0
    for node in targets:
        value = sym_value(node)
        if isinstance(value, int):
            _replace_with_literal(node, value)
            replaced += 1
            continue
        try:
            tree = dim_expr(value, symbols, f"node {node.name!r}")
        except ExportError:
            continue  # data-dependent: stays where it is
        before = point.prev
        with gm.graph.inserting_before(point):
            new = materialize(gm.graph, tree, dims)
        if isinstance(new, fx.Node):
            label_sizes(before, new, value)
            node.replace_all_uses_with(new)
        else:
            _replace_with_literal(node, new)
        replaced += 1
    gm.graph.eliminate_dead_code()
    return replaced


def _reads_placeholder(node: fx.Node) -> bool:
    """``sym_size(graph input, d)``: already canonical."""
    return (node.target is torch.ops.aten.sym_size.int and isinstance(node.args[0], fx.Node)
            and node.args[0].op == "placeholder")


def label_sizes(before: fx.Node, last: fx.Node, value: Any) -> None:
    """Nodes materialized after ``before`` up to ``last`` get a ``val`` meta (``last``: ``value``)."""
    node = before.next
    while True:
        if "val" not in node.meta:
            node.meta["val"] = _eval_meta(node) if node is not last else value
        if node is last:
            return
        node = node.next


def _eval_meta(node: fx.Node) -> Any:
    """The SymInt a materialized node computes, from its arguments' metadata."""
    args = [_arg_val(a) for a in node.args]
    if node.target is torch.ops.aten.sym_size.int:
        return args[0].shape[args[1]]
    return node.target(*args)  # type: ignore[operator]  # operator.* / torch.sym_* on SymInts


def _arg_val(a: Any) -> Any:
    return a.meta["val"] if isinstance(a, fx.Node) else a


def _replace_with_literal(node: fx.Node, value: int) -> None:
    for user in list(node.users):
        user.args = fx.map_arg(user.args, lambda a: value if a is node else a)
        user.kwargs = fx.map_arg(user.kwargs, lambda a: value if a is node else a)


# -- torch_executed_ops through decompositions -----------------------------------------------------


def provenance(node: fx.Node) -> set[str]:
    """Canonical names (``aten::softmax.int``) of the ops ``node`` was decomposed from."""
    out: set[str] = set()
    stack = list(node.meta.get("from_node") or ())
    while stack:
        source = stack.pop()
        target = getattr(source, "target", None)
        if isinstance(target, str) and _OVERLOAD.fullmatch(target):  # "aten.softmax.int", not "output"
            out.add(canonical_op_name(target))
        stack.extend(getattr(source, "from_node", None) or ())
    return out


def op_names(node: fx.Node) -> set[str]:
    """The node's own names (full and packet) and those of the ops it came from."""
    names = node_op_names(node.target)
    own = set(names) if names else set()
    return own | {n for full in provenance(node) for n in (full, full.rsplit(".", 1)[0])}


def forced_nodes(gm: fx.GraphModule, forced: Collection[str]) -> dict[fx.Node, str]:
    """Nodes ``torch_executed_ops`` keeps out of engines -> the name that matched them."""
    if not forced:
        return {}
    out: dict[fx.Node, str] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        hit = sorted(op_names(node) & set(forced))
        if hit:
            out[node] = hit[0]
    return out


def check_forced_matched(forced: Collection[str], matched: Collection[str], before: Any) -> list[str]:
    """Names that matched no node: refused when the model has the op but its trace was lost.

    ``before``: the graph before decomposition. A name the model does not use at all
    is returned (the caller warns); a name it uses that no decomposed node traces back to
    raises ExportError naming the core ATen ops it decomposes into.
    """
    unmatched = sorted(set(forced) - set(matched))
    for name in unmatched:
        users = [n for n in before.nodes if n.op == "call_function" and name in set(node_op_names(n.target) or ())]
        if users:
            core = decomposed_ops(users[0])
            raise ExportError(
                f"torch_executed_ops names {name!r}, which this model uses ({users[0].name!r}) but which "
                f"decomposes into {', '.join(core) or 'other ops'} before partitioning; name those "
                "core ATen ops instead")
    return unmatched


def decomposed_ops(node: fx.Node) -> list[str]:
    """The ops ``node``'s operator decomposes into (a probe trace on example-shaped tensors)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def example(a: Any) -> Any:
        val = a.meta.get("val") if isinstance(a, fx.Node) else a
        if isinstance(val, torch.Tensor):
            shape = [d if isinstance(d, int) else int(d.node.hint) for d in val.shape]
            return torch.zeros(shape, dtype=val.dtype)
        return val

    args, kwargs = fx.map_arg((node.args, node.kwargs), example)
    target: Any = node.target
    try:
        traced = make_fx(lambda *a: target(*a, **kwargs), decomposition_table=decomposition_table())(*args)
    except Exception:  # a probe only: no names is still a valid answer
        return []
    found = {node_op_names(n.target) for n in traced.graph.nodes if n.op == "call_function"}
    return sorted(names[0] for names in found if names)
