"""The replica's batch queue: batches form when the runner is free, from what queued; limits and errors kept."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from pyrt.serve.batch_queue import BatchQueue


def _gather(queue: BatchQueue, items: list[Any]) -> list[Any]:
    async def go() -> list[Any]:
        return await asyncio.gather(*(queue.submit(i) for i in items), return_exceptions=True)
    return asyncio.run(go())


def test_what_queues_during_a_run_is_the_next_batch() -> None:
    """The first run holds the first item; the nine that arrived meanwhile run together, in order."""
    batches: list[list[int]] = []
    gate = threading.Event()

    def run(items: list[int]) -> list[int]:
        batches.append(items)
        gate.wait(5)
        return [i * 10 for i in items]

    async def go() -> list[Any]:
        queue = BatchQueue(run, rows=lambda i: 1, limit=16, wait_s=0.0,
                           runner=lambda f, items: asyncio.get_running_loop().run_in_executor(None, f, items))
        first = asyncio.ensure_future(queue.submit(0))
        while not batches:
            await asyncio.sleep(0.001)
        rest = [asyncio.ensure_future(queue.submit(i)) for i in range(1, 10)]
        await asyncio.sleep(0)
        gate.set()
        return [await first, *[await r for r in rest]]

    assert asyncio.run(go()) == [i * 10 for i in range(10)]
    assert batches == [[0], list(range(1, 10))]


def test_rows_never_exceed_the_limit_and_a_larger_item_runs_alone() -> None:
    batches: list[list[int]] = []

    def run(items: list[int]) -> list[int]:
        batches.append(items)
        return items

    assert _gather(BatchQueue(run, rows=lambda i: i, limit=4, wait_s=0.05), [1, 2, 3, 9, 1]) == [1, 2, 3, 9, 1]
    assert batches == [[1, 2], [3], [9], [1]]


def test_errors_reach_their_callers() -> None:
    def run(items: list[int]) -> list[Any]:
        if 13 in items:
            raise RuntimeError("the whole batch failed")
        return [ValueError(f"bad item {i}") if i < 0 else i for i in items]

    queue = BatchQueue(run, rows=lambda i: 1, limit=2, wait_s=0.05)
    got = _gather(queue, [1, -1, 13, 2])
    assert got[0] == 1 and str(got[1]) == "bad item -1"
    assert [str(g) for g in got[2:]] == ["the whole batch failed"] * 2
    with pytest.raises(ValueError, match="bad item -5"):
        asyncio.run(queue.submit(-5))


def test_an_item_arriving_within_wait_s_joins_the_waiting_batch() -> None:
    """The first item waits (up to ``wait_s``) for company; one submitted meanwhile runs in the same batch."""
    batches: list[list[int]] = []

    def run(items: list[int]) -> list[int]:
        batches.append(items)
        return items

    async def go() -> list[Any]:
        queue = BatchQueue(run, rows=lambda i: 1, limit=8, wait_s=0.5)
        first = asyncio.ensure_future(queue.submit(1))
        await asyncio.sleep(0.05)
        return await asyncio.gather(first, queue.submit(2))

    assert asyncio.run(go()) == [1, 2]
    assert batches == [[1, 2]]
