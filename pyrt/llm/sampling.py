"""Choosing the next token from logits: greedy, or sampling with temperature, top-k, top-p and min-p.

:func:`sample` is a function of (logits, parameters, random state) and, where the parameters'
logits processors need them, the sequence's tokens (a :class:`pyrt.llm.processors.History`): the
runner calls it for each row a step returns. The processors come first (greedy takes the argmax of
the processed row); sampling then follows ``transformers``' order (temperature, top-k, top-p, min-p,
then a draw from the softmax) with a ``numpy.random.Generator`` seeded per generation, so a seed
gives the same tokens on every run.

>>> import numpy as np
>>> greedy_token(np.array([0.1, 2.0, -1.0]))
1
>>> probabilities(np.array([2.0, 0.0, 3.0]), top_k=2).round(3).tolist()
[0.269, 0.0, 0.731]
"""

from __future__ import annotations

import numpy as np

from pyrt.llm.params import SamplingParams
from pyrt.llm.processors import History, process

NOTHING = History((), ())


def greedy_token(logits: np.ndarray) -> int:
    """The first index of the largest logit (``torch.argmax``'s choice)."""
    return int(np.argmax(logits))


def probabilities(logits: np.ndarray, temperature: float = 1.0, top_k: int | None = None,
                  top_p: float | None = None, min_p: float | None = None) -> np.ndarray:
    """The distribution a sampled token is drawn from (float64, sums to 1)."""
    scores = np.asarray(logits, dtype=np.float64) / temperature
    if top_k is not None and top_k < scores.size:
        kth = np.partition(scores, -top_k)[-top_k]
        scores = np.where(scores < kth, -np.inf, scores)
    probs = _softmax(scores)
    if top_p is not None and top_p < 1.0:
        order = np.argsort(probs, kind="stable")  # ascending, as transformers' TopPLogitsWarper
        cumulative = np.cumsum(probs[order])
        drop = cumulative <= 1.0 - top_p
        drop[-1] = False  # keep at least the most likely token
        scores = scores.copy()
        scores[order[drop]] = -np.inf
        probs = _softmax(scores)
    if min_p:  # transformers' MinPLogitsWarper: below min_p times the top probability is dropped
        probs = _softmax(np.where(probs < min_p * probs.max(), -np.inf, scores))
    return probs


def sample(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator,
           history: History = NOTHING) -> int:
    """One token: greedy, or a draw from :func:`probabilities` with ``rng``, after the logits processors (a
    sequence of ``history``)."""
    scores = process(logits, params, history)
    if not params.do_sample:
        return greedy_token(scores)
    return draw(distribution(scores, params), rng)


def distribution(scores: np.ndarray, params: SamplingParams) -> np.ndarray:
    """:func:`probabilities` of a processed row with ``params``' temperature, top-k, top-p and min-p."""
    return probabilities(scores, params.temperature, params.top_k, params.top_p, params.min_p)


def draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One index drawn from ``probs`` (non-negative, not necessarily normalised) with one ``rng.random()``."""
    index = int(np.searchsorted(np.cumsum(probs), rng.random() * probs.sum(), side="right"))
    return min(index, probs.size - 1)


def _softmax(scores: np.ndarray) -> np.ndarray:
    shifted = np.exp(scores - np.max(scores))
    out: np.ndarray = shifted / shifted.sum()
    return out
