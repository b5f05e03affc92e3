"""Continuous batching with one owner: the thread stepping an engine is the only one that touches its state.

:class:`Engine` holds a :class:`~pyrt.llm.scheduler.Scheduler` (who runs, what each feeds) and a
:class:`~pyrt.llm.runner.Runner` (the program's inputs, the run, the sampling). One thread at a time
steps it: the caller's (:meth:`Engine.step`, or iterating a generation while no thread runs the
engine) or the one in :meth:`Engine.run` (a server's, until :meth:`Engine.stop`). Every other thread
talks to it through queues: :meth:`Engine.submit` and cancellations post commands to its inbox,
applied at the start of the next step (at once when nothing steps), and each generation's tokens
come back through its :class:`~pyrt.llm.stream.Generation` handle's own queue; :meth:`Engine.stats`
reads what the stepping thread last published. Each step feeds every running generation (a decoding
sequence its last token; prompts in chunks within the file's token budget per step,
``get_max_tokens_per_step``); a queued generation joins when a KV-cache slot is free (the program's
slots are shared with every other engine and ``pyrt.generate`` call on it) and leaves after its last
token, between steps. On a one-sequence file the engine runs one generation at a time, in submission
order.

Speculative decoding (``draft="ngram"`` or a draft file's Program, ``draft_tokens`` k): before
each step the stepping thread asks the draft for up to k guesses per decoding sequence
(:meth:`~pyrt.llm.scheduler.Scheduler.guess_room` says how many fit), the step checks them beside
each sequence's last token, and the tokens are exactly those decoding without a draft gives
(:mod:`pyrt.llm.verify`). A file whose logits cover the last position only cannot check any.

>>> with pyrt.Program("m.pte") as prog:                                   # doctest: +SKIP
...     engine = Engine(prog, draft="ngram", draft_tokens=4)
...     a = engine.submit([1, 2, 3], max_new_tokens=8)
...     b = engine.submit([4, 5], params=SamplingParams(max_new_tokens=8, do_sample=True, seed=0))
...     while engine.pending:
...         engine.step()
...     a.result.tokens, b.result.finish_reason
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, TypedDict

from pyrt.errors import InputError, QueueFullError
from pyrt.llm.config import GenerationConfig
from pyrt.llm.drafting import fill, make_drafter
from pyrt.llm.outputs import FinishReason, Update
from pyrt.llm.params import SamplingParams
from pyrt.llm.program import LLMProgram
from pyrt.llm.request import Request, make_request
from pyrt.llm.runner import Runner
from pyrt.llm.scheduler import Proposal, Scheduler, Sequence
from pyrt.llm.slots import Reservation, Slots
from pyrt.llm.stream import Generation, Outbox

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from Python 3.11

IDLE_WAIT_S = 0.5  # Engine.run's wait for work, a safety net: every command and Engine.stop wake it at once
STALLED_WAIT_S = 0.005  # Engine.run, after a step that ran nothing (slots held by others): wait before the next
PAUSE_S = 0.05  # a caller waiting for a generation while another thread steps, or while nothing can run


class GenerationOptions(TypedDict, total=False):
    """:class:`~pyrt.llm.config.GenerationConfig`'s fields, as keywords of :class:`Engine`."""

    method: str
    draft: Any
    draft_tokens: int
    max_queued: int | None


@dataclass(frozen=True)
class _Add:
    seq: Sequence
    outbox: Outbox


@dataclass(frozen=True)
class _Abort:
    seq_id: int
    reason: FinishReason


class Engine:
    """Continuous batching over ``program`` (a :class:`pyrt.Program` following the LLM convention).

    ``config`` (:class:`~pyrt.llm.config.GenerationConfig`, or its fields as keywords): ``max_queued``: a
    submission that would make more than this many generations wait for a KV-cache slot (beyond the
    slots free now, which the next step fills) raises :class:`pyrt.errors.QueueFullError`, a
    :class:`pyrt.BusyError` (None: no bound). ``draft``: None, ``"ngram"`` (prompt lookup), or a draft
    LLM file with the target's vocabulary, BOS and EOS (its path, opened fully resident on the target's
    devices, or its :class:`pyrt.Program`: :func:`pyrt.llm.open_draft`); ``draft_tokens``: the most
    tokens a sequence guesses per step (fewer where its cache, ``max_new_tokens``, or the step's token
    budget and logits rows leave less). ``slots``: where its generations take slots (default: the
    program's pool, shared with every engine on it; ``pyrt.generate`` passes slots it reserved, given
    back when the engine has nothing left to run). Thread-safe: submit and cancel from any thread; one
    thread steps at a time.
    """

    def __init__(self, program: Any, config: GenerationConfig | None = None, *, slots: Slots | None = None,
                 **options: Unpack[GenerationOptions]) -> None:
        if config is None:
            config = GenerationConfig(**options)
        elif options:
            raise InputError(f"give config or its fields as keywords, not both (got {sorted(options)})")
        self.config = config
        self.draft_tokens, self.max_queued = config.draft_tokens, config.max_queued
        llm = program if isinstance(program, LLMProgram) else LLMProgram(program, config.method)
        self.llm, self.program, self.conv = llm, llm.program, llm.conv
        self._slots = llm.slots if slots is None else slots
        self._scheduler = Scheduler(self.conv, self._slots)
        self._runner = Runner(self.program, self.conv)
        self._drafter = make_drafter(config.draft, llm)
        self._inbox: queue.SimpleQueue[_Add | _Abort] = queue.SimpleQueue()
        self._posted = threading.Event()  # a command was posted (wakes Engine.run)
        self._stopping = threading.Event()  # Engine.stop was called
        self._stepping = threading.Lock()  # held by the one thread that steps
        # the queue bound: counting and admitting at once (re-entrant: a dropped handle's finalizer may run
        # on a thread that holds it, and apply its cancellation there)
        self._admission = threading.RLock()
        self._queued = 0  # submitted, not yet holding a slot, not ended
        self._ids = itertools.count()
        self._outboxes: dict[int, Outbox] = {}  # the stepping thread's: each live generation's queue
        self._handing: list[tuple[Outbox, Update]] = []  # updates taken, handed over once the stats count them
        self._looping = False
        self._publish()

    # -- what a caller sees -----------------------------------------------------------------------
    @property
    def slots(self) -> int:
        """Sequences one step can hold (the file's ``get_max_batch_size``; 1 for a one-sequence file)."""
        return self.conv.slots

    @property
    def queued(self) -> int:
        """Generations submitted that hold no slot yet."""
        return self._queued

    @property
    def running(self) -> int:
        """Generations holding a slot (as of the last step or command applied)."""
        return self._published.running

    @property
    def pending(self) -> int:
        """Generations queued or running."""
        return self.queued + self.running

    @property
    def draft(self) -> str | None:
        """The draft's name (``"ngram"``, the draft file), or None without one."""
        return None if self._drafter is None else str(getattr(self._drafter, "name", type(self._drafter).__name__))

    @property
    def max_guesses(self) -> int:
        """The most tokens one sequence may guess per step: ``draft_tokens`` within the logits rows and tokens one
        step takes (0 without a draft, or on a file that returns the last position's logits only)."""
        if self._drafter is None:
            return 0
        return max(min(self.draft_tokens, self.conv.max_rows - 1, self.conv.tokens_per_step - 1), 0)

    def stats(self) -> dict[str, Any]:
        """Counters: steps (forward calls of the target), generated and prompt tokens, queued and running, slots and
        free slots, sequences per step; speculative decoding's ``drafted`` and ``accepted`` guessed tokens,
        ``acceptance_rate`` (accepted / drafted) and ``tokens_per_pass`` (generated tokens per sequence per step that
        gave it tokens: 1.0 without a draft). A snapshot: the stepping thread publishes it after each step."""
        p = self._published
        return {"steps": p.steps, "tokens_generated": p.tokens_generated, "prompt_tokens": p.prompt_tokens,
                "running": p.running, "slots": self.slots,
                "occupancy": {str(k): v for k, v in sorted(p.occupancy.items())}, "draft": self.draft,
                "draft_tokens": self.max_guesses, "drafted": p.drafted, "accepted": p.accepted,
                "acceptance_rate": p.accepted / p.drafted if p.drafted else 0.0,
                "tokens_per_pass": p.tokens_generated / p.passes if p.passes else 0.0,
                "queued": self._queued, "free_slots": self._slots.free}

    # -- commands (any thread) --------------------------------------------------------------------
    def submit(self, prompt_ids: Any, params: SamplingParams | None = None, **sampling: Any) -> Generation:
        """Queue a generation of ``prompt_ids``; its handle. ``params``, or the same fields as keywords
        (``max_new_tokens``, ``do_sample``, ``temperature``, ``top_k``, ``top_p``, ``seed``, ``eos_ids``,
        ``stop``: token-id sequences that end it, ``finish_reason == "stop"``). Every value is checked
        here (InputError naming it); BusyError past ``max_queued``."""
        if params is None:
            params = SamplingParams(**sampling)
        elif sampling:
            raise InputError(f"give params or sampling keywords, not both (got {sorted(sampling)})")
        return self.add(make_request(self.conv, prompt_ids, params))

    def add(self, request: Request) -> Generation:
        """Queue an already checked request (:func:`pyrt.llm.request.make_request` for this engine's program)."""
        seq, outbox = Sequence.of(next(self._ids), request), Outbox()
        with self._admission:
            waiting = self._queued - self._slots.free  # the next step admits as many as are free
            if self.max_queued is not None and waiting >= self.max_queued:
                raise QueueFullError(self.llm.source, waiting=waiting, slots=self.slots, limit=self.max_queued,
                                     name="max_queued")
            self._queued += 1
            self._post(_Add(seq, outbox))
        return Generation(self, seq.id, request.prompt, outbox)

    def cancel(self, generation: Generation, reason: FinishReason = "cancelled") -> None:
        """End ``generation`` at the next step (at once when nothing steps) with ``finish_reason`` ``reason``,
        keeping its tokens; its slot is freed."""
        self.abort(generation.id, reason)

    def abort(self, seq_id: int, reason: FinishReason) -> None:
        self._post(_Abort(seq_id, reason))
        if self._stepping.acquire(blocking=False):  # nothing steps: apply it now
            try:
                self._apply_commands()
                self._settle()
            finally:
                self._stepping.release()

    def _post(self, command: _Add | _Abort) -> None:
        self._inbox.put(command)
        self._posted.set()

    # -- stepping (one thread at a time) ----------------------------------------------------------
    def step(self) -> int:
        """One forward call for every running generation (joining queued ones); how many it carried."""
        with self._stepping:
            return self._step()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """``with engine.paused():`` no step runs inside the block (submissions queue, as when steps are slow)."""
        with self._stepping:
            yield

    def advance(self, outbox: Outbox) -> None:
        """Bring a waiting generation's next update closer: step when no thread steps, else wait for the one that
        does (at most a moment: a slot may also free on another engine of the program)."""
        if not self._looping and self._stepping.acquire(blocking=False):
            try:
                if self._step():
                    return
            finally:
                self._stepping.release()
        outbox.pause(PAUSE_S)

    def run(self) -> None:
        """Step on this thread until :meth:`stop`: the engine's one stepping thread (a server's); while it runs,
        generations wait for it instead of stepping. A run failure ends the generations it carried; anything
        else raised here is a bug, and ends this call."""
        self._looping = True
        try:
            while not self._stopping.is_set():
                if not self.pending:
                    self._posted.wait(IDLE_WAIT_S)
                self._posted.clear()
                if self.step() == 0 and self.pending:  # nothing could run: slots are held elsewhere
                    self._stopping.wait(STALLED_WAIT_S)
        finally:
            self._looping = False

    def stop(self) -> None:
        """Make :meth:`run` return after the step it is in (at once when it waits for work); from any thread."""
        self._stopping.set()
        self._posted.set()

    def close(self) -> None:
        """Cancel every generation still queued or running and give their slots (the draft's too) back."""
        with self._stepping:
            self._apply_commands()
            self._deliver(self._scheduler.abort_all("cancelled"))
            with self._admission:
                self._queued = 0
            if self._drafter is not None:
                self._drafter.close()
            self._settle()

    def _step(self) -> int:
        self._apply_commands()
        with self._admission:
            self._queued -= len(self._scheduler.admit())
        feeds = self._scheduler.schedule(self._draft())
        if feeds:
            try:
                outcomes = self._runner.run(feeds)
            except Exception as exc:  # a failed run ends the generations it carried, not the engine
                self._deliver(self._scheduler.fail(feeds, exc))
            else:
                self._deliver(self._scheduler.update(feeds, outcomes))
        self._settle()
        return len(feeds)

    def _draft(self) -> dict[int, Proposal]:
        """This step's guesses, by sequence id, each sequence's room filled (:func:`pyrt.llm.drafting.fill`); a
        draft that fails ends the generations it was guessing for."""
        if self._drafter is None:
            return {}
        rooms = self._scheduler.guess_room(self.draft_tokens)
        if not rooms:
            return {}
        try:
            proposals = self._drafter.propose(rooms)
        except Exception as exc:  # a failed draft run ends the generations it carried, not the engine
            self._deliver(self._scheduler.fail_sequences([seq for seq, _ in rooms], exc))
            return {}
        vocab = self.conv.vocab_size
        return {seq.id: fill(proposals.get(seq.id), seq.new[-1], room, vocab) for seq, room in rooms}

    def _apply_commands(self) -> None:
        while True:
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(command, _Add):
                self._outboxes[command.seq.id] = command.outbox
                self._scheduler.add(command.seq)
                continue
            ended = self._scheduler.abort(command.seq_id, command.reason)
            if ended is not None:
                update, was_waiting = ended
                if was_waiting:
                    with self._admission:
                        self._queued -= 1
                self._deliver([update])

    def _deliver(self, updates: list[Update]) -> None:
        """Take the updates for their generations; :meth:`_settle` hands them over (a generation that ended has let
        go of its draft slots here already)."""
        for update in updates:
            outbox = self._outboxes.pop(update.seq_id) if update.final else self._outboxes[update.seq_id]
            if update.final and self._drafter is not None:
                self._drafter.release(update.seq_id)
            self._handing.append((outbox, update))

    def _settle(self) -> None:
        """After a step or a command: a reservation with nothing left to run goes back, the stats are published,
        then the updates are handed over: a caller that sees its last token sees the stats that count it."""
        if isinstance(self._slots, Reservation) and not self._scheduler.has_work and not self._queued:
            self._slots.release()
        self._publish()
        handing, self._handing = self._handing, []
        for outbox, update in handing:
            outbox.put(update)

    def _publish(self) -> None:
        c = self._scheduler.counters  # a copy of the numbers, each step: stats() formats them when asked
        self._published = _Snapshot(c.steps, c.tokens_generated, c.prompt_tokens, len(self._scheduler.running),
                                    dict(c.occupancy), c.drafted, c.accepted, c.passes)


class _Snapshot(NamedTuple):
    """The counters as the stepping thread last published them."""

    steps: int
    tokens_generated: int
    prompt_tokens: int
    running: int
    occupancy: dict[int, int]
    drafted: int
    accepted: int
    passes: int


def busy_message(source: str, slots: int) -> str:
    what = "its one KV-cache slot is" if slots == 1 else f"all {slots} of its KV-cache slots are"
    return (f"{source}: {what} held by other generations on this Program; queue generations with "
            "pyrt.llm.Engine (they wait for a slot), use another Program, or export with a larger "
            "max_batch_size")


__all__ = ["Engine", "Generation", "SamplingParams", "busy_message"]
