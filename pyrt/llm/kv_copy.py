"""Copying cache positions from one KV-cache slot of a slot file into another, on the program's device.

When a new generation's prompt begins with tokens a *running* generation's slot already holds (users of one
system prompt at once, ``n > 1``), the engine core (:mod:`pyrt.llm.scheduler`, :meth:`Scheduler.catch_up`)
decides to copy those positions instead of prefilling them; the runner has :class:`KvCopier` do it before the
step that reads them. A slot file's caches (:mod:`pyrt.export._graph.slot_decoder`) are state tensors of the
program, ``[slots * kv_heads * (max_seq_len + 1), head_dim]``, row ``(slot * kv_heads + head) * (max_seq_len + 1)
+ row``; :meth:`pyrt.Program.copy_state_rows` copies rows inside them (host: at once; device: queued on the
method's stream after its last run and before its next, :mod:`pyrt.runtime.state_rows`).

Where a file exposes no such state (a one-sequence file; a TensorRT engine that keeps its cache inside itself,
with no tensor of the method for it; a program without ``state_sizes``), :attr:`KvCopier.supported` is False and
the core prefills those positions as without copying (the generation waits for nothing).

>>> runs([3, 4, 5, 9], [0, 1, 2, 3])
[(3, 0, 3), (9, 3, 1)]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyrt.llm.convention import SLOTS, Convention


class KvCopier:
    """Copies rows of one slot's caches into another's on ``program`` (``conv``: its slot file's convention)."""

    def __init__(self, program: Any, conv: Convention) -> None:
        self.program, self.conv = program, conv
        self.rows = conv.max_context_len + 1  # rows of one slot and head (one more than any position takes)
        block = conv.slots * self.rows
        sizes = getattr(program, "state_sizes", None)
        found = sizes(conv.method) if callable(sizes) and conv.layout == SLOTS and conv.slots > 1 else ()
        self.sizes: tuple[int, ...] = tuple(s for s in found if s % block == 0)  # the caches' first dimensions

    @property
    def supported(self) -> bool:
        """Whether the program exposes caches to copy (else the core prefills what it would have copied)."""
        return bool(self.sizes)

    def copy(self, src: int, dst: int, src_rows: Sequence[int], dst_rows: Sequence[int]) -> None:
        """Slot ``src``'s rows ``src_rows`` of every layer's keys and values copied to slot ``dst``'s ``dst_rows``."""
        pairs = runs(src_rows, dst_rows)
        for size in self.sizes:
            heads = size // (self.conv.slots * self.rows)
            flat = [((src * heads + h) * self.rows + s, (dst * heads + h) * self.rows + d, n)
                    for h in range(heads) for s, d, n in pairs]
            self.program.copy_state_rows(self.conv.method, size, flat)


def runs(src: Sequence[int], dst: Sequence[int]) -> list[tuple[int, int, int]]:
    """``src[i] -> dst[i]`` as (first source, first destination, count) runs where both go up by one."""
    out: list[tuple[int, int, int]] = []
    for s, d in zip(src, dst, strict=True):
        if out and out[-1][0] + out[-1][2] == s and out[-1][1] + out[-1][2] == d:
            out[-1] = (out[-1][0], out[-1][1], out[-1][2] + 1)
        else:
            out.append((s, d, 1))
    return out


__all__ = ["KvCopier", "runs"]
