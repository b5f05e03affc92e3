"""Prompt lookup (n-gram) drafting: guesses copied from the sequence's own prompt and output, no weights.

The last ``n`` tokens of a sequence are looked for earlier in it, longest ``n`` first
(``max_n`` down to ``min_n``); at the most recent earlier match, the tokens that followed it
are the guess. A match close to the end is copied on into the guess itself (as LZ77 copies
overlap), so a loop the text has entered is guessed all the way. Text that repeats its input
(summaries, edits, code, answers quoting a retrieved passage) is where it guesses well; where
nothing matches it guesses nothing. Its guesses are deterministic (``q`` one-hot for
speculative sampling: :mod:`pyrt.llm.verify`).

>>> lookup([1, 2, 3, 4, 9, 1, 2, 3], 3)          # "1 2 3" came before, followed by 4 9 1
(4, 9, 1)
>>> lookup([5, 1, 7, 1, 8, 1], 2)                # no earlier "8 1"; the most recent earlier "1" came before 8 1
(8, 1)
>>> lookup([4, 0, 9, 0, 9], 4)                   # "0 9" came 2 tokens back: the loop goes on
(0, 9, 0, 9)
>>> lookup([1, 2, 3], 4)
()
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import numpy as np

from pyrt.checks import checked_int
from pyrt.errors import InputError
from pyrt.llm.guesses import DraftQuery, Proposal

MAX_N, MIN_N = 3, 1  # longest n-gram tried first, shortest last


def lookup(context: Seq[int], k: int, max_n: int = MAX_N, min_n: int = MIN_N) -> tuple[int, ...]:
    """``k`` tokens that followed the most recent earlier occurrence of ``context``'s last ``n`` tokens (copied
    on into the guess where the match is near the end), for the largest ``n`` in ``[min_n, max_n]`` that occurs;
    () when none does."""
    ids = np.asarray(context, np.int64)
    if k <= 0 or ids.size < 2:
        return ()
    for n in range(min(max_n, ids.size - 1), min_n - 1, -1):
        # windows that end before the last token: each is followed by at least one token
        windows = np.lib.stride_tricks.sliding_window_view(ids[:-1], n)
        hits = np.flatnonzero((windows == ids[-n:]).all(axis=1))
        if hits.size:
            return copy_on(ids.tolist(), int(hits[-1]) + n, k)
    return ()


def copy_on(ids: list[int], start: int, k: int) -> tuple[int, ...]:
    """``k`` tokens of ``ids`` from ``start`` on, the copy going on from what it copied past the end (LZ77)."""
    known = ids[start:start + k]
    period = len(ids) - start
    return tuple(known[i % period] for i in range(k))


class NgramIndex:
    """:func:`lookup` kept up to date for one growing sequence: each n-gram's most recent follower position.

    >>> index = NgramIndex(3, 1)
    >>> index.extend([1, 2, 3, 4, 9, 1, 2, 3]); index.guess(3)
    (4, 9, 1)
    """

    def __init__(self, max_n: int = MAX_N, min_n: int = MIN_N) -> None:
        self.max_n, self.min_n = max_n, min_n
        self._indexes: dict[int, NgramIndex] = {}  # sequence id -> its tokens' index (they only grow)
        self.ids: list[int] = []
        self.follows: dict[tuple[int, ...], int] = {}  # n-gram -> where the token after its last occurrence is

    def extend(self, tokens: Seq[int]) -> None:
        """Append ``tokens``; every n-gram whose next token is now known is indexed."""
        ids = self.ids
        for token in tokens:
            ids.append(token)
            end = len(ids) - 1
            for n in range(self.min_n, min(self.max_n, end) + 1):
                self.follows[tuple(ids[end - n:end])] = end

    def guess(self, k: int) -> tuple[int, ...]:
        """What :func:`lookup` gives for the tokens so far."""
        ids = self.ids
        if k <= 0:
            return ()
        for n in range(min(self.max_n, len(ids) - 1), self.min_n - 1, -1):
            start = self.follows.get(tuple(ids[len(ids) - n:]))
            if start is not None:
                return copy_on(ids, start, k)
        return ()


class NgramDrafter:
    """Prompt lookup for every sequence of an engine (an :class:`NgramIndex` per sequence, dropped when it ends).

    >>> NgramDrafter(max_n=2).name, NgramDrafter().max_n
    ('ngram', 3)
    """

    name = "ngram"

    def __init__(self, max_n: int = MAX_N, min_n: int = MIN_N) -> None:
        for label, value in (("max_n", max_n), ("min_n", min_n)):
            checked_int(value, f"NgramDrafter {label}", low=1)
        if min_n > max_n:
            raise InputError(f"NgramDrafter min_n={min_n} is more than max_n={max_n}")
        self.max_n, self.min_n = max_n, min_n
        self._indexes: dict[int, NgramIndex] = {}  # sequence id -> its tokens' index (they only grow)

    def propose(self, rooms: Seq[tuple[DraftQuery, int]]) -> dict[int, Proposal]:
        """Each sequence's guesses (at most its room), by sequence id; sequences with none are left out."""
        out = {}
        for seq, k in rooms:
            index = self._indexes.get(seq.id)
            if index is None:
                index = self._indexes[seq.id] = NgramIndex(self.max_n, self.min_n)
            done = len(index.ids)
            index.extend(seq.prompt[done:] + tuple(seq.new[max(done - len(seq.prompt), 0):]))
            guess = index.guess(k)
            if guess:
                out[seq.id] = Proposal(guess)
        return out

    def release(self, seq_id: int) -> None:
        """Sequence ``seq_id`` ended: its index goes."""
        self._indexes.pop(seq_id, None)

    def close(self) -> None:
        self._indexes.clear()


__all__ = ["lookup", "copy_on", "NgramIndex", "NgramDrafter", "MAX_N", "MIN_N"]
