"""Continuous batching: many generations share each forward call of one LLM program.

:class:`Engine` keeps a queue of submitted generations and, at each :meth:`Engine.step`, one
forward call for every running one: each decoding sequence feeds the token it generated last,
and sequences still reading their prompt feed chunks of it within the file's token budget per
step (``get_max_tokens_per_step``). A queued generation joins when a KV-cache slot is free
(:mod:`pyrt.llm.slots`: the program's slots are shared with every other engine and
``pyrt.generate`` call on it) and leaves after its last token, between steps. On a one-sequence
file the engine runs one generation at a time, in submission order.

>>> with pyrt.Program("m.pte") as prog:                                   # doctest: +SKIP
...     engine = Engine(prog)
...     a = engine.submit([1, 2, 3], max_new_tokens=8)
...     b = engine.submit([4, 5], max_new_tokens=8, do_sample=True, seed=0)
...     while engine.pending:
...         engine.step()
...     a.result.tokens, b.result.finish_reason
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from typing import Any

from pyrt.errors import BusyError, InputError
from pyrt.llm.convention import SINGLE, Convention, read_convention
from pyrt.llm.request import Request, check_request, check_stop
from pyrt.llm.sampling import sample_token
from pyrt.llm.slots import SlotPool, pool_of
from pyrt.llm.step import Feed, run_step
from pyrt.llm.stream import FinishReason, Generation, Sequence


class Engine:
    """Continuous batching over ``program`` (a :class:`pyrt.Program` following the LLM convention).

    ``max_queued``: submissions beyond this many waiting for a slot raise :class:`pyrt.BusyError`
    (None: no bound). Thread-safe: submit and cancel from any thread; one step runs at a time.
    """

    def __init__(self, program: Any, *, method: str = "forward", max_queued: int | None = None) -> None:
        self.program = program
        self.conv = engine_convention(program, method)
        if max_queued is not None and (isinstance(max_queued, bool) or not isinstance(max_queued, int)
                                       or max_queued < 0):
            raise InputError(f"max_queued={max_queued!r} must be an int >= 0 or None")
        self.max_queued = max_queued
        self.pool: SlotPool = pool_of(program, self.conv.slots)
        self.lock = threading.RLock()
        self._changed = threading.Condition(self.lock)
        self._stepping = threading.Lock()
        self._queue: deque[Sequence] = deque()
        self._running: list[Sequence] = []  # admission order
        self._reserved: list[int] | None = None  # slots taken ahead (pyrt.generate), else taken on demand
        self.steps = 0
        self.occupancy: Counter[int] = Counter()  # sequences per step -> steps
        self.tokens_generated = 0
        self.prompt_tokens = 0

    @property
    def slots(self) -> int:
        """Sequences one step can hold (the file's ``get_max_batch_size``; 1 for a one-sequence file)."""
        return self.conv.slots

    @property
    def queued(self) -> int:
        with self.lock:
            return len(self._queue)

    @property
    def running(self) -> int:
        with self.lock:
            return len(self._running)

    @property
    def pending(self) -> int:
        """Generations queued or running."""
        with self.lock:
            return len(self._queue) + len(self._running)

    def submit(self, prompt_ids: Any, *, max_new_tokens: int | None = None, do_sample: bool = False,
               temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
               seed: int | None = None, eos_ids: Any = None, stop: Any = None,
               names: dict[str, str] | None = None) -> Generation:
        """Queue a generation; its stream. Every value is checked here (InputError naming it).

        ``stop``: token-id sequences that end the generation when its new tokens end with one
        (``finish_reason == "stop"``). The rest as for :func:`pyrt.generate`.
        """
        request = check_request(self.conv, prompt_ids, max_new_tokens=max_new_tokens, do_sample=do_sample,
                                temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, eos_ids=eos_ids,
                                names=names, stop=check_stop(stop, self.conv.vocab_size, names))
        return self.submit_request(request)

    def submit_request(self, request: Request) -> Generation:
        """Queue an already checked request (:func:`pyrt.llm.request.check_request`)."""
        sequence = Sequence(request, request.seed)
        with self.lock:
            if self.max_queued is not None and len(self._queue) >= self.max_queued:
                raise BusyError(f"{self.program.source}: {len(self._queue)} generations already wait for one of "
                                f"{self.slots} slots (max_queued={self.max_queued})")
            self._queue.append(sequence)
            self._changed.notify_all()
        return Generation(self, sequence)

    def cancel(self, stream: Generation, reason: FinishReason = "cancelled") -> None:
        """End ``stream`` at the next step with ``finish_reason`` ``reason``, keeping its tokens; frees its slot."""
        with self.lock:
            seq = stream.sequence
            if not seq.done and seq.cancel_reason is None:
                seq.cancel_reason = reason
                self._changed.notify_all()

    def drop(self, seq: Sequence) -> None:
        """A handle was dropped unfinished: cancel its generation (at once when no step is running)."""
        with self.lock:
            if seq.done:
                return
            if seq.cancel_reason is None:
                seq.cancel_reason = "cancelled"
        if self._stepping.acquire(blocking=False):
            try:
                with self.lock:
                    self._end_cancelled()
            finally:
                self._stepping.release()

    def close(self) -> None:
        """Cancel every generation still queued or running and give their slots back."""
        with self._stepping, self.lock:
            for seq in [*self._queue, *self._running]:
                seq.cancel_reason = seq.cancel_reason or "cancelled"
            self._end_cancelled()
            self._changed.notify_all()

    def step(self) -> int:
        """One forward call for every running generation (joining queued ones); how many advanced."""
        with self._stepping:
            return self._step()

    def drive(self) -> None:
        """Run a step if nobody else is running one, else wait until the running one ends."""
        if self._stepping.acquire(blocking=False):
            try:
                if self._step() == 0:
                    with self.lock:
                        self._changed.wait(0.05)  # nothing to run: a cancel or a slot may come from elsewhere
            finally:
                self._stepping.release()
        else:
            with self.lock:
                self._changed.wait(0.05)

    def wait_for(self, seq: Sequence, timeout: float | None) -> bool:
        """Drive or wait until ``seq`` ends (True), or ``timeout`` seconds pass (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self.lock:
                if seq.done:
                    return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
            self.drive()

    def wait_for_work(self, timeout: float) -> bool:
        """Block until something is queued or running (True), or ``timeout`` seconds pass (False)."""
        with self.lock:
            return self._changed.wait_for(lambda: bool(self._queue or self._running), timeout)

    def stats(self) -> dict[str, Any]:
        """Counters: steps, generated and prompt tokens, queued and running now, sequences per step."""
        with self.lock:
            return {"steps": self.steps, "tokens_generated": self.tokens_generated,
                    "prompt_tokens": self.prompt_tokens, "queued": len(self._queue), "running": len(self._running),
                    "slots": self.slots, "occupancy": {str(k): v for k, v in sorted(self.occupancy.items())}}

    # -- one step ---------------------------------------------------------------------------------

    def _step(self) -> int:
        with self.lock:
            self._end_cancelled()
            self._admit()
            plan = self._plan()
        if not plan:
            return 0
        try:
            logits = run_step(self.program, self.conv, [feed for _, feed in plan])
        except Exception as exc:  # a failed run ends the generations it carried, not the engine
            with self.lock:
                for seq, _ in plan:
                    self._fail(seq, exc)
                self._changed.notify_all()
            return len(plan)
        with self.lock:
            self._advance(plan, logits)
            self._changed.notify_all()
        return len(plan)

    def _end_cancelled(self) -> None:
        for seq in [s for s in self._queue if s.cancel_reason is not None]:
            self._queue.remove(seq)
            self._end(seq, seq.cancel_reason or "cancelled")
        for seq in [s for s in self._running if s.cancel_reason is not None]:
            self._end(seq, seq.cancel_reason or "cancelled")

    def _admit(self) -> None:
        while self._queue:
            slot = self._take_slot()
            if slot is None:
                return
            seq = self._queue.popleft()
            seq.slot = slot
            self._running.append(seq)

    def _take_slot(self) -> int | None:
        if self._reserved is not None:
            return self._reserved.pop(0) if self._reserved else None
        taken = self.pool.take(1)
        return taken[0] if taken else None

    def _plan(self) -> list[tuple[Sequence, Feed]]:
        """Decoding sequences first (one token each), then prompt chunks in admission order, within the budget."""
        budget = self.conv.tokens_per_step
        plan: list[tuple[Sequence, Feed]] = []
        for seq in self._running:
            if seq.new and budget > 0:
                assert seq.slot is not None  # running sequences hold a slot
                plan.append((seq, Feed(seq.slot, (seq.new[-1],), seq.next_position, True)))
                budget -= 1
        for seq in self._running:
            if not seq.new and budget > 0:
                assert seq.slot is not None
                chunk = seq.prompt[seq.fed:seq.fed + budget]
                plan.append((seq, Feed(seq.slot, tuple(chunk), seq.fed, seq.fed + len(chunk) == len(seq.prompt))))
                budget -= len(chunk)
        return plan

    def _advance(self, plan: list[tuple[Sequence, Feed]], logits: list[Any]) -> None:
        rows = iter(logits)
        self.steps += 1
        self.occupancy[len(plan)] += 1
        for seq, feed in plan:
            seq.fed = feed.start + len(feed.tokens)
            if not seq.new:
                self.prompt_tokens += len(feed.tokens)
            if not feed.logits:
                continue
            if not seq.new:
                seq.clock.prefilled = seq.clock.now()
            token = sample_token(next(rows), seq.request.sampling, seq.rng)
            seq.new.append(token)
            seq.unread.append(token)
            self.tokens_generated += 1
            if len(seq.new) == 1:
                seq.clock.first = seq.clock.now()
            reason = finish_reason(seq, self.conv)
            if reason is not None:
                self._end(seq, reason)
            else:
                seq.notify()

    def _end(self, seq: Sequence, reason: FinishReason) -> None:
        seq.finish(reason)
        self._release(seq)
        seq.notify()

    def _fail(self, seq: Sequence, exc: BaseException) -> None:
        seq.error = exc
        seq.clock.end = seq.clock.now()
        self._release(seq)
        seq.notify()

    def _release(self, seq: Sequence) -> None:
        if seq in self._running:
            self._running.remove(seq)
        if seq.slot is not None:
            if self._reserved is not None:
                self._reserved.append(seq.slot)
            else:
                self.pool.give_back([seq.slot])
            seq.slot = None
        if self._reserved is not None and not self._queue and not self._running:
            self.pool.give_back(self._reserved)  # a private engine's work is done: its slots go back
            self._reserved = []

    def reserve(self, count: int) -> int:
        """Take up to ``count`` slots now for this engine alone (``pyrt.generate``); BusyError when none is free."""
        with self.lock:
            taken = self.pool.take(count)
            if not taken:
                raise BusyError(busy_message(self.program.source, self.slots))
            self._reserved = taken
            return len(taken)


def finish_reason(seq: Sequence, conv: Convention) -> FinishReason | None:
    """Why ``seq`` ends after its newest token, or None: EOS, a stop sequence, its cap, a full cache."""
    request, new = seq.request, seq.new
    if new[-1] in request.eos_ids or any(new[-len(s):] == list(s) for s in request.stop if len(s) <= len(new)):
        return "stop"
    if request.max_new_tokens is not None and len(new) >= request.max_new_tokens:
        return "length"
    if seq.next_position >= conv.max_context_len:
        return "cache_full"
    return None


def busy_message(source: str, slots: int) -> str:
    what = "its one KV-cache slot is" if slots == 1 else f"all {slots} of its KV-cache slots are"
    return (f"{source}: {what} held by other generations on this Program; queue generations with "
            "pyrt.llm.Engine (they wait for a slot), use another Program, or export with a larger "
            "max_batch_size")


def engine_convention(program: Any, method: str) -> Convention:
    """``program``'s convention, checked for what an engine runs."""
    conv = read_convention(program, method)
    if conv.layout == SINGLE and conv.batch != 1:
        raise InputError(f"{program.source}: forward takes a fixed batch of {conv.batch} sequences that move in step; "
                         "pyrt generates on files of batch 1 or on slot files (decoder_to_pte(max_batch_size=...))")
    if conv.layout == SINGLE and not conv.dynamic and conv.max_prefill != 1:
        raise InputError(f"{program.source}: forward takes exactly {conv.max_prefill} tokens per call (a static "
                         "shape); the convention needs a dynamic length or one token per call")
    return conv


__all__ = ["Engine", "Generation", "busy_message"]
