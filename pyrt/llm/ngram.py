"""Prompt lookup (n-gram) drafting: guesses copied from the sequence's own prompt and output, no weights.

The last ``n`` tokens of a sequence are looked for earlier in it, longest ``n`` first
(``max_n`` down to ``min_n``); at the most recent earlier match, the tokens that followed it
are the guess. Text that repeats its input (summaries, edits, code, answers quoting a
retrieved passage) is where it guesses well; where nothing matches it guesses nothing and
the sequence decodes as without a draft. Its guesses are deterministic (``q`` one-hot for
speculative sampling: :mod:`pyrt.llm.verify`).

>>> lookup([1, 2, 3, 4, 9, 1, 2, 3], 3)          # "1 2 3" came before, followed by 4 9 1
(4, 9, 1)
>>> lookup([5, 1, 7, 1, 8, 1], 2)                # no earlier "8 1"; the most recent earlier "1" came before 8 1
(8, 1)
>>> lookup([1, 2, 3], 4)
()
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import numpy as np

from pyrt.errors import InputError
from pyrt.llm.scheduler import Proposal, Sequence

MAX_N, MIN_N = 3, 1  # longest n-gram tried first, shortest last


def lookup(context: Seq[int], k: int, max_n: int = MAX_N, min_n: int = MIN_N) -> tuple[int, ...]:
    """Up to ``k`` tokens that followed the most recent earlier occurrence of ``context``'s last ``n`` tokens,
    for the largest ``n`` in ``[min_n, max_n]`` that occurs; () when none does."""
    ids = np.asarray(context, np.int64)
    if k <= 0 or ids.size < 2:
        return ()
    for n in range(min(max_n, ids.size - 1), min_n - 1, -1):
        # windows that end before the last token: each is followed by at least one token
        windows = np.lib.stride_tricks.sliding_window_view(ids[:-1], n)
        hits = np.flatnonzero((windows == ids[-n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return tuple(ids[start:start + k].tolist())
    return ()


class NgramDrafter:
    """Prompt lookup for every sequence of an engine (stateless: nothing to free).

    >>> NgramDrafter(max_n=2).name, NgramDrafter().max_n
    ('ngram', 3)
    """

    name = "ngram"

    def __init__(self, max_n: int = MAX_N, min_n: int = MIN_N) -> None:
        for label, value in (("max_n", max_n), ("min_n", min_n)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"NgramDrafter {label}={value!r} must be an int >= 1")
        if min_n > max_n:
            raise InputError(f"NgramDrafter min_n={min_n} is more than max_n={max_n}")
        self.max_n, self.min_n = max_n, min_n

    def propose(self, rooms: Seq[tuple[Sequence, int]]) -> dict[int, Proposal]:
        """Each sequence's guesses (at most its room), by sequence id; sequences with none are left out."""
        out = {}
        for seq, k in rooms:
            guess = lookup(seq.context, k, self.max_n, self.min_n)
            if guess:
                out[seq.id] = Proposal(guess)
        return out

    def release(self, seq_id: int) -> None:
        """Nothing is held per sequence."""

    def close(self) -> None:
        """Nothing is held."""


__all__ = ["lookup", "NgramDrafter", "MAX_N", "MIN_N"]
