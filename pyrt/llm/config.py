"""What an engine generates with, beside each request's sampling: :class:`GenerationConfig`, checked once.

One frozen record per front end (:class:`pyrt.llm.Engine`, ``pyrt.generate``), made at the edge
(a keyword of ``Engine``, the ``pyrt generate`` and ``pyrt serve`` flags, embedded in
:class:`pyrt.serve.config.ServeConfig`) and passed down as it is: nothing below re-checks a
field or writes its default again. A bad value is an :class:`pyrt.errors.InputError` whose
``field`` is the field's name, for the edge to spell as its own caller does (``--draft-tokens``).

>>> GenerationConfig(draft="ngram", draft_tokens=8).draft_tokens
8
>>> GenerationConfig(draft_tokens=0)
Traceback (most recent call last):
...
pyrt.errors.InputError: draft_tokens=0 must be an int >= 1
>>> GenerationConfig(max_queued=True)
Traceback (most recent call last):
...
pyrt.errors.InputError: max_queued=True must be an int >= 0 or None (no bound)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyrt.checks import checked_int, is_int
from pyrt.errors import InputError

DRAFTS = "None, \"ngram\", a draft LLM file (a path, or its pyrt.Program: pyrt.llm.open_draft) or a drafter"


@dataclass(frozen=True)
class GenerationConfig:
    """``method``: the program's method that generates. ``draft``: speculative decoding's draft: None,
    ``"ngram"`` (prompt lookup), the path of a draft LLM file (opened fully resident on the target's
    devices by the engine that uses it), its :class:`pyrt.Program`, or a drafter object
    (:class:`pyrt.llm.Drafter`). ``draft_tokens``: the most tokens one sequence guesses per step.
    ``draft_tree``: the guesses are a tree grown best first from the draft's probabilities (``draft_tokens`` its
    size: the tokens one sequence has verified per pass, e.g. 32), checked in one pass; it needs a slot file that
    verifies trees (written by ``decoder_to_pte(max_batch_size=...)`` now) and a draft.
    ``max_queued``: generations that may wait for a KV-cache slot beyond the slots free now (None: no
    bound); past it a submission is a :class:`pyrt.errors.QueueFullError`. ``prefix_caching``: a generation
    takes the free KV-cache slot whose cache holds the longest prefix of its prompt and prefills only the
    rest (:mod:`pyrt.llm.slots`; the same tokens as without).
    """

    method: str = "forward"
    draft: Any = None
    draft_tokens: int = 4
    draft_tree: bool = False
    max_queued: int | None = None
    prefix_caching: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.method, str) or not self.method:
            raise InputError(f"method={self.method!r} must be a method name", field="method")
        object.__setattr__(self, "draft", _draft(self.draft))
        checked_int(self.draft_tokens, "draft_tokens", low=1)
        if not isinstance(self.draft_tree, bool):
            raise InputError(f"draft_tree={self.draft_tree!r} must be True or False", field="draft_tree")
        if self.draft_tree and self.draft is None:
            raise InputError("draft_tree=True needs a draft (draft=None guesses nothing)", field="draft_tree")
        if self.max_queued is not None and not is_int(self.max_queued, low=0):
            raise InputError(f"max_queued={self.max_queued!r} must be an int >= 0 or None (no bound)",
                             field="max_queued")
        if not isinstance(self.prefix_caching, bool):
            raise InputError(f"prefix_caching={self.prefix_caching!r} must be a bool", field="prefix_caching")

    @property
    def draft_path(self) -> str | None:
        """The draft file's path when ``draft`` names one (else None)."""
        return self.draft if isinstance(self.draft, str) and self.draft != "ngram" else None


def _draft(value: Any) -> Any:
    """``draft`` checked: None, "ngram", an existing file (its resolved path, a str), or an object (a Program or a
    drafter, checked against the target when an engine takes it)."""
    if value is None or value == "ngram":
        return value
    if isinstance(value, (str, os.PathLike)):
        path = Path(value)
        if not path.is_file():
            raise InputError(f"draft={os.fspath(value)!r}: pass {DRAFTS} (no such file)", field="draft")
        return str(path.resolve())
    return value


__all__ = ["GenerationConfig"]
