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

from pyrt.errors import InputError, PyrtError
from pyrt.llm.convention import Convention
from pyrt.llm.draft_model import DraftModel
from pyrt.llm.guesses import DraftQuery, Proposal, fill
from pyrt.llm.ngram import NgramDrafter
from pyrt.llm.program import engine_convention
from pyrt.runtime.program import Program

WHAT = "pass None, \"ngram\", a draft file's Program (pyrt.llm.open_draft) or a drafter"


class Drafter(Protocol):
    """What an engine core asks of a draft, on its stepping thread (the only thread that calls it)."""

    name: str

    def propose(self, rooms: Seq[tuple[DraftQuery, int]]) -> dict[int, Proposal]:
        """Up to ``room`` guesses for each ``(sequence, room)``, by sequence id (none for sequences left out)."""
        ...

    def release(self, seq_id: int) -> None:
        """Sequence ``seq_id`` ended (finished, cancelled or failed): free what it held."""
        ...

    def close(self) -> None:
        """The engine closes: free everything."""
        ...


class Target(Protocol):
    """The target a draft guesses for: its program, convention and name."""

    program: Any
    conv: Convention
    source: str


def make_drafter(draft: Any, target: Target) -> Drafter | None:
    """The drafter ``draft`` (a :class:`~pyrt.llm.config.GenerationConfig`'s, checked there) names: None (no
    speculation), ``"ngram"``, a draft file's path (opened by :func:`open_draft` on ``target``'s devices and kernels,
    closed with the drafter), a :class:`pyrt.Program` of one (checked against ``target``), or a drafter itself.
    A draft program's KV-cache slots are the drafter's own: a draft Program shared by two engines at once guesses
    worse (never wrongly: the target checks every guess), so give each engine its own."""
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
            return DraftModel(opened, engine_convention(opened, "forward"), target.conv, target.source, owned=True)
        except BaseException:
            opened.close()
            raise
    if isinstance(draft, Program):
        return DraftModel(draft, engine_convention(draft, "forward"), target.conv, target.source)
    if all(hasattr(draft, name) for name in ("program", "conv", "source")) and not callable(getattr(
            draft, "propose", None)):  # a target of its own (a stand-in program's core in tests)
        return DraftModel(draft.program, draft.conv, target.conv, target.source)
    if all(callable(getattr(draft, name, None)) for name in ("propose", "release", "close")):
        drafter: Drafter = draft
        return drafter
    raise InputError(f"draft={type(draft).__name__}: {WHAT}", field="draft")


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


__all__ = ["Drafter", "DraftQuery", "make_drafter", "open_draft", "fill"]
