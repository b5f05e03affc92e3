"""A replica's Program runs for the Open Inference Protocol's infer route: batched, inline, or on its run thread.

:class:`Inference` runs one model's request: batched with others where the method batches and
other requests are in flight (:mod:`pyrt.serve.batch_queue`, :mod:`pyrt.serve.batching`), at once
when it finds the replica idle (on the event loop itself when the method's last run was shorter
than ``inline_run_ms``), on the replica's run thread otherwise (:class:`pyrt.serve.limits.RunThread`,
whose queue limit refuses a request at once with 503). A request counts as in flight from its
arrival (:meth:`Inference.arriving`), before its body is read.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from functools import partial
from typing import Any

import numpy as np

from pyrt.format.method_io import flatten
from pyrt.serve import limits
from pyrt.serve.batch_queue import BatchQueue
from pyrt.serve.batching import run_batched
from pyrt.serve.config import ServeConfig
from pyrt.serve.limits import RunThread
from pyrt.serve.protocol import InferRequest, ModelInfo

Item = tuple[str, list[np.ndarray]]


class Inference:
    """The runs of ``program``'s ``models`` with ``cfg``'s batching, on ``runs`` (``metrics``: the replica's)."""

    def __init__(self, cfg: ServeConfig, program: Any, models: dict[str, ModelInfo], runs: RunThread,
                 metrics: Any) -> None:
        self.cfg, self.program, self.models, self.runs, self.metrics = cfg, program, models, runs, metrics
        self.in_flight = 0  # infer requests between arrival and reply
        self.last_run_s: dict[str, float] = {}  # each model's last run time (cfg.inline_run_ms)
        self.batches = BatchQueue(self.run_items, rows=lambda item: int(item[1][0].shape[0]),
                                  limit=cfg.max_batch_size, wait_s=cfg.batch_wait_ms / 1000, runner=self._on_pool)

    @contextlib.contextmanager
    def arriving(self) -> Iterator[None]:
        """An infer request from its arrival to its reply (it counts as in flight meanwhile)."""
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1

    async def infer(self, info: ModelInfo, req: InferRequest, arrived: float) -> list[np.ndarray]:
        """``req``'s outputs: admitted to the queue (Overloaded when it is full) and answered within
        ``request_timeout_s`` of its arrival (``time.monotonic()``)."""
        what = f"model {info.name!r}"
        self.runs.admit(self.queued(), what)
        return await limits.within(self.dispatch(info, req), self.cfg.request_timeout_s, arrived, what)

    def run(self, info: ModelInfo, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """One Program run of ``info``'s method; scalar inputs keep their exported values."""
        it = iter(arrays)
        args = [next(it) if spec.kind == "Tensor" else spec.value for spec in info.inputs]
        start = time.perf_counter()
        out = self.program.run(*args, method=info.method)
        self.last_run_s[info.name] = elapsed = time.perf_counter() - start
        self.metrics.run(info.name, int(arrays[0].shape[0]) if arrays and arrays[0].ndim else 1, elapsed)
        return [x for x in flatten(out) if isinstance(x, np.ndarray)]

    def run_items(self, items: list[Item]) -> list[Any]:
        """A batch of (model, arrays) items: each model's requests batched together, results in order."""
        results: list[Any] = [None] * len(items)
        by_model: dict[str, list[int]] = {}
        for i, (name, _) in enumerate(items):
            by_model.setdefault(name, []).append(i)
        for name, idx in by_model.items():
            info = self.models[name]
            limit = min(self.cfg.max_batch_size, info.batch_bound)
            out = run_batched(partial(self.run, info), [items[i][1] for i in idx], limit)
            for i, r in zip(idx, out, strict=True):
                results[i] = r
        return results

    async def _on_pool(self, run: Any, items: list[Item]) -> list[Any]:
        return await self.runs.call(run, items)

    async def dispatch(self, info: ModelInfo, req: InferRequest) -> list[np.ndarray]:
        """Batched where the method batches, the request fits a batch and others are in flight; else run now.

        A request that finds the replica idle runs at once: waiting ``batch_wait_ms`` for company
        that is not coming only adds latency; on the event loop itself when the method's last run
        was shorter than ``cfg.inline_run_ms``. Requests that arrive while others are in flight wait (at
        most that long) to run together.
        """
        limit = min(self.cfg.max_batch_size, info.batch_bound)
        alone = self.in_flight <= 1  # counted from the moment a request arrives, before its body is read
        if limit > 1 and req.rows <= limit and not alone:
            return list(await self.batches.submit((info.name, req.arrays)))
        short = self.cfg.inline_run_ms / 1000
        if alone and not self.runs.busy and self.last_run_s.get(info.name, short) < short:
            self.metrics.inline(info.name)
            return self.run(info, req.arrays)
        return await self.runs.call(self.run, info, req.arrays)

    def queued(self) -> int:
        """Decoded requests waiting for the run thread: in the batch queue, or for the thread itself."""
        return self.batches.waiting + self.runs.waiting
