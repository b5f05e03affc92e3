"""A replica's generation front ends: one ``pyrt.llm.Engine`` per generating model, and each request's :class:`Job`.

:class:`EngineHost` holds the model's engine: a front end of the program's engine core for that
method, which one thread steps (:mod:`pyrt.llm.stepping`), so concurrent requests share each
forward call. The engine's steps and the replica's infer runs go through the same
``pyrt.Program``, whose runs of one method take turns on that method's lock; the infer route
refuses the method an engine drives (its runs would write the KV-cache slots generations hold).
The core bounds the queue (``max_queued``, ``pyrt serve --max-queued-requests``); its refusal
arrives on the request's handle, and :meth:`Job.accepted` raises it, naming the flag.

:class:`Job` is one request's generation seen from the event loop: it posts the request without
blocking the loop (``Engine.post``); ``updates()`` yields the new token ids as the stepping thread
produces them (the generation's update listener wakes the loop; several tokens come at once when
the loop was busy). :func:`pieces` adds text (a :class:`pyrt.serve.text.TextStream`: incremental
detokenization and stop strings) and ends with one :class:`Piece` carrying the finish reason.
Cancelling a job (a client that went away, a stop string) frees its slot at the core's next step.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

from pyrt.errors import BusyError, PyrtError, QueueFullError
from pyrt.llm import Engine, FinishReason, Generation, GenerationConfig, GenerationResult, SamplingParams, make_request
from pyrt.serve.text import TextStream

log = logging.getLogger("pyrt.serve")

HEARTBEAT_S = 5.0  # a job waiting this long for a token checks that its engine core still takes work


class EngineStopped(PyrtError):
    """The engine core stopped (the replica is closing) or failed: the generations it carried end with this (500)."""


class EngineHost:
    """``model``'s engine on ``program``'s ``method``, with ``config`` (its draft, draft_tokens, queue bound)."""

    def __init__(self, program: Any, method: str, model: str, config: GenerationConfig) -> None:
        self.model = model
        self.engine = Engine(program, replace(config, method=method))

    @property
    def alive(self) -> bool:
        return self.engine.alive

    @property
    def failures(self) -> int:
        """Unexpected failures of the core's steps so far (each ended the generations it carried)."""
        return int(self.engine.stats()["step_failures"])

    def submit(self, prompt: list[int], params: SamplingParams) -> Job:
        """Queue a generation (``make_request``'s checks: InputError naming the engine's field); its :class:`Job` on
        the running event loop, whose :meth:`Job.accepted` raises the core's refusal."""
        if not self.alive:
            raise EngineStopped(f"model {self.model!r}: the replica's generation engine has stopped")
        started = time.perf_counter()
        generation = self.engine.post(make_request(self.engine.conv, prompt, params))
        return Job(self, generation, asyncio.get_running_loop(), started)

    def stats(self) -> dict[str, Any]:
        """The engine's counters (``Engine.stats``, the core's step failures among them)."""
        return self.engine.stats()

    def close(self) -> None:
        """Every generation of this model still queued or running ends as cancelled."""
        self.engine.close()


class Job:
    """One request's generation, seen from the event loop that submitted it."""

    def __init__(self, host: EngineHost, generation: Generation, loop: asyncio.AbstractEventLoop,
                 started: float) -> None:
        self.host, self.generation, self.loop, self.started = host, generation, loop, started
        self.failures = host.failures
        self.cancelled_here = False
        self._wake = asyncio.Event()
        self._scheduled = False
        generation.on_update(self._heard)

    def _heard(self) -> None:
        """On the stepping thread, after each update of the generation: wake the loop (once until it has woken)."""
        if not self._scheduled:
            self._scheduled = True
            try:
                self.loop.call_soon_threadsafe(self._woken)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass

    def _woken(self) -> None:
        self._scheduled = False
        self._wake.set()

    async def accepted(self) -> None:
        """Return once the core has queued the generation; its refusal raised (BusyError naming
        ``--max-queued-requests`` past the queue bound)."""
        while not (self.generation.accepted or self.generation.done):
            await self._wait()
        error = self.generation.error
        if isinstance(error, QueueFullError):  # a BusyError as before: the metrics count errors by class name
            raise BusyError(str(error.renamed("max_queued_requests", source=f"model {self.host.model!r}")))
        if error is not None and not self.generation.accepted:
            raise error

    async def updates(self) -> AsyncIterator[list[int]]:
        """The new token ids as they come, until the generation ends (then :attr:`result` or :attr:`error`)."""
        while True:
            done = self.generation.done  # before taking: the ids taken then include the last ones
            new = self.generation.take()
            if new:
                yield new
            if done:
                return
            await self._wait()

    async def _wait(self) -> None:
        try:
            await asyncio.wait_for(self._wake.wait(), HEARTBEAT_S)
        except asyncio.TimeoutError:
            if not self.host.alive:
                raise EngineStopped(f"model {self.host.model!r}: the generation engine stopped") from None
        self._wake.clear()

    @property
    def token_times(self) -> list[float]:
        """``time.perf_counter()`` when each new token came (as the stepping thread produced it)."""
        return self.generation.token_times

    def cancel(self, reason: FinishReason = "cancelled") -> None:
        """End the generation at the core's next step (its slot is freed there)."""
        self.cancelled_here = True
        self.generation.cancel(reason)

    @property
    def result(self) -> GenerationResult:
        """The ended generation's result; its run failure raised, or EngineStopped when the engine ended it."""
        if self.generation.error is not None:
            raise self.generation.error
        result = self.generation.result
        if result is None or (result.finish_reason == "cancelled" and not self.cancelled_here):
            failures = self.host.failures
            why = " after an unexpected failure" if failures != self.failures else " (the replica is stopping)"
            raise EngineStopped(f"model {self.host.model!r}: the generation was ended by the engine{why}")
        return result


@dataclass
class Piece:
    """What one update gives a response: new ids, their text (may be empty), and at the end the finish reason."""

    tokens: list[int]
    text: str = ""
    finish_reason: str | None = None  # "stop" | "length" | "cache_full" on the last piece
    result: GenerationResult | None = None
    consumed: int = 0  # new tokens the response accounts for (a stop string cuts the rest)
    extra: dict[str, Any] = field(default_factory=dict)


async def pieces(job: Job, text: TextStream | None) -> AsyncIterator[Piece]:
    """One piece per new token (its text delta when there is a tokenizer), then the final piece.

    A stop string in the text cancels the generation (``finish_reason`` "stop"); the tokens after
    the one that completed it are not given out.
    """
    consumed = 0
    async for ids in job.updates():
        for token in ids:
            consumed += 1
            delta = text.add([token]) if text is not None else ""
            yield Piece([token], delta, consumed=consumed)
            if text is not None and text.stopped:
                job.cancel("stop")
                yield Piece([], "", "stop", job.generation.result, consumed)
                return
    result = job.result
    rest = text.flush() if text is not None else ""
    reason = "stop" if text is not None and text.stopped else result.finish_reason
    yield Piece([], rest, reason, result, consumed)
