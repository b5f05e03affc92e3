"""A tree of guesses grown best first from a draft's own probabilities (SpecExec's way), within a size.

:class:`TreeGrower` keeps the candidates (a token under a node of the tree, scored by the draft's
probability of the whole path to it: the product of its probabilities along the way) and adds the
best one at a time; a node added is then expanded (the draft's distribution after its path offers
its ``width`` most likely children). A tree of ``size`` nodes therefore holds the ``size`` paths
the draft finds most likely, however deep or wide: a confident draft grows a long chain with few
siblings, an unsure one a bushy tree. Siblings come in the order of their probability, the order
:func:`pyrt.llm.tree_verify.verify_tree` tries them.

>>> import numpy as np
>>> g = TreeGrower(size=3, width=2)
>>> g.offer(-1, np.array([0.1, 0.6, 0.3]))         # the root's children: 1 (0.6), 2 (0.3)
>>> g.pop(), g.pop()                               # 1 first (0.6), then 2 (0.3) unless 1's children beat it
(0, 1)
>>> g.offer(0, np.array([0.9, 0.05, 0.05]))        # under 1: 0 with 0.6 * 0.9 = 0.54
>>> g.pop(), g.proposal().tokens, g.proposal().parents
(2, (1, 2, 0), (-1, -1, 0))
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from pyrt.llm.guesses import Proposal

WIDTH = 6  # children a node offers at most (the replay: 6 per node)
MIN_VISITS = 8  # checked nodes before the measured acceptance shapes a drafter's trees (before: its probabilities)


@dataclass
class TreeGrower:
    """A best-first tree of at most ``size`` guesses, each node offering its ``width`` likeliest children, no path
    deeper than ``max_depth``."""

    size: int
    width: int = WIDTH
    max_depth: int | None = None
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)  # log-probability of each node's path under the draft
    rates: np.ndarray | None = None  # per rank, the measured chance the target's token is that child (None: probs)
    offered: dict[int, tuple[int, ...]] = field(default_factory=dict)  # node -> the children it offered, by rank
    _heap: list[tuple[float, int, int, int]] = field(default_factory=list)  # (-score, order, parent, token)
    _order: itertools.count = field(default_factory=itertools.count)

    @property
    def full(self) -> bool:
        return len(self.tokens) >= self.size

    def offer(self, node: int, probs: np.ndarray) -> None:
        """``node``'s children (-1: the root's) from the draft's distribution ``probs`` after its path."""
        depth = 1 if node < 0 else self.depths[node] + 1
        if self.max_depth is not None and depth > self.max_depth:
            return
        base = 0.0 if node < 0 else self.scores[node]
        probs = np.asarray(probs, np.float64)
        best = [int(t) for t in np.argsort(-probs, kind="stable")[:self.width] if probs[t] > 0]
        self.offered[node] = tuple(best)
        for rank, token in enumerate(best):
            chance = probs[token] if self.rates is None else self.rates[rank]
            heapq.heappush(self._heap, (-(base + math.log(chance)), next(self._order), node, token))

    def pop(self) -> int | None:
        """The best candidate added to the tree: its index (None: the tree is full or nothing is left)."""
        if self.full or not self._heap:
            return None
        score, _, parent, token = heapq.heappop(self._heap)
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(1 if parent < 0 else self.depths[parent] + 1)
        self.scores.append(-score)
        return len(self.tokens) - 1

    def worth_expanding(self, node: int) -> bool:
        """Whether any child of ``node`` could still enter the tree: with measured rates, its best child's score
        (``node``'s times the top rank's chance) must beat enough of the candidates already waiting (fewer than the
        places left); a draft pass is saved where it cannot."""
        if self.rates is None:
            return not self.full
        bound = self.scores[node] + math.log(self.rates[0])
        better = sum(1 for entry in self._heap if -entry[0] >= bound)
        return better < self.size - len(self.tokens)

    def path(self, node: int) -> tuple[int, ...]:
        """The tokens from the root's first child down to ``node``."""
        out = []
        while node >= 0:
            out.append(self.tokens[node])
            node = self.parents[node]
        return tuple(reversed(out))

    def proposal(self) -> Proposal:
        """The tree as a proposal: its nodes in the order they were added (parents first, siblings by probability)."""
        return Proposal(tuple(self.tokens), None, tuple(self.parents))


class Acceptance:
    """How often the target's token is a node's ``r``-th likeliest child under the draft (Sequoia's acceptance
    vector), measured over the nodes the target's path reached in a drafter's checked trees: once measured, trees
    are shaped by it (a child's score: the product of these chances along its path) rather than by the draft's
    probabilities, which a draft can hold too flat or too sharp. Only the shape depends on it, never the tokens."""

    def __init__(self, width: int = WIDTH) -> None:
        self.hits = np.zeros(width)
        self.visits = 0

    def rates(self) -> np.ndarray | None:
        """Per rank, the chance the target's token is that child (smoothed); None before :data:`MIN_VISITS`."""
        return None if self.visits < MIN_VISITS else (self.hits + 0.5) / (self.visits + 1)

    def observe(self, grown: TreeGrower, tokens: tuple[int, ...]) -> None:
        """``tokens`` (the sequence's new tokens after the tree's root) walked down ``grown``: at each node that
        offered children, a visit, and a hit at the rank of the target's token if it was offered."""
        node = -1
        for token in tokens:
            offered = grown.offered.get(node)
            if offered is None:
                return
            self.visits += 1
            if token in offered:
                self.hits[offered.index(token)] += 1
            node = next((i for i, (t, p) in enumerate(zip(grown.tokens, grown.parents, strict=True))
                         if p == node and t == token), -2)
            if node == -2:
                return


__all__ = ["TreeGrower", "Acceptance", "WIDTH", "MIN_VISITS"]
