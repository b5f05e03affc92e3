"""Cache rows inside a slot, for files that verify trees: its sequence's logical positions apart from its rows.

A slot file that verifies trees (:attr:`pyrt.llm.convention.Convention.tree`) takes, per token, the
cache row of its slot it writes (``writes``) beside its logical (RoPE) position, and which rows of
its slot it reads (``visible [T, W]``). Two siblings of a tree sit at one position but write two
rows, and neither reads the other. :class:`RowMap` is one slot's allocator: ``rows[p]`` is the
row that holds its logical position ``p``; a feed from ``start`` drops what follows ``start``
(those rows are free again) and takes the lowest free rows for its tokens; after verification
:meth:`RowMap.keep` keeps the rows of the accepted tokens only, and the rejected ones are free for
the next step. A chain (a prompt, one decode token, guesses in a row) therefore takes row ``p``
for position ``p``, as the older layout does; a sequence never reads a row it has not accepted.

:func:`feed_parents` is each fed token's parent inside its feed (-1: the sequence's last accepted
token), :func:`tree_inputs` the program's seven inputs for a step.

>>> m = RowMap(8)
>>> m.place(0, 3), m.rows
([0, 1, 2], [0, 1, 2])
>>> m.place(3, 3); m.keep([0, 2]); m.rows            # a root and two siblings: the second sibling is kept
[3, 4, 5]
[0, 1, 2, 3, 5]
>>> m.place(5, 2)                                     # rows 4 and 6 were free
[4, 6]
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import numpy as np

from pyrt.errors import PyrtError


class RowMap:
    """One slot's rows (``size`` of them): ``rows[p]`` holds logical position ``p`` of the sequence in it."""

    def __init__(self, size: int, source: str = "") -> None:
        self.size, self.source = size, source
        self.rows: list[int] = []
        self._start, self._placed = 0, list[int]()

    def place(self, start: int, count: int) -> list[int]:
        """Rows for ``count`` tokens fed from logical position ``start``: what followed ``start`` is let go, the
        lowest free rows taken (all kept until :meth:`keep` says otherwise). A map that knows no row yet and is
        fed from ``start`` > 0 holds positions ``0 .. start - 1`` at rows of the same number (a chain's)."""
        if not self.rows and start:
            self.rows = list(range(start))
        if start > len(self.rows):
            raise PyrtError(f"{self.source}: a feed from position {start} of a sequence holding {len(self.rows)}")
        del self.rows[start:]
        used = set(self.rows)
        placed = [r for r in range(self.size) if r not in used][:count]
        if len(placed) < count:
            raise PyrtError(f"{self.source}: {count} tokens fed at position {start} but the slot has "
                            f"{len(placed)} free rows of {self.size}")
        self._start, self._placed = start, placed
        self.rows.extend(placed)
        return placed

    def keep(self, indices: Seq[int]) -> None:
        """Of the last :meth:`place`'s tokens, those at ``indices`` (in order: a path from the first) stay."""
        self.rows[self._start:] = [self._placed[i] for i in indices]


def chain_parents(count: int) -> list[int]:
    """Parents of ``count`` tokens fed in a row: each the one before (-1: the sequence's last accepted token)."""
    return list(range(-1, count - 1))


def feed_parents(count: int, guess_parents: Seq[int] | None, guesses: int) -> list[int]:
    """Each of a feed's ``count`` tokens' parent inside the feed (-1: the sequence's last accepted token): the tokens
    before its ``guesses`` in a row, then each guess's (``guess_parents[i]``: the index of its parent among the
    guesses, -1 the token before them; None: a chain)."""
    if guess_parents is None or not guesses:
        return chain_parents(count)
    before = count - guesses
    return [*chain_parents(before), *(before - 1 if p < 0 else before + p for p in guess_parents)]


def depths(parents: Seq[int]) -> list[int]:
    """Each token's depth under the sequence's last accepted token (a parent comes before its children)."""
    out: list[int] = []
    for i, p in enumerate(parents):
        if p >= i:
            raise PyrtError(f"token {i}'s parent {p} does not come before it")
        out.append(0 if p < 0 else out[p] + 1)
    return out


def ancestry(parents: Seq[int]) -> np.ndarray:
    """``[n, n]`` int64: ``a[i, j]`` is 1 where token ``j`` is token ``i`` or one of its ancestors in the feed."""
    n = len(parents)
    out = np.zeros((n, n), np.int64)
    for i, p in enumerate(parents):
        if p >= 0:
            out[i] = out[p]
        out[i, i] = 1
    return out


@dataclass(frozen=True)
class Placed:
    """One feed as placed in its slot: ``tokens`` from logical position ``start`` with their ``parents`` in the feed
    (:func:`feed_parents`), the rows its sequence had accepted before ``start`` and the rows its tokens write; it
    wants the logits of its last ``logits`` tokens."""

    slot: int
    start: int
    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    accepted: tuple[int, ...]
    writes: tuple[int, ...]
    logits: int


def tree_inputs(feeds: Seq[Placed], window: int) -> tuple[np.ndarray, ...]:
    """``(tokens, slots, positions, writes, rows, window, visible)`` of a step of ``feeds``; ``window``: the rows the
    step attends to (more than the largest any feed reads or writes). Each token reads the rows its sequence accepted
    and those of its ancestors in the feed (itself included), nothing else."""
    tokens: list[int] = []
    slots: list[int] = []
    positions: list[int] = []
    writes: list[int] = []
    wanted: list[int] = []
    for f in feeds:
        n, base = len(f.tokens), len(tokens)
        tokens.extend(f.tokens)
        slots.extend([f.slot] * n)
        positions.extend(f.start + d for d in depths(f.parents))
        writes.extend(f.writes)
        wanted.extend(range(base + n - f.logits, base + n))
    visible = np.zeros((len(tokens), window), np.int64)
    base = 0
    for f in feeds:
        n = len(f.tokens)
        visible[base:base + n, list(f.accepted)] = 1
        visible[base:base + n, list(f.writes)] = ancestry(f.parents)
        base += n
    return (np.array(tokens, np.int64), np.array(slots, np.int64), np.array(positions, np.int64),
            np.array(writes, np.int64), np.array(wanted or [0], np.int64), np.arange(window, dtype=np.int64),
            visible)


__all__ = ["RowMap", "Placed", "chain_parents", "feed_parents", "depths", "ancestry", "tree_inputs"]
