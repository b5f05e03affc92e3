"""Which KV-cache slots of a program are taken: one :class:`SlotTable` per engine core, touched by its thread alone.

A file exported with ``decoder_to_pte(max_batch_size=B)`` holds B slots; any other LLM file holds
one. A generation takes a slot before its first token and gives it back after its last, so
generations on one program never write or read each other's cache, whichever front end (a
:class:`pyrt.llm.Engine`, a ``pyrt.generate`` call, a thread) submitted them: they all reach the
program's one core (:mod:`pyrt.llm.core`), which owns this table. A front end may reserve
slots ahead (``pyrt.generate`` does, so that its prompts never wait behind another front end's):
its generations then take those first, and the table gives them back when the front end lets go.

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
"""

from __future__ import annotations

from pyrt.errors import PyrtError


class SlotTable:
    """``size`` slots numbered from 0; each free slot belongs to the shared pool or to one front end's reservation."""

    def __init__(self, size: int, source: str) -> None:
        self.size, self.source = size, source
        self._shared = list(range(size))
        self._reserved: dict[int, list[int]] = {}  # front end id -> its reserved slots that are free
        self._held: dict[int, int] = {}  # front end id -> how many slots it reserved

    @property
    def free(self) -> int:
        """Slots nobody holds or reserved."""
        return len(self._shared)

    def free_for(self, front: int | None) -> int:
        """Slots a generation of front end ``front`` could take now (its reservation's when it has one)."""
        return len(self._reserved[front]) if front in self._reserved else len(self._shared)

    def take(self, front: int | None) -> int | None:
        """The lowest slot free for ``front``'s generation (its reservation's, else the shared pool's); None if none."""
        free = self._reserved[front] if front in self._reserved else self._shared
        return free.pop(0) if free else None

    def give_back(self, front: int | None, slot: int) -> None:
        """``slot``, which a generation of ``front`` held, is free again (for that front's reservation, if any)."""
        free = self._reserved[front] if front in self._reserved else self._shared
        if not 0 <= slot < self.size or slot in free or slot in self._shared:
            raise PyrtError(f"{self.source}: slot {slot} given back but not taken")  # two sequences would share it
        free.append(slot)
        free.sort()

    def reserve(self, front: int, n: int) -> int:
        """Up to ``n`` shared slots set aside for ``front`` alone; how many it got (maybe 0)."""
        if front in self._reserved:
            raise PyrtError(f"{self.source}: front end {front} reserved slots twice")
        taken, self._shared = self._shared[:n], self._shared[n:]
        self._reserved[front], self._held[front] = taken, len(taken)
        return len(taken)

    def release(self, front: int) -> None:
        """``front``'s reservation back to the shared pool (each slot must have been given back first)."""
        if front not in self._reserved:
            return
        free, held = self._reserved.pop(front), self._held.pop(front)
        if len(free) != held:
            raise PyrtError(f"{self.source}: a reservation of {held} slots released with {held - len(free)} "
                            "still taken")
        self._shared = sorted(self._shared + free)


__all__ = ["SlotTable"]
