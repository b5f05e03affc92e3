"""Checking guessed tokens against the target's logits: which guesses stay, and the token after them.

:func:`verify` is a pure function of (the target's logits rows, the guesses, the draft's
distributions, the sampling parameters, the sequence's random state). Row ``i`` holds the
target's logits after the sequence's tokens and the first ``i`` guesses, so ``k`` guesses come
with ``k + 1`` rows. Greedy: a guess stays while it is the target's own argmax; the first that
is not is replaced by that argmax; when every guess stays, the last row gives one more token.
The tokens are then exactly greedy decoding's. Sampling (speculative sampling, Leviathan et
al. 2023; Chen et al. 2023): guess ``x`` stays with probability ``min(1, p(x) / q(x))``, ``p``
the target's and ``q`` the draft's distribution, both after the logits processors (each row's with the
sequence's tokens and the guesses before it, :mod:`pyrt.llm.processors`), temperature, top-k, top-p and min-p; the
first rejected one is replaced by a draw from ``max(0, p - q)`` normalised; when every guess
stays, one more token is drawn from the last row. A deterministic guess (prompt lookup) has
``q`` one-hot. Every token then has exactly the distribution that sampling without guesses gives.
With no guesses, :func:`verify` draws what :func:`pyrt.llm.sampling.sample` draws, with the same
random numbers.

>>> import numpy as np
>>> from pyrt.llm.params import SamplingParams
>>> rows = np.array([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0], [0.0, 0.0, 5.0]])
>>> verify(rows, (1, 2), None, SamplingParams(), np.random.default_rng(0))    # 1 stays; 2 is not argmax
(1, (1, 0))
>>> verify(rows, (1, 0), None, SamplingParams(), np.random.default_rng(0))    # both stay, then row 2's
(2, (1, 0, 2))
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import numpy as np

from pyrt.errors import InputError
from pyrt.llm.params import SamplingParams
from pyrt.llm.processors import History, process
from pyrt.llm.sampling import NOTHING, distribution, draw, greedy_token, sample


def verify(rows: np.ndarray, guesses: Seq[int], draft_probs: np.ndarray | None, params: SamplingParams,
           rng: np.random.Generator, history: History = NOTHING) -> tuple[int, tuple[int, ...]]:
    """(guesses accepted, the new tokens: those guesses, then the target's next token).

    ``rows``: ``[len(guesses) + 1, vocab]`` logits; ``draft_probs``: ``[len(guesses), vocab]``, the
    distribution each guess was drawn from (None: deterministic guesses, ``q`` one-hot); ``history``:
    the sequence's tokens before the first row (for the logits processors).
    """
    if len(rows) != len(guesses) + 1:
        raise InputError(f"{len(guesses)} guesses need {len(guesses) + 1} logits rows, got {len(rows)}")
    if not params.do_sample:
        return verify_greedy(rows, guesses, params, history)
    return verify_sampled(rows, guesses, draft_probs, params, rng, history)


def verify_greedy(rows: np.ndarray, guesses: Seq[int], params: SamplingParams | None = None,
                  history: History = NOTHING) -> tuple[int, tuple[int, ...]]:
    """Guesses kept while each is its (processed) row's argmax; then the argmax of the first row that disagrees
    (or the last)."""
    params = params or SamplingParams()
    for i, guess in enumerate(guesses):
        best = greedy_token(process(rows[i], params, history.then(tuple(guesses[:i]))))
        if best != guess:
            return i, (*guesses[:i], best)
    return len(guesses), (*guesses, greedy_token(process(rows[-1], params, history.then(tuple(guesses)))))


def verify_sampled(rows: np.ndarray, guesses: Seq[int], draft_probs: np.ndarray | None, params: SamplingParams,
                   rng: np.random.Generator, history: History = NOTHING) -> tuple[int, tuple[int, ...]]:
    """Speculative sampling over ``guesses``: one ``rng.random()`` per guess tested, one for the token drawn."""
    for i, guess in enumerate(guesses):
        p = distribution(process(rows[i], params, history.then(tuple(guesses[:i]))), params)
        q = one_hot(guess, p.size) if draft_probs is None else np.asarray(draft_probs[i], np.float64)
        if rng.random() * q[guess] < p[guess]:  # u < p(x) / q(x), without dividing by q(x)
            continue
        residual = np.maximum(p - q, 0.0)
        return i, (*guesses[:i], draw(residual if residual.sum() > 0 else p, rng))
    return len(guesses), (*guesses, sample(rows[len(guesses)], params, rng, history.then(tuple(guesses))))


def one_hot(index: int, size: int) -> np.ndarray:
    out = np.zeros(size, np.float64)
    out[index] = 1.0
    return out


__all__ = ["verify", "verify_greedy", "verify_sampled"]
