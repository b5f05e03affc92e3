"""Which KV-cache slots of a program are taken: one pool per :class:`pyrt.Program`, shared by every generation.

A file exported with ``decoder_to_pte(max_batch_size=B)`` holds B slots; any other LLM file holds
one. A generation takes a slot before its first token and gives it back after its last, so
generations on one program never write or read each other's cache, whichever object (a
:class:`pyrt.llm.Engine`, a ``pyrt.generate`` call, a thread) runs them.

>>> pool = SlotPool(2, "m.pte")
>>> pool.take(3), pool.free
([0, 1], 0)
>>> pool.give_back([1]); pool.take(1)
[1]
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from pyrt.errors import PyrtError

_POOLS: weakref.WeakKeyDictionary[Any, SlotPool] = weakref.WeakKeyDictionary()
_POOLS_LOCK = threading.Lock()


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


def pool_of(program: Any, size: int) -> SlotPool:
    """``program``'s pool of ``size`` slots, made on first use (one per Program object)."""
    with _POOLS_LOCK:
        pool = _POOLS.get(program)
        if pool is None:
            pool = _POOLS[program] = SlotPool(size, str(program.source))
        return pool
