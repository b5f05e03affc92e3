"""Which KV-cache slots of a program are taken: one :class:`SlotTable` per engine core, touched by its thread alone.

A file exported with ``decoder_to_pte(max_batch_size=B)`` holds B slots; any other LLM file holds
one. A generation takes a slot before its first token and gives it back after its last, so
generations on one program never write or read each other's cache, whichever front end (a
:class:`pyrt.llm.Engine`, a ``pyrt.generate`` call, a thread) submitted them: they all reach the
program's one core (:mod:`pyrt.llm.core`), which owns this table. A front end may reserve
slots ahead (``pyrt.generate`` does, so that its prompts never wait behind another front end's):
its generations then take those first, and the table gives them back when the front end lets go.

Prefix caching: each slot remembers the token ids its cache holds at positions 0, 1, ... (what the
generation that gave it back had written and kept, :meth:`SlotTable.give_back`). A generation that
asks with its prompt (:meth:`SlotTable.take` with ``prompt``) gets the free slot whose remembered
tokens share the longest prefix with the prompt (the least recently given back among equals, so
that unrelated prompts spread over the slots), and :meth:`SlotTable.reusable` says how many of its
first positions it need not feed again: tokens compared one by one (never a hash), at most all but
the prompt's last token (whose logits the generation needs). The memory lives here, with the
Program's engine core, so every front end on the Program shares it; a slot taken and not yet given
back is nobody else's to take, though what its generation has written and kept may be copied into
another's slot (:meth:`pyrt.llm.scheduler.Scheduler.catch_up`, :mod:`pyrt.llm.kv_copy`).

No lock: only the core's thread calls it (:mod:`pyrt.llm.stepping`).

>>> table = SlotTable(3, "m.pte")
>>> table.take(None), table.take(None), table.free
(0, 1, 1)
>>> table.give_back(None, 1); table.take(None)
1
>>> table.reserve(7, 4), table.free, table.free_for(7)     # what was free: slot 2
(1, 0, 1)
>>> table.take(7), table.free_for(7)
(2, 0)
>>> table.give_back(7, 2); table.release(7); table.free
1
>>> table = SlotTable(3, "m.pte")                                        # prefix caching
>>> a = table.take(None, [1, 2, 3]); table.give_back(None, a, [1, 2, 3, 4])
>>> b = table.take(None, [5]); table.give_back(None, b, [5, 6])
>>> c = table.take(None, [1, 2, 9]); c == a, table.reusable(c, [1, 2, 9])
(True, 2)
>>> table.take(None, [7]) != b                                     # unrelated: the least recently used
True
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pyrt.errors import PyrtError


class SlotTable:
    """``size`` slots numbered from 0; each free slot belongs to the shared pool or to one front end's reservation."""

    def __init__(self, size: int, source: str) -> None:
        self.size, self.source = size, source
        self._shared = list(range(size))
        self._reserved: dict[int, list[int]] = {}  # front end id -> its reserved slots that are free
        self._held: dict[int, int] = {}  # front end id -> how many slots it reserved
        self._memory: list[tuple[int, ...]] = [()] * size  # each slot's cache: the ids at positions 0, 1, ...
        self._used = [0] * size  # when each slot was last given back (0: never), for least recently used
        self._clock = 0

    @property
    def free(self) -> int:
        """Slots nobody holds or reserved."""
        return len(self._shared)

    def free_for(self, front: int | None) -> int:
        """Slots a generation of front end ``front`` could take now (its reservation's when it has one)."""
        return len(self._reserved[front]) if front in self._reserved else len(self._shared)

    def take(self, front: int | None, prompt: Sequence[int] | None = None) -> int | None:
        """A slot free for ``front``'s generation (its reservation's, else the shared pool's); None if none. Without
        ``prompt``, the lowest; with it, the one whose cache holds the longest prefix of ``prompt`` (the least
        recently used among equals)."""
        free = self._reserved[front] if front in self._reserved else self._shared
        if not free:
            return None
        if prompt is None:
            return free.pop(0)
        slot = self._best(free, prompt)
        free.remove(slot)
        return slot

    def reusable(self, slot: int, prompt: Sequence[int]) -> int:
        """How many of ``prompt``'s first positions ``slot``'s cache holds already (at most all but its last)."""
        return kept_prefix(self._memory[slot], prompt, len(prompt) - 1)

    def remembered(self, slot: int) -> tuple[int, ...]:
        """The token ids ``slot``'s cache holds at positions 0, 1, ... (as its last holder gave it back)."""
        return self._memory[slot]

    def forget(self) -> None:
        """Every slot's memory is dropped (something else may have written the caches: a run not the core's)."""
        self._memory = [()] * self.size

    def give_back(self, front: int | None, slot: int, written: Sequence[int] = ()) -> None:
        """``slot``, which a generation of ``front`` held, is free again (for that front's reservation, if any);
        ``written``: the ids its cache holds now at positions 0, 1, ... (nothing remembered: none)."""
        free = self._reserved[front] if front in self._reserved else self._shared
        if not 0 <= slot < self.size or slot in free or slot in self._shared:
            raise PyrtError(f"{self.source}: slot {slot} given back but not taken")  # two sequences would share it
        free.append(slot)
        free.sort()
        self._clock += 1
        self._memory[slot], self._used[slot] = tuple(written), self._clock

    def reserve(self, front: int, n: int, prompts: Sequence[Sequence[int]] | None = None) -> int:
        """Up to ``n`` shared slots set aside for ``front`` alone; how many it got (maybe 0). Without ``prompts``,
        the lowest; with them, for each prompt in turn the slot :meth:`take` would give it, then the least recently
        used."""
        if front in self._reserved:
            raise PyrtError(f"{self.source}: front end {front} reserved slots twice")
        if prompts is None:
            taken, self._shared = self._shared[:n], self._shared[n:]
        else:
            taken = []
            for i in range(min(n, len(self._shared))):
                taken.append(self._best(self._shared, prompts[i] if i < len(prompts) else ()))
                self._shared.remove(taken[-1])
            taken.sort()
        self._reserved[front], self._held[front] = taken, len(taken)
        return len(taken)

    def _best(self, free: list[int], prompt: Sequence[int]) -> int:
        """Of ``free``, the slot holding the longest prefix of ``prompt``, the least recently used among equals."""
        return max(free, key=lambda s: (kept_prefix(self._memory[s], prompt, len(prompt)), -self._used[s], -s))

    def release(self, front: int) -> None:
        """``front``'s reservation back to the shared pool (each slot must have been given back first)."""
        if front not in self._reserved:
            return
        free, held = self._reserved.pop(front), self._held.pop(front)
        if len(free) != held:
            raise PyrtError(f"{self.source}: a reservation of {held} slots released with {held - len(free)} "
                            "still taken")
        self._shared = sorted(self._shared + free)


def kept_prefix(written: Sequence[int], context: Sequence[int], limit: int) -> int:
    """How many of ``written``'s first tokens equal ``context``'s, at most ``limit``.

    >>> kept_prefix([1, 2, 3, 9], [1, 2, 3, 4, 5], 4), kept_prefix([1, 2], [1, 2, 3], 1)
    (3, 1)
    """
    n = max(min(len(written), len(context), limit), 0)
    differ = np.flatnonzero(np.asarray(written[:n]) != np.asarray(context[:n]))
    return int(differ[0]) if differ.size else n


__all__ = ["SlotTable", "kept_prefix"]
