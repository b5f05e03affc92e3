"""Data-dependent output shapes at export: such ops stay inside engines, planned at upper bounds.

``nonzero``, ``masked_select``, boolean-mask indexing and one-argument ``where``.

Such an op's result size is an *unbacked* symbol (``u0``) whose range torch's shape
environment knows (``nonzero`` of N elements: ``0 <= u0 <= N``). An engine output whose
shape uses one is kept when that range has a finite upper bound: the engine node's spec
records the bound (``EngineSpec.data_dependent``), the node's fake kernel gives the
re-exported program a fresh unbacked size with that range, and ExecuTorch (or pyrt's
direct writer) plans the tensor at its upper bound as a ``DYNAMIC_BOUND`` tensor. At run
time TensorRT reports the real shape through its output allocator.

* :func:`rewrite_masked_select`: ``masked_select(x, m)`` -> ``index.Tensor(x, [m])`` (both
  expanded to their broadcast shape when they differ): torch.onnx has no ``masked_select``
  but translates a boolean index as ``NonZero`` + ``GatherND``, and the result is the same.
* :func:`upper_shape`: the planned (upper-bound) shape of a tensor value.

>>> upper_shape(__import__("torch").empty(2, 3))
(2, 3)
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

import torch
import torch.fx as fx

from pyrt.errors import ExportError
from pyrt.export._graph.spec import symbol_bound

log = logging.getLogger("pyrt.export")


def upper_shape(value: torch.Tensor, where: str = "tensor") -> tuple[int, ...]:
    """Each dim at its upper bound (ExecuTorch's ``eval_upper_bound``); ExportError when one has none."""
    out = []
    for d, size in enumerate(value.shape):
        if isinstance(size, int):
            out.append(size)
            continue
        bound = symbol_bound(size.node, size.node.expr)
        if bound is None:
            raise ExportError(f"{where} dim {d} ({size.node.expr}) has no upper bound")
        out.append(bound)
    return tuple(out)


def rewrite_masked_select(gm: fx.GraphModule, keep: Collection[fx.Node] = ()) -> int:
    """Replace each ``masked_select`` not in ``keep`` by boolean-mask indexing; returns how many."""
    aten = torch.ops.aten
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.masked_select.default or node in keep:
            continue
        x, mask = node.args[0], node.args[1]
        if not (isinstance(x, fx.Node) and isinstance(mask, fx.Node)):
            continue
        xv, mv = x.meta.get("val"), mask.meta.get("val")
        if not (isinstance(xv, torch.Tensor) and isinstance(mv, torch.Tensor)):
            continue
        try:
            shape = tuple(torch.broadcast_shapes(xv.shape, mv.shape))
        except RuntimeError as exc:
            raise ExportError(f"masked_select {node.name!r}: {exc}") from None
        with gm.graph.inserting_before(node):
            x2, m2 = _expanded(gm, x, xv, shape), _expanded(gm, mask, mv, shape)
            index = gm.graph.call_function(aten.index.Tensor, (x2, [m2]))
        index.meta = dict(node.meta)
        node.replace_all_uses_with(index)
        gm.graph.erase_node(node)
        count += 1
    if count:
        log.debug("rewrote %d masked_select call(s) as boolean-mask indexing", count)
    return count


def _expanded(gm: fx.GraphModule, node: fx.Node, val: torch.Tensor, shape: tuple[Any, ...]) -> fx.Node:
    if tuple(val.shape) == shape:
        return node
    if any(not isinstance(s, int) for s in shape):
        raise ExportError(f"masked_select on {node.name!r}: broadcasting to the dynamic shape {shape} "
                          "is not supported; give both arguments the same shape")
    out = gm.graph.call_function(torch.ops.aten.expand.default, (node, list(shape)))
    out.meta = dict(node.meta)
    out.meta["val"] = val.expand(shape)
    return out


def bounded_outputs(spec: Any, values: list[Any]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(binding name, upper-bound shape) of each engine output whose shape only the run knows:
    a dim that uses one of ``spec.data_dependent``'s symbols (not one read from an input)."""
    names = set(spec.data_dependent)
    return tuple((b.name, upper_shape(v, f"engine output {b.name!r}"))
                 for b, dims, v in zip(spec.outputs, spec.output_dims, values, strict=True)
                 if any(_uses(d, names) for d in dims))


def _uses(tree: Any, names: set[str]) -> bool:
    if isinstance(tree, list):
        return (len(tree) == 2 and tree[0] == "sym" and tree[1] in names) or any(_uses(t, names) for t in tree[1:])
    return False
