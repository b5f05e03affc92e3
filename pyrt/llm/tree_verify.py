"""Checking a tree of guessed tokens against the target's logits in one pass: the path that stays, the token after it.

:func:`verify_tree` is a pure function of (the target's logits rows, the guesses and their parents,
the sampling parameters, the sequence's random state). Row 0 holds the target's logits after the
sequence's last token (the root), row ``1 + i`` those after guess ``i`` and its ancestors. From the
root, greedy: the target's argmax at a node is the next token; a child guessing it is where the
path goes on; else that argmax ends it (the bonus token). The tokens are then exactly greedy
decoding's. Sampling (multi-candidate rejection sampling as in SpecInfer and SpecExec, for
deterministic children): at a node with distribution ``p`` (after the logits processors with the
path's tokens, temperature, top-k, top-p, min-p), its children are tried in order, child ``x``
accepted with probability ``p(x)``; a rejected one's token leaves ``p`` (``p(x)`` set to 0, the rest
renormalised: the residual of ``p`` less a one-hot ``q``), so no token is counted twice; when every
child is rejected, the token is drawn from what is left. Each token then has exactly the target's
distribution: P(first child) = p(x1), P(second) = (1 - p(x1)) p(x2) / (1 - p(x1)) = p(x2), and so on.

>>> import numpy as np
>>> from pyrt.llm.params import SamplingParams
>>> rows = np.array([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0], [5.0, 0.0, 0.0], [0.0, 4.0, 0.0]])
>>> verify_tree(rows, (2, 1, 0), (-1, -1, 1), SamplingParams(), np.random.default_rng(0))
((1, 2), (1, 0, 1))
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import numpy as np

from pyrt.errors import InputError
from pyrt.llm.params import SamplingParams
from pyrt.llm.processors import History, process
from pyrt.llm.sampling import NOTHING, distribution, draw, greedy_token


def children_of(parents: Seq[int]) -> dict[int, list[int]]:
    """Each node's children in order (-1: the root's), for nodes that have any."""
    out: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise InputError(f"guess {i}'s parent {p} does not come before it")
        out.setdefault(p, []).append(i)
    return out


def verify_tree(rows: np.ndarray, guesses: Seq[int], parents: Seq[int], params: SamplingParams,
                rng: np.random.Generator, history: History = NOTHING) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the accepted path: guess indices from the root down, the new tokens: the path's guesses, then the target's
    next token). ``rows``: ``[len(guesses) + 1, vocab]`` logits; ``history``: the tokens before the root's row."""
    if len(rows) != len(guesses) + 1 or len(parents) != len(guesses):
        raise InputError(f"a tree of {len(guesses)} guesses ({len(parents)} parents) needs {len(guesses) + 1} "
                         f"logits rows, got {len(rows)}")
    children = children_of(parents)
    node, path, tokens = -1, list[int](), list[int]()
    while True:
        scores = process(rows[node + 1], params, history.then(tuple(tokens)))
        kids = children.get(node, [])
        if params.do_sample:
            child, token = _sampled(distribution(scores, params), [(c, guesses[c]) for c in kids], rng)
        else:
            token = greedy_token(scores)
            child = next((c for c in kids if guesses[c] == token), None)
        tokens.append(token)
        if child is None:
            return tuple(path), tuple(tokens)
        path.append(child)
        node = child


def _sampled(p: np.ndarray, kids: list[tuple[int, int]], rng: np.random.Generator) -> tuple[int | None, int]:
    """(the accepted child, its token), or (None, a draw from the residual): one ``rng.random()`` per child tried."""
    residual = np.array(p, np.float64)
    for child, token in kids:
        if rng.random() < residual[token]:
            return child, token
        residual[token] = 0.0
        total = residual.sum()
        if total <= 0:
            break
        residual /= total
    return None, draw(residual if residual.sum() > 0 else p, rng)


__all__ = ["verify_tree", "children_of"]
