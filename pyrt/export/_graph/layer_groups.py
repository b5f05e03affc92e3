"""Layer groups: cut a decoder's graph at layer boundaries into the fewest engines whose weights fit a size.

Every node gets an *item*: its layer's number plus one when torch.export's ``nn_module_stack`` puts it in a
numbered layer (``...layers.3...``, GPT-2's ``h.3``), else the earliest item of its users (the embedding and
the rotary tables go with layer 0; the final norm and the LM head, whose users are the outputs, are the last
item, ``head``), and never an item before one of its inputs' (so each cut leaves a graph without cycles).
Items are packed in order, greedily, into groups of at most ``limit`` weight bytes (greedy packing of a
sequence gives the fewest groups); an item bigger than ``limit`` is a group of its own, with a warning
naming it. A weight two items read (tied embeddings) counts in both: each engine carries its own copy.

>>> plan_groups([("layer 0", 6), ("layer 1", 6), ("layer 2", 6), ("head", 3)], 12)
[[0, 1], [2, 3]]
"""

from __future__ import annotations

import logging
import operator
import re
import warnings
from collections.abc import Collection
from dataclasses import dataclass

import torch
import torch.fx as fx

from pyrt.errors import ExportError

log = logging.getLogger("pyrt.export")
_LAYER_RE = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks|block)\.(\d+)(?:\.|$)")
HEAD = "final norm + LM head"


class EngineSizeWarning(UserWarning):
    """A single layer's weights are bigger than ``max_engine_size``: it is an engine of its own."""


@dataclass(frozen=True)
class Group:
    """One engine's share of the decoder: the layers it holds (``first``..``last``; ``head``: the final norm and
    LM head too) and its weights' bytes."""

    index: int
    first: int
    last: int
    head: bool
    weight_bytes: int

    @property
    def layers(self) -> str:
        """``"0-3"``, ``"4"``, ``"4-7+head"``, ``"head"``."""
        span = "" if self.first > self.last else str(self.first) if self.first == self.last \
            else f"{self.first}-{self.last}"
        return "+".join(p for p in (span, "head" if self.head else "") if p)


@dataclass(frozen=True)
class GroupPlan:
    """The cut: the groups in order, and each node's group."""

    groups: tuple[Group, ...]
    node_group: dict[fx.Node, int]

    def regions(self) -> list[list[fx.Node]]:
        """Each group's nodes in graph order. Items never decrease along an edge, so no path between two nodes of
        a group leaves it: each group can be partitioned on its own (:func:`~pyrt.export._graph.partition.propose`)."""
        out: list[list[fx.Node]] = [[] for _ in self.groups]
        for node, group in self.node_group.items():
            out[group].append(node)
        return out


def layer_of(node: fx.Node) -> int | None:
    """The numbered layer torch.export's ``nn_module_stack`` puts ``node`` in (its innermost such module)."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    for path, _ in reversed(list(stack.values())):
        match = _LAYER_RE.search(str(path))
        if match:
            return int(match.group(1))
    return None


def node_items(gm: fx.GraphModule) -> tuple[dict[fx.Node, int], int]:
    """(node -> item, number of layers): item ``k + 1`` is layer k, item ``layers + 1`` the head; monotone
    along every edge of the graph."""
    nodes = list(gm.graph.nodes)
    own = {n: layer for n in nodes if (layer := layer_of(n)) is not None}
    if not own:
        raise ExportError("max_engine_size: the graph has no numbered layers (torch.export's nn_module_stack names "
                          "no '...layers.N' module), so it cannot be cut at layer boundaries")
    layers = max(own.values()) + 1
    head = layers + 1
    latest: dict[fx.Node, int] = {}
    for n in reversed(nodes):  # as late as its users allow
        if n in own:
            latest[n] = own[n] + 1
        else:
            latest[n] = min((latest[u] for u in n.users if u.op != "output"), default=head)
    items: dict[fx.Node, int] = {}
    for n in nodes:  # never before an input; a tuple's getitem with its producer (a tuple cannot leave an engine)
        producer = n.args[0] if n.target is operator.getitem and isinstance(n.args[0], fx.Node) else None
        items[n] = items[producer] if producer is not None else \
            max([latest[n], *(items[a] for a in n.all_input_nodes)])
    return items, layers


def item_bytes(gm: fx.GraphModule, items: dict[fx.Node, int], count: int,
               state_inputs: Collection[str] = ()) -> list[int]:
    """Weight bytes of each item ``0..count-1``: every ``get_attr`` tensor (program state aside) counted in each
    item whose nodes read it."""
    sizes = [0] * count
    for n in gm.graph.nodes:
        if n.op != "get_attr" or str(n.target) in state_inputs:
            continue
        value = _attr(gm, str(n.target))
        if not isinstance(value, torch.Tensor):
            continue
        for item in {items[u] for u in n.users}:
            sizes[item] += value.numel() * value.element_size()
    return sizes


def _attr(gm: fx.GraphModule, target: str) -> object:
    value: object = gm
    for part in target.split("."):
        value = getattr(value, part, None)
    return value


def plan_groups(items: list[tuple[str, int]], limit: int) -> list[list[int]]:
    """Items (name, bytes) packed in order into the fewest groups of at most ``limit`` bytes (indices); an item
    over ``limit`` is a group of its own, with an :class:`EngineSizeWarning` naming it."""
    groups: list[list[int]] = []
    total = 0
    for index, (name, size) in enumerate(items):
        if size > limit:
            warnings.warn(f"{name} has {size} bytes of weights, more than max_engine_size={limit}: it is an engine "
                          "of its own", EngineSizeWarning, stacklevel=3)
        if not groups or total + size > limit:
            groups.append([index])
            total = size
        else:
            groups[-1].append(index)
            total += size
    return groups


def cut(gm: fx.GraphModule, limit: int, state_inputs: Collection[str] = ()) -> GroupPlan:
    """The fewest groups of whole layers (embedding with the first, head with the last or alone) whose weights
    each fit ``limit`` bytes."""
    items, layers = node_items(gm)
    sizes = item_bytes(gm, items, layers + 2, state_inputs)
    sizes[1] += sizes[0]  # item 0 is empty: nothing comes before layer 0's users
    named = [(f"layer {k}", sizes[k + 1]) for k in range(layers)] + [(HEAD, sizes[layers + 1])]
    packed = plan_groups(named, limit)
    group_of_item = {0: 0}
    groups = []
    for g, members in enumerate(packed):
        for m in members:
            group_of_item[m + 1] = g
        layer_ids = [m for m in members if m < layers]
        groups.append(Group(g, layer_ids[0] if layer_ids else layers, layer_ids[-1] if layer_ids else layers - 1,
                            layers in members, sum(named[m][1] for m in members)))
    log.info("max_engine_size=%d: %d layer(s) in %d group(s): %s", limit, layers, len(groups),
             ", ".join(f"{g.layers} ({g.weight_bytes} B)" for g in groups))
    return GroupPlan(tuple(groups), {n: group_of_item[i] for n, i in items.items()})


def spread(groups: tuple[Group, ...], devices: tuple[str, ...]) -> list[str]:
    """Each group's device: the groups in order over ``devices`` in order, balanced by weight bytes (a group goes
    to the device whose share of the total its middle byte falls in).

    >>> spread(tuple(Group(i, i, i, False, 10) for i in range(5)), ("cuda:0", "cuda:1"))
    ['cuda:0', 'cuda:0', 'cuda:1', 'cuda:1', 'cuda:1']
    """
    total = sum(g.weight_bytes for g in groups) or 1
    out, before = [], 0
    for g in groups:
        middle = before + g.weight_bytes / 2
        out.append(devices[min(len(devices) - 1, int(middle * len(devices) / total))])
        before += g.weight_bytes
    return out


__all__ = ["EngineSizeWarning", "Group", "GroupPlan", "HEAD", "cut", "layer_of", "node_items", "plan_groups",
           "spread"]
