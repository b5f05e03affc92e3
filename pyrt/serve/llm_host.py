"""A replica's generation engines: one ``pyrt.llm.Engine`` per generating model, stepped by its own thread.

:class:`EngineHost` owns the engine and a thread that runs it (``Engine.run``: it steps while
anything is queued or running and sleeps otherwise), so concurrent requests share each forward
call. The engine's steps and the replica's infer runs go through the same ``pyrt.Program``,
whose runs of one method take turns on that method's lock; the infer route refuses the method an
engine drives (its runs would write the KV-cache slots generations hold). The engine bounds its
own queue (``max_queued``, ``pyrt serve --max-queued-requests``); the host only names the flag
in the refusal.

:class:`Job` is one request's generation seen from the event loop: ``updates()`` yields the new
token ids as the stepping thread produces them (the generation's update listener wakes the loop;
several tokens come at once when the loop was busy). :func:`pieces` adds text (a
:class:`pyrt.serve.text.TextStream`: incremental detokenization and stop strings) and ends with
one :class:`Piece` carrying the finish reason. Cancelling a job (a client that went away, a stop
string) frees its slot at the engine's next step.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

from pyrt.errors import BusyError, PyrtError, QueueFullError
from pyrt.llm import Engine, FinishReason, Generation, GenerationResult, SamplingParams
from pyrt.llm.config import GenerationConfig
from pyrt.serve.text import TextStream

log = logging.getLogger("pyrt.serve")

FAILED_PAUSE_S = 0.05  # after an unexpected failure of the stepping loop, before it runs again
HEARTBEAT_S = 5.0  # a job waiting this long for a token checks that the stepping thread is alive


class EngineStopped(PyrtError):
    """The engine's stepping thread stopped or failed: the generations it carried end with this (500)."""


class EngineHost:
    """``model``'s engine on ``program``'s ``method``, with ``config`` (its draft, draft_tokens, queue bound), and
    the thread that steps it (until :meth:`close`)."""

    def __init__(self, program: Any, method: str, model: str, config: GenerationConfig) -> None:
        self.model = model
        self.engine = Engine(program, replace(config, method=method))
        self.failure: BaseException | None = None  # the last unexpected failure of the stepping loop
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"pyrt-steps-{model}", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.engine.run()
            except Exception as exc:  # the engine ends a failed run's generations itself: this is a bug
                log.exception("%s: the generation engine failed; its generations end", self.model)
                self.failure, self.failures = exc, self.failures + 1
                self.engine.close()
                self._stop.wait(FAILED_PAUSE_S)

    def submit(self, prompt: list[int], params: SamplingParams) -> Job:
        """Queue a generation (``Engine.submit``'s checks: InputError naming the engine's field); its
        :class:`Job` on the running event loop. BusyError past ``--max-queued-requests``."""
        if not self.alive:
            raise EngineStopped(f"model {self.model!r}: the replica's generation engine has stopped")
        started = time.perf_counter()
        try:
            generation = self.engine.submit(prompt, params)
        except QueueFullError as exc:  # a BusyError as before: the metrics count errors by class name
            raise BusyError(str(exc.renamed("max_queued_requests", source=f"model {self.model!r}"))) from None
        return Job(self, generation, asyncio.get_running_loop(), started)

    def stats(self) -> dict[str, Any]:
        """The engine's counters (``Engine.stats``) and the stepping loop's unexpected failures."""
        return {**self.engine.stats(), "step_failures": self.failures}

    def close(self) -> None:
        """Stop the thread; every generation still queued or running ends as cancelled."""
        self._stop.set()
        self.engine.stop()
        self._thread.join(timeout=30)
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
        """End the generation at the engine's next step (its slot is freed there)."""
        self.cancelled_here = True
        self.generation.cancel(reason)

    @property
    def result(self) -> GenerationResult:
        """The ended generation's result; its run failure raised, or EngineStopped when the engine ended it."""
        if self.generation.error is not None:
            raise self.generation.error
        result = self.generation.result
        if result is None or (result.finish_reason == "cancelled" and not self.cancelled_here):
            why = f": {self.host.failure}" if self.host.failures != self.failures else " (the replica is stopping)"
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
