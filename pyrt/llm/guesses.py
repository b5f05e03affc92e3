"""Speculative decoding's guesses: what a draft sees of a sequence (:class:`DraftQuery`) and what it gives back
(:class:`Proposal`), and how a proposal is padded to the room a step gives it (:func:`fill`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pyrt.llm.processors import History
from pyrt.llm.request import Request


@dataclass(frozen=True, eq=False)
class Proposal:
    """A drafter's guesses for one sequence: the ``tokens`` it guesses follow the sequence's last one, and
    ``probs`` (``[len(tokens), vocab]``) the distribution each was drawn from (None: chosen deterministically).

    ``parents``: a tree of guesses (None: a chain, each guess after the one before): ``parents[i]`` is the index of
    guess ``i``'s parent among the guesses (before ``i``), -1 for the sequence's last token; a tree's guesses are
    deterministic (``probs`` None), siblings in the order they are tried (:mod:`pyrt.llm.tree_verify`)."""

    tokens: tuple[int, ...]
    probs: np.ndarray | None = None
    parents: tuple[int, ...] | None = None

    def head(self, n: int) -> Proposal:
        """The first ``n`` guesses (a tree's first ``n`` nodes are a tree: parents come first)."""
        if n >= len(self.tokens):
            return self
        return Proposal(self.tokens[:n], None if self.probs is None else self.probs[:n],
                        None if self.parents is None else self.parents[:n])


@dataclass(frozen=True)
class DraftQuery:
    """What a draft sees of one sequence it guesses for: its id, prompt, new tokens, request, and the random state
    its target samples with (a sampling draft draws from it too, so that one seeded stream serves both); ``tree``:
    the room is a tree's size (:mod:`pyrt.llm.tree`)."""

    id: int
    prompt: tuple[int, ...]
    new: tuple[int, ...]
    request: Request
    rng: np.random.Generator
    tree: bool = False  # its front end asks a tree of guesses (a drafter that cannot grow one guesses a chain)

    @property
    def context(self) -> tuple[int, ...]:
        """Every token so far: the prompt, then the new ones."""
        return (*self.prompt, *self.new)

    def history(self) -> History:
        """What the logits processors read for the token after ``context`` (a sequence that guesses has no grammar)."""
        return History(self.prompt, self.new, self.request.eos_ids)


def fill(proposal: Proposal | None, last: int, room: int, vocab: int) -> Proposal:
    """``proposal`` padded to ``room`` guesses with its last token repeated (``last``, the sequence's last token,
    when it has none): deterministic guesses (one-hot rows beside a draft's distributions), checked like any other.

    Every decoding sequence then checks as many guesses as the step gives it, so that a steady batch runs steps of
    one shape: pyrt's runtime runs a method on its fast path while its input shapes repeat the last run's, and a GPU
    replays one CUDA graph; a streamed weight pass costs the same whatever it carries, and a repeated token is
    sometimes right.

    >>> fill(None, 7, 3, 10).tokens, fill(Proposal((4,)), 7, 3, 10).tokens
    ((7, 7, 7), (4, 4, 4))
    """
    tokens = () if proposal is None else proposal.tokens
    extra = room - len(tokens)
    if extra <= 0 and proposal is not None:
        return proposal
    filler = (tokens[-1] if tokens else last,) * extra
    probs = None if proposal is None else proposal.probs
    if probs is not None:
        probs = np.concatenate([probs, np.eye(vocab)[list(filler)]])
    parents = None if proposal is None or proposal.parents is None else (
        *proposal.parents, *range(len(tokens) - 1, len(tokens) - 1 + extra))  # a chain after the last node
    return Proposal((*tokens, *filler), probs, parents)


__all__ = ["Proposal", "DraftQuery", "fill"]
