"""Which KV-cache slots of a program are taken: a pool per :class:`pyrt.Program`, shared by every generation.

A file exported with ``decoder_to_pte(max_batch_size=B)`` holds B slots; any other LLM file holds
one. A generation takes a slot before its first token and gives it back after its last, so
generations on one program never write or read each other's cache, whichever object (a
:class:`pyrt.llm.Engine`, a ``pyrt.generate`` call, a thread) runs them. The pool is kept with
the Program (:class:`pyrt.llm.program.LLMProgram`); a :class:`Reservation` is a share of it
taken ahead for one engine (``pyrt.generate``'s), given back whole when released.

>>> pool = SlotPool(3, "m.pte")
>>> pool.take(2), pool.free
([0, 1], 1)
>>> pool.give_back([1]); pool.take(1)
[1]
>>> mine = pool.reserve(4); mine.free, pool.free      # what was free: slot 2
(1, 0)
>>> mine.release(); pool.free
1
"""

from __future__ import annotations

import threading
from typing import Protocol

from pyrt.errors import PyrtError


class Slots(Protocol):
    """What an engine's scheduler takes its slots from: a pool, or a reservation of one."""

    @property
    def free(self) -> int: ...

    def take(self, n: int) -> list[int]: ...

    def give_back(self, slots: list[int]) -> None: ...


class SlotPool:
    """``size`` slots numbered from 0; :meth:`take` hands out free ones, :meth:`give_back` returns them."""

    def __init__(self, size: int, source: str) -> None:
        self.size, self.source = size, source
        self._free = list(range(size))
        self._lock = threading.Lock()

    @property
    def free(self) -> int:
        return len(self._free)

    def take(self, n: int) -> list[int]:
        """Up to ``n`` free slots, lowest first (an empty list when none is free)."""
        with self._lock:
            taken, self._free = self._free[:n], self._free[n:]
            return taken

    def give_back(self, slots: list[int]) -> None:
        with self._lock:
            bad = [s for s in slots if not 0 <= s < self.size or s in self._free]
            if bad:  # a slot given back twice would let two sequences share it
                raise PyrtError(f"{self.source}: slots {bad} given back but not taken")
            self._free = sorted(self._free + list(slots))

    def reserve(self, n: int) -> Reservation:
        """Up to ``n`` free slots taken now for one engine alone (maybe none: its ``free`` says)."""
        return Reservation(self, self.take(n))


class Reservation:
    """Slots taken ahead from ``pool``: handed out and given back here, returned to the pool by :meth:`release`."""

    def __init__(self, pool: SlotPool, slots: list[int]) -> None:
        self.pool, self.held = pool, len(slots)
        self._free = slots

    @property
    def free(self) -> int:
        return len(self._free)

    def take(self, n: int) -> list[int]:
        taken, self._free = self._free[:n], self._free[n:]
        return taken

    def give_back(self, slots: list[int]) -> None:
        self._free = sorted(self._free + list(slots))

    def release(self) -> None:
        """Give every slot back to the pool (each must have been given back here first); idempotent."""
        if self.held != len(self._free):
            raise PyrtError(f"{self.pool.source}: a reservation of {self.held} slots released with "
                            f"{self.held - len(self._free)} still taken")
        self.pool.give_back(self._free)
        self._free, self.held = [], 0
