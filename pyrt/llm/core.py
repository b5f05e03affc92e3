"""The engine core of one program's method: every generation on it, stepped as one batch; commands in, updates out.

:class:`EngineCore` is a state machine with a single entry, :meth:`EngineCore.step`: it applies
the commands front ends posted (:class:`Submit`, :class:`Cancel`, :class:`CloseFront`,
:class:`Pause` / :class:`Resume` / :class:`StepOnce`, :class:`Stop`), runs one forward call when
it has work, and returns what to hand over: each generation's :class:`~pyrt.llm.outputs.Update`
for its outbox, and each control command's reply. It constructs no lock, condition or event, and
no thread: :mod:`pyrt.llm.stepping` runs it on the one thread that touches its state, and every
front end (:class:`pyrt.llm.Engine`, ``pyrt.generate``) talks to it through that thread's inbox.

Inside, it owns the KV-cache slots (:class:`~pyrt.llm.slots.SlotTable`, with front ends'
reservations), the :class:`~pyrt.llm.scheduler.Scheduler` (who runs, what each feeds: pure), the
:class:`~pyrt.llm.runner.Runner` (the program's inputs, the run, each sequence's sampler) and, per
front end, what its :class:`FrontEnd` brought (a draft, its guess cap, its queue bound).

Admission is decided here, from the core's own counts, in one rule: a submission to a front end
with ``max_queued`` N is refused (:class:`pyrt.errors.QueueFullError`) when the generations
already waiting, less the slots free for it, are N or more. A front end that reserves slots
(``pyrt.generate``) gets up to that many of the free ones for its generations alone; when none is
free, its submission is refused with a :class:`pyrt.BusyError` naming the conflict.

>>> from tests.fixtures import stub_llm as S                                # doctest: +SKIP
>>> core = EngineCore(S.StubLM(S.convention()), S.convention())             # doctest: +SKIP
>>> out = core.step([Submit(FrontEnd(0), ((1, request, outbox, t0),))])     # doctest: +SKIP
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from pyrt.errors import BusyError, ProgramClosedError, QueueFullError
from pyrt.llm.convention import Convention
from pyrt.llm.drafting import Drafter, DraftQuery, fill
from pyrt.llm.guesses import Proposal
from pyrt.llm.outputs import FinishReason, Update
from pyrt.llm.request import Request
from pyrt.llm.runner import Runner
from pyrt.llm.scheduler import Scheduler
from pyrt.llm.scheduler import Sequence as Seq
from pyrt.llm.slots import SlotTable
from pyrt.llm.timings import Clock


class Sink(Protocol):
    """Where the core's output goes: a generation's outbox, or a control command's reply queue."""

    def put(self, item: Any) -> None: ...


@dataclass(frozen=True, eq=False)
class FrontEnd:
    """What a front end tells the core about itself, once, with its first submission.

    ``drafter``: its draft (None: none), asked for its generations' guesses on the core's thread;
    ``draft_tokens``: the most a sequence guesses per step; ``max_queued``: its queue bound (None: none);
    ``reserve``: slots to set aside for it at its first submission (0: it uses the shared ones);
    ``transient``: it goes (its reservation and draft released) when its last generation ends;
    ``prefix_caching``: its generations take the free slot holding the longest prefix of their prompt and
    feed from there (:mod:`pyrt.llm.slots`; not those asking for ``prompt_logprobs``, which need every
    prompt position's logits: they feed the whole prompt again), and get the positions a running generation's slot
    holds of it copied into theirs (:meth:`pyrt.llm.scheduler.Scheduler.catch_up`, where the program can).
    ``draft_tree``: its guesses are a tree of ``draft_tokens`` (:mod:`pyrt.llm.tree`).
    """

    id: int
    drafter: Drafter | None = None
    draft_tokens: int = 0
    max_queued: int | None = None
    reserve: int = 0
    transient: bool = False
    prefix_caching: bool = False
    draft_tree: bool = False


@dataclass(frozen=True)
class Submit:
    """Generations of ``front``: (id, checked request, outbox, when submitted) each, refused or queued together."""

    front: FrontEnd
    items: tuple[tuple[int, Request, Sink, float], ...]


@dataclass(frozen=True)
class Cancel:
    seq_id: int
    reason: FinishReason = "cancelled"


@dataclass(frozen=True)
class CloseFront:
    """Front end ``front``'s generations end as cancelled; its reservation and draft are let go (its draft closed,
    also when none of its generations ever ran); ``reply`` gets None."""

    front: FrontEnd
    reply: Sink | None = None


@dataclass(frozen=True)
class Pause:
    """No step runs until a matching :class:`Resume` (commands are still applied); ``reply`` gets None once held."""

    reply: Sink


@dataclass(frozen=True)
class Resume:
    pass


@dataclass(frozen=True)
class StepOnce:
    """``reply`` gets the number of sequences the next step carries (run now even while paused; 0 with no work)."""

    reply: Sink


@dataclass(frozen=True)
class Stop:
    """The program is closing: every generation ends as cancelled, later submissions are refused."""

    reply: Sink | None = None


Command = Submit | Cancel | CloseFront | Pause | Resume | StepOnce | Stop


class Snapshot(NamedTuple):
    """The core's counters as of its last step or command, published for other threads to read."""

    steps: int = 0
    tokens_generated: int = 0
    prompt_tokens: int = 0
    running: int = 0
    queued: int = 0
    free_slots: int = 0
    occupancy: tuple[tuple[int, int], ...] = ()  # (sequences in a step, steps), by size
    drafted: int = 0
    accepted: int = 0
    passes: int = 0
    failures: int = 0  # unexpected failures of a step (bugs), each ending the generations it held
    fronts: tuple[tuple[int, int, int], ...] = ()  # (front end, queued, running)
    stopped: bool = False
    prefix_cache_queries: int = 0  # prompt tokens of generations that looked for a cached prefix
    prefix_cache_hits: int = 0  # of those, the tokens found in a slot (not fed)
    checks: int = 0  # (sequence, step) pairs that checked guesses


@dataclass
class _Front:
    spec: FrontEnd
    live: set[int] = field(default_factory=set)  # its generations not yet ended


class EngineCore:
    """Every generation on ``conv``'s method of ``program`` (anything with ``run(*inputs, method=...)``)."""

    def __init__(self, program: Any, conv: Convention, source: str | None = None,
                 now: Callable[[], float] = time.perf_counter) -> None:
        self.program, self.conv = program, conv
        self.source = str(getattr(program, "source", "")) if source is None else source
        self.slots = SlotTable(conv.slots, self.source)
        self.runner = Runner(program, conv)
        self.scheduler = Scheduler(conv, self.slots, now, copies=self.runner.copies)
        self._fronts: dict[int, _Front] = {}
        self._outboxes: dict[int, Sink] = {}  # each live generation's
        self._front_of: dict[int, int] = {}  # each live generation's front end
        self._out: list[tuple[Sink, Any]] = []  # what the step hands over, in order
        self._paused = 0
        self._step_replies: list[Sink] = []
        self._stopped = False
        self.failures = 0
        self._runs = self._runs_made()  # the program's runs of the method when the core last ran it

    # -- the one entry ----------------------------------------------------------------------------
    def step(self, commands: Sequence[Command] = ()) -> list[tuple[Sink, Any]]:
        """Apply ``commands`` in order, then run one step if there is work (and no pause, or a StepOnce asks);
        what to hand over: (outbox, update) and (reply, value) pairs, in the order they happened."""
        for command in commands:
            self._apply(command)
        if self._stopped:
            self._out += [(reply, 0) for reply in self._step_replies]
            self._step_replies = []
            return self._handed()
        if self._step_replies or (self.has_work and not self._paused):
            carried = self._run_step() if self.has_work else 0
            for reply in self._step_replies:
                self._out.append((reply, carried))
            self._step_replies = []
        self._settle()
        return self._handed()

    def _handed(self) -> list[tuple[Sink, Any]]:
        out, self._out = self._out, []
        return out

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    @property
    def wants_step(self) -> bool:
        """Whether :meth:`step` would run a forward call with no new command (the stepping thread keeps going)."""
        return bool(self._step_replies) or (self.has_work and not self._paused)

    def fail_all(self, error: BaseException) -> list[tuple[Sink, Any]]:
        """An unexpected failure of a step (a bug): every live generation ends with ``error``, its slot freed, and the
        core goes on; what to hand over (what the failed step had queued first)."""
        self.failures += 1
        self.scheduler.fail_sequences([*self.scheduler.waiting, *self.scheduler.running], error)  # frees the slots
        for seq_id, outbox in self._outboxes.items():
            self._out.append((outbox, Update(seq_id, error=error)))
            self.runner.end(seq_id)
            try:
                self._ended(seq_id)
            except Exception:  # the bug again (a draft's release): the generation ends all the same
                self._front_of.pop(seq_id, None)
        self._outboxes.clear()
        self._out += [(reply, 0) for reply in self._step_replies]
        self._step_replies = []
        self._settle()
        return self._handed()

    def snapshot(self) -> Snapshot:
        c, sched = self.scheduler.counters, self.scheduler
        per_front = {f: [0, 0] for f in self._fronts}
        for seq in sched.waiting:
            per_front[self._front_of[seq.id]][0] += 1
        for seq in sched.running:
            per_front[self._front_of[seq.id]][1] += 1
        return Snapshot(c.steps, c.tokens_generated, c.prompt_tokens, len(sched.running), len(sched.waiting),
                        self.slots.free, tuple(sorted(c.occupancy.items())), c.drafted, c.accepted, c.passes,
                        self.failures, tuple((f, q, r) for f, (q, r) in sorted(per_front.items())), self._stopped,
                        c.prefix_queries, c.prefix_hits, c.checks)

    # -- commands ---------------------------------------------------------------------------------
    def _apply(self, command: Command) -> None:
        if isinstance(command, Submit):
            self._submit(command)
        elif isinstance(command, Cancel):
            update = self.scheduler.abort(command.seq_id, command.reason)
            if update is not None:
                self._deliver([update])
        elif isinstance(command, CloseFront):
            self._close_front(command.front)
            if command.reply is not None:
                self._out.append((command.reply, None))
        elif isinstance(command, Pause):
            self._paused += 1
            self._out.append((command.reply, None))
        elif isinstance(command, Resume):
            self._paused = max(self._paused - 1, 0)
        elif isinstance(command, StepOnce):
            self._step_replies.append(command.reply)
        else:
            self._stop()
            if command.reply is not None:
                self._out.append((command.reply, None))

    def _submit(self, command: Submit) -> None:
        spec = command.front
        refusal = self._refusal(spec, [request.prompt for _, request, _, _ in command.items])
        front = self._fronts.get(spec.id)
        for seq_id, request, outbox, submitted in command.items:
            error = refusal or self._queue_full(spec)
            if error is not None:
                self._out.append((outbox, Update(seq_id, error=error)))
                continue
            front = front or self._fronts.setdefault(spec.id, _Front(spec))
            reuses = spec.prefix_caching and request.params.prompt_logprobs is None
            seq = Seq(seq_id, request, Clock(submitted), spec.id, self._max_guesses(spec), reuses=reuses,
                      tree=spec.draft_tree)
            self.scheduler.add(seq)
            self.runner.start(seq_id, request)
            self._outboxes[seq_id] = outbox
            self._front_of[seq_id] = spec.id
            front.live.add(seq_id)
            self._out.append((outbox, Update(seq_id, accepted=True)))
        if front is None:  # refused whole: nothing of it runs
            self.slots.release(spec.id)
            if spec.transient and spec.drafter is not None:
                spec.drafter.close()

    def _refusal(self, spec: FrontEnd, prompts: list[tuple[int, ...]]) -> Exception | None:
        """Why every generation of this submission is refused (the program closed; no slot to reserve), or None;
        a front end that caches prefixes reserves the slots holding its ``prompts``' longest prefixes."""
        if self._stopped:
            return ProgramClosedError(f"{self.source}: the program was closed")
        wanted = prompts if spec.prefix_caching else None
        if spec.reserve and spec.id not in self._fronts and not self.slots.reserve(spec.id, spec.reserve, wanted):
            return BusyError(busy_message(self.source, self.conv.slots))
        return None

    def _queue_full(self, spec: FrontEnd) -> QueueFullError | None:
        """The queue bound, in one place: waiting generations beyond the slots free for this front end."""
        if spec.max_queued is None:
            return None
        waiting = len(self.scheduler.waiting) - self.slots.free_for(spec.id)
        if waiting < spec.max_queued:
            return None
        return QueueFullError(self.source, waiting=waiting, slots=self.conv.slots, limit=spec.max_queued,
                              name="max_queued")

    def _max_guesses(self, spec: FrontEnd) -> int:
        """The most tokens a sequence of ``spec`` may guess per step: its ``draft_tokens`` within the logits rows and
        tokens one step takes (0 without a draft, or on a file that returns the last position's logits only)."""
        if spec.drafter is None:
            return 0
        return max(min(spec.draft_tokens, self.conv.max_rows - 1, self.conv.tokens_per_step - 1), 0)

    def _close_front(self, spec: FrontEnd) -> None:
        front = self._fronts.get(spec.id)
        if front is None:
            if spec.drafter is not None:
                spec.drafter.close()
            return
        self._deliver(self.scheduler.abort_all("cancelled", spec.id))
        self._forget(front)

    def _forget(self, front: _Front) -> None:
        self._fronts.pop(front.spec.id, None)
        self.slots.release(front.spec.id)
        if front.spec.drafter is not None:
            front.spec.drafter.close()

    def _stop(self) -> None:
        self._deliver(self.scheduler.abort_all("cancelled"))
        for front in list(self._fronts.values()):
            self._forget(front)
        self._stopped = True

    # -- a step -----------------------------------------------------------------------------------
    def _run_step(self) -> int:
        if self._runs_made() != self._runs:  # a run not the core's may have written any slot: forget them all
            self.slots.forget()
        self.scheduler.admit()
        copies = self.scheduler.catch_up()  # positions running generations hold, copied instead of prefilled
        if copies:
            try:
                self.runner.copy(copies)
            except Exception as exc:  # a failed copy ends the generations it was for, not the engine
                self._deliver(self.scheduler.copy_failed(copies, exc))
        feeds = self.scheduler.schedule(self._draft())
        if feeds:
            try:
                outcomes = self.runner.run(feeds)
            except Exception as exc:  # a failed run ends the generations it carried, not the engine
                self._deliver(self.scheduler.fail(feeds, exc))
            else:
                self._deliver(self.scheduler.update(feeds, outcomes))
            finally:
                self._runs = self._runs_made()
        return len(feeds)

    def _runs_made(self) -> int | None:
        """The program's runs of the method so far (:meth:`pyrt.Program.runs`; None for a program that does not
        count them)."""
        runs = getattr(self.program, "runs", None)
        return runs(self.conv.method) if callable(runs) else None

    def _draft(self) -> dict[int, Proposal]:
        """This step's guesses, by sequence id, each sequence's room filled (:func:`pyrt.llm.drafting.fill`); a
        draft that fails ends the generations it was guessing for."""
        rooms = self.scheduler.guess_room()
        by_drafter: dict[int, list[tuple[Seq, int]]] = {}
        for seq, room in rooms:
            by_drafter.setdefault(self._front_of[seq.id], []).append((seq, room))
        proposals: dict[int, Proposal] = {}
        vocab = self.conv.vocab_size
        for front_id, group in by_drafter.items():
            drafter = self._fronts[front_id].spec.drafter
            assert drafter is not None  # only sequences of a front end with a draft may guess
            tree = self._fronts[front_id].spec.draft_tree
            queries = [(DraftQuery(seq.id, seq.prompt, tuple(seq.new), seq.request, self.runner.samplers[seq.id].rng,
                                   tree), room) for seq, room in group]
            try:
                made = drafter.propose(queries)
            except Exception as exc:  # a failed draft run ends the generations it carried, not the engine
                self._deliver(self.scheduler.fail_sequences([seq for seq, _ in group], exc))
                continue
            for seq, room in group:
                proposals[seq.id] = fill(made.get(seq.id), seq.new[-1], room, vocab)
        return proposals

    # -- handing over -----------------------------------------------------------------------------
    def _deliver(self, updates: list[Update]) -> None:
        """Queue the updates for their generations' outboxes; a generation that ended lets go of its sampler, its
        draft slot and its place in its front end."""
        for update in updates:
            outbox = self._outboxes[update.seq_id]
            if update.final:
                self.runner.end(update.seq_id)
                self._ended(update.seq_id)
                del self._outboxes[update.seq_id]
            self._out.append((outbox, update))

    def _ended(self, seq_id: int) -> None:
        front = self._fronts.get(self._front_of.pop(seq_id, -1))
        if front is not None:
            front.live.discard(seq_id)
            if front.spec.drafter is not None:
                front.spec.drafter.release(seq_id)

    def _settle(self) -> None:
        """A transient front end whose last generation ended goes (its reservation back, its draft closed)."""
        for front in [f for f in self._fronts.values() if f.spec.transient and not f.live]:
            self._forget(front)


def busy_message(source: str, slots: int) -> str:
    what = "its one KV-cache slot is" if slots == 1 else f"all {slots} of its KV-cache slots are"
    return (f"{source}: {what} held by other generations on this Program; queue generations with "
            "pyrt.llm.Engine (they wait for a slot), use another Program, or export with a larger "
            "max_batch_size")


__all__ = ["EngineCore", "FrontEnd", "Submit", "Cancel", "CloseFront", "Pause", "Resume", "StepOnce", "Stop",
           "Command", "Snapshot", "Sink", "busy_message"]
