"""Partitioning a graph region by region (layer groups): the same cycle-free partitions, memory of one region.

torch's ``CapabilityBasedPartitioner`` keeps every node's set of downstream nodes, so its memory is quadratic in
the nodes it sees; :func:`pyrt.export._graph.partition.propose` with ``regions`` shows it one region at a time.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable

import torch
import torch.fx as fx

from pyrt.export._graph.partition import propose


def chain(length: int, unsupported: frozenset[int] = frozenset()) -> tuple[fx.GraphModule, Callable[[fx.Node], bool]]:
    """``x -> relu -> relu -> ...`` (``length`` calls), and a support test that refuses the calls numbered in
    ``unsupported``."""
    graph = fx.Graph()
    value = graph.placeholder("x")
    refused = set()
    for i in range(length):
        value = graph.call_function(torch.relu, (value,))
        if i in unsupported:
            refused.add(value)
    graph.output(value)
    return fx.GraphModule(torch.nn.Module(), graph), lambda n: n.op == "call_function" and n not in refused


def calls(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function"]


def cuts(nodes: list[fx.Node], size: int) -> list[list[fx.Node]]:
    return [nodes[i:i + size] for i in range(0, len(nodes), size)]


def convex(part: list[fx.Node]) -> bool:
    """No path leaves ``part`` and comes back into it."""
    inside, seen = set(part), set()
    todo = [u for n in part for u in n.users if u not in inside]
    while todo:
        n = todo.pop()
        if n in inside:
            return False
        if n not in seen:
            seen.add(n)
            todo.extend(n.users)
    return True


def test_no_partition_spans_two_regions_and_each_region_is_partitioned_as_a_whole_graph_would_be() -> None:
    gm, supported = chain(40, unsupported=frozenset({13, 27}))
    nodes = calls(gm)
    regions = cuts(list(gm.graph.nodes), 10)
    parts = propose(gm, supported, 1, regions)
    region_of = {n: r for r, members in enumerate(regions) for n in members}
    assert all(len({region_of[n] for n in p}) == 1 for p in parts)
    assert [n for p in parts for n in p] == [n for n in nodes if supported(n)]  # every supported call, in order
    whole = propose(gm, supported, 1)
    split_by_region = [[n for n in p if region_of[n] == r] for p in whole for r in sorted({region_of[n] for n in p})]
    assert parts == split_by_region


def test_a_region_with_two_paths_keeps_its_partitions_free_of_cycles() -> None:
    """a -> b (unsupported) -> d and a -> c -> d: {a, c, d} as one engine would need b between its own nodes."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    a = graph.call_function(torch.relu, (x,))
    b = graph.call_function(torch.sigmoid, (a,))
    c = graph.call_function(torch.tanh, (a,))
    d = graph.call_function(torch.add, (b, c))
    e = graph.call_function(torch.relu, (d,))
    graph.output(e)
    gm = fx.GraphModule(torch.nn.Module(), graph)
    parts = propose(gm, lambda n: n.op == "call_function" and n is not b, 1, [[x, a, b, c], [d, e]])
    assert all(convex(p) for p in parts)
    assert {n for p in parts for n in p} == {a, c, d, e}
    assert not any(a in p and d in p for p in parts)


def test_the_partitioners_memory_is_one_regions_share() -> None:
    gm, supported = chain(1200)
    nodes = list(gm.graph.nodes)
    peaks = []
    for regions in (None, cuts(nodes, 100)):
        tracemalloc.start()
        propose(gm, supported, 1, regions)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    whole, by_region = peaks
    assert by_region * 10 < whole, f"{by_region} B by region, {whole} B whole"
