"""Speculative decoding's drafts: what guesses a sequence's next tokens for the target to check in one pass.

A weight-streamed step costs about what streaming the weights costs, however many tokens it
carries; checking k guessed tokens in the step that feeds a sequence's last token gives up to
k + 1 tokens per pass of the weights, each exactly what decoding without guesses gives
(greedy: token for token; sampling: in distribution, :mod:`pyrt.llm.verify`). The drafts:

- ``"ngram"``: prompt lookup over the sequence's own prompt and output (:mod:`pyrt.llm.ngram`);
  no extra weights; strongest where the output repeats the input (summaries, edits, code).
- a draft program (:mod:`pyrt.llm.draft_model`): a second, smaller LLM file with the target's
  vocabulary, BOS and EOS ids, holding its own KV-cache slot per sequence.

:func:`make_drafter` turns what ``pyrt.generate(..., draft=...)`` and ``pyrt.llm.Engine(...,
draft=...)`` take into a :class:`Drafter`, checked against the target; :func:`open_draft` opens a
draft file fully resident.

>>> make_drafter(None, None) is None, make_drafter("ngram", None).name
(True, 'ngram')
>>> make_drafter(3, None)
Traceback (most recent call last):
...
pyrt.errors.InputError: draft=int: pass None, "ngram", a draft file's Program (pyrt.llm.open_draft) or a drafter
"""

from __future__ import annotations

import os
from collections.abc import Sequence as Seq
from typing import Any, Protocol

import numpy as np

from pyrt.errors import InputError, PyrtError
from pyrt.llm.draft_model import DraftModel
from pyrt.llm.ngram import NgramDrafter
from pyrt.llm.program import LLMProgram
from pyrt.llm.scheduler import Proposal, Sequence
from pyrt.runtime.program import Program

WHAT = "pass None, \"ngram\", a draft file's Program (pyrt.llm.open_draft) or a drafter"


class Drafter(Protocol):
    """What an engine asks of a draft, on its stepping thread."""

    name: str

    def propose(self, rooms: Seq[tuple[Sequence, int]]) -> dict[int, Proposal]:
        """Up to ``room`` guesses for each ``(sequence, room)``, by sequence id (none for sequences left out)."""
        ...

    def release(self, seq_id: int) -> None:
        """Sequence ``seq_id`` ended (finished, cancelled or failed): free what it held."""
        ...

    def close(self) -> None:
        """The engine closes: free everything."""
        ...


def make_drafter(draft: Any, target: LLMProgram) -> Drafter | None:
    """The drafter ``draft`` (a :class:`~pyrt.llm.config.GenerationConfig`'s, checked there) names: None (no
    speculation), ``"ngram"``, a draft file's path (opened by :func:`open_draft` on ``target``'s devices and kernels,
    closed with the drafter), a :class:`pyrt.Program` or :class:`pyrt.llm.LLMProgram` of one (checked against
    ``target``), or a drafter itself."""
    if draft is None:
        return None
    if draft == "ngram":
        return NgramDrafter()
    if isinstance(draft, str):
        program = target.program
        try:
            opened = open_draft(draft, kernels=getattr(program, "kernels", None),
                                devices=getattr(program, "devices", None))
        except PyrtError as exc:
            raise InputError(f"draft {draft}: {exc}", field="draft") from None
        try:
            return DraftModel(LLMProgram(opened), target.conv, target.source, owned=opened)
        except BaseException:
            opened.close()
            raise
    if isinstance(draft, (Program, LLMProgram)):
        llm = draft if isinstance(draft, LLMProgram) else LLMProgram(draft)
        return DraftModel(llm, target.conv, target.source)
    if all(callable(getattr(draft, name, None)) for name in ("propose", "release", "close")):
        drafter: Drafter = draft
        return drafter
    raise InputError(f"draft={type(draft).__name__}: {WHAT}", field="draft")


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
    return Proposal((*tokens, *filler), probs)


def open_draft(path: str | os.PathLike[str], *, budget: Any = "100%", **program: Any) -> Program:
    """Open a draft LLM file as a :class:`pyrt.Program`, fully resident by default: a draft's weights are small and
    read at every guess, so streaming them would cost what speculation saves (``budget`` applies to a file with
    streamable weights; None: as loaded); ``program``: the other keywords of Program."""
    prog = Program(path, **program)
    try:
        if budget is not None and any(w.streamable_bytes for w in prog.weight_streaming):
            prog.set_budget(budget)
    except BaseException:
        prog.close()
        raise
    return prog


__all__ = ["Drafter", "make_drafter", "open_draft", "fill"]
