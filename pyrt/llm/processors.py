"""Logits processors and log-probabilities: what a sequence's tokens and parameters do to a row of logits.

:func:`process` applies :class:`pyrt.llm.params.SamplingParams`' processors to one row, given the
sequence's :class:`History` (its prompt, its new tokens, the ids that end it), in this order:
``logit_bias`` (added), ``repetition_penalty`` (``transformers``' ``RepetitionPenaltyLogitsProcessor``:
a token of the prompt or the output has its logit divided by the penalty when positive, multiplied
when negative), ``frequency_penalty`` / ``presence_penalty`` (OpenAI's: ``count * frequency + (count > 0)
* presence`` subtracted, counting the new tokens), ``min_tokens`` (the ending ids at -inf until that
many new tokens: ``MinNewTokensLengthLogitsProcessor``), then an ``allowed`` mask (structured output:
the ids a grammar allows next). Greedy decoding takes the argmax of the processed row; sampling divides
it by the temperature and cuts it (:mod:`pyrt.llm.sampling`). :func:`token_logprobs` is what a
generation reports per new token: the log-softmax of the processed row after temperature.

>>> h = History(prompt=(1, 2), new=(2, 2), eos_ids=frozenset({0}))
>>> from pyrt.llm.params import SamplingParams
>>> process(np.array([1.0, 2.0, -2.0, 0.0]), SamplingParams(repetition_penalty=2.0), h).tolist()
[1.0, 1.0, -4.0, 0.0]
>>> process(np.array([1.0, 2.0, 1.0, 0.0]), SamplingParams(frequency_penalty=0.5, presence_penalty=0.25), h).tolist()
[1.0, 2.0, -0.25, 0.0]
>>> process(np.zeros(4), SamplingParams(min_tokens=3, logit_bias={3: 5}), h).tolist()
[-inf, 0.0, 0.0, 5.0]
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from pyrt.llm.params import SamplingParams

Alternatives = tuple[tuple[int, float], ...]


class Matcher(Protocol):
    """A generation's grammar state (structured output): the ids it allows next, advanced per token."""

    def allowed(self, eos_ids: Collection[int]) -> np.ndarray:
        """A boolean mask of the vocabulary: the ids allowed next (``eos_ids`` where the grammar may end here)."""
        ...

    def accept(self, token: int) -> None:
        """``token`` was chosen: advance."""
        ...

    @property
    def finished(self) -> bool:
        """The grammar is complete (the generation stops)."""
        ...


@dataclass(frozen=True)
class History:
    """What a row's processors read: the sequence's prompt and new tokens before the row, the ids that end it,
    and ``allowed`` (a boolean mask of the vocabulary, or None: every id)."""

    prompt: tuple[int, ...]
    new: tuple[int, ...]
    eos_ids: frozenset[int] = field(default_factory=frozenset)
    allowed: np.ndarray | None = None

    def then(self, tokens: tuple[int, ...]) -> History:
        """The history after ``tokens`` more new tokens (guesses being checked), with no mask."""
        return History(self.prompt, (*self.new, *tokens), self.eos_ids) if tokens else self


@dataclass(frozen=True)
class TokenLogprob:
    """A new token's log-probability and the ``top`` most likely alternatives (id, log-probability), best first."""

    token: int
    logprob: float
    top: Alternatives = ()


def process(logits: np.ndarray, params: SamplingParams, history: History) -> np.ndarray:
    """``logits`` (one row) after ``params``' processors for a sequence with ``history`` (float64; the input
    itself when nothing changes it)."""
    if not params.processed and history.allowed is None:
        return logits
    scores = np.array(logits, dtype=np.float64)
    for token, bias in params.logit_bias:
        scores[token] += bias
    if params.repetition_penalty != 1.0:
        seen = np.unique(np.fromiter((*history.prompt, *history.new), np.int64))
        picked = scores[seen]
        scores[seen] = np.where(picked < 0, picked * params.repetition_penalty, picked / params.repetition_penalty)
    if (params.frequency_penalty or params.presence_penalty) and history.new:
        counts = np.bincount(np.fromiter(history.new, np.int64), minlength=scores.size)[:scores.size]
        scores -= counts * params.frequency_penalty + (counts > 0) * params.presence_penalty
    if len(history.new) < params.min_tokens and history.eos_ids:
        scores[[t for t in history.eos_ids if t < scores.size]] = -np.inf
    if history.allowed is not None:
        scores[~history.allowed[:scores.size]] = -np.inf
    return scores


def log_softmax(scores: np.ndarray) -> np.ndarray:
    """``log(softmax(scores))`` in float64 (-inf stays -inf)."""
    scores = np.asarray(scores, dtype=np.float64)
    top = np.max(scores)
    out: np.ndarray = scores - top - np.log(np.sum(np.exp(scores - top)))
    return out


def token_logprobs(processed: np.ndarray, token: int, params: SamplingParams) -> TokenLogprob:
    """``token``'s log-probability under ``processed`` (a processed row) after the temperature (1 when greedy),
    with the ``params.logprobs`` most likely ids (ties: the lower id first)."""
    temperature = params.temperature if params.do_sample else 1.0
    logs = log_softmax(np.asarray(processed, dtype=np.float64) / temperature)
    count = params.logprobs or 0
    top: Alternatives = ()
    if count:
        best = np.argsort(-logs, kind="stable")[:count]
        top = tuple((int(i), float(logs[i])) for i in best)
    return TokenLogprob(int(token), float(logs[token]), top)


__all__ = ["Matcher", "History", "TokenLogprob", "process", "log_softmax", "token_logprobs"]
