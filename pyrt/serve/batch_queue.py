"""The replica's batch queue: a batch is formed when the runner is free, from everything that queued meanwhile.

Ray Serve's ``@serve.batch`` forms a batch as soon as its first request has
waited ``batch_wait_timeout_s``, then queues the formed batch behind the one
running: with one runner, requests that arrive during a run are cut into many
small batches (runs of 1-4 rows at 32 concurrent clients). This queue forms
the next batch only when the previous run is done, as Triton's dynamic
batcher does: it takes what queued (in arrival order, up to ``limit`` rows)
and waits for more only while the oldest request has waited less than
``wait_s``.

>>> import asyncio
>>> async def demo():
...     q = BatchQueue(lambda items: [sum(items)] * len(items), rows=lambda item: 1, limit=8, wait_s=0.01)
...     return await asyncio.gather(*(q.submit(i) for i in range(3)))
>>> asyncio.run(demo())
[3, 3, 3]
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

Run = Callable[[list[Any]], list[Any]]


class BatchQueue:
    """Items submitted from one event loop, run by ``run`` (a list in, one result per item out) in batches.

    ``run`` is called through ``runner`` (default: directly; a replica passes its run thread's
    executor); a result that is an exception is raised to that item's caller; an exception
    from ``run`` itself is raised to every caller of that batch.
    """

    def __init__(self, run: Run, *, rows: Callable[[Any], int], limit: int, wait_s: float,
                 runner: Callable[[Run, list[Any]], Awaitable[list[Any]]] | None = None) -> None:
        self.run, self.rows, self.limit, self.wait_s = run, rows, limit, wait_s
        self.runner = runner
        self.pending: deque[tuple[Any, asyncio.Future[Any], float]] = deque()
        self.arrived = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    @property
    def waiting(self) -> int:
        """Items submitted and not yet taken into a batch (those whose callers went away included, until taken)."""
        return len(self.pending)

    async def submit(self, item: Any) -> Any:
        """``item``'s result, once a batch holding it has run."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self.pending.append((item, future, loop.time()))
        self.arrived.set()
        if self.task is None or self.task.done():
            self.task = loop.create_task(self._serve())
        result = await future
        if isinstance(result, BaseException):
            raise result
        return result

    async def _take(self) -> list[tuple[Any, asyncio.Future[Any], float]]:
        """The next batch: what queued, up to ``limit`` rows, waiting while the oldest is younger than ``wait_s``."""
        loop = asyncio.get_running_loop()
        batch: list[tuple[Any, asyncio.Future[Any], float]] = []
        total = 0
        while True:
            while self.pending and (not batch or total + self.rows(self.pending[0][0]) <= self.limit):
                entry = self.pending.popleft()
                if entry[1].done():  # its caller went away
                    continue
                batch.append(entry)
                total += self.rows(entry[0])
            left = batch[0][2] + self.wait_s - loop.time() if batch else None
            if batch and (total >= self.limit or self.pending or left is not None and left <= 0):
                return batch
            self.arrived.clear()
            try:
                await asyncio.wait_for(self.arrived.wait(), left)
            except asyncio.TimeoutError:
                pass

    async def _serve(self) -> None:
        while self.pending:
            batch = await self._take()
            items = [item for item, _, _ in batch]
            try:
                results = await (self.runner(self.run, items) if self.runner else _direct(self.run, items))
            except Exception as exc:  # every caller of this batch gets it
                results = [exc] * len(batch)
            for (_, future, _), result in zip(batch, results, strict=True):
                if not future.done():
                    future.set_result(result)


async def _direct(run: Run, items: list[Any]) -> list[Any]:
    return run(items)
