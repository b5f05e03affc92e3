"""Continuous batching's decisions: who runs in a step, what each feeds, and what a step's tokens end.

Pure bookkeeping: no locks, no threads, no program. :class:`Scheduler` keeps the waiting queue
(first come, first admitted as KV-cache slots free) and the running list; :meth:`~Scheduler.schedule`
plans one step (every decoding sequence feeds what it has not yet written -- the token it
generated last -- then prompts are fed in chunks, in admission order, within the program's
token budget per step); :meth:`~Scheduler.update` takes what the step chose for each feed
(:class:`Outcome`: how many fed tokens stay in the cache, which new tokens follow) and returns
an :class:`~pyrt.llm.outputs.Update` per generation, ending those that meet an EOS id, a stop
sequence, their ``max_new_tokens`` or a full cache. A feed may carry several tokens and ask for
logits at several of its last positions, and an outcome may keep only some of them: a step
that checks guessed tokens overwrites the rejected ones' cache positions at the next.

>>> from pyrt.llm.params import SamplingParams
>>> from pyrt.llm.request import make_request
>>> from pyrt.llm.slots import SlotPool
>>> conv = Convention("forward", batch=1, max_prefill=8, dynamic=True, max_context_len=16, vocab_size=10,
...                   bos_id=None, eos_ids=(), n_layers=None, constants={}, layout="slots", slots=2)
>>> sched = Scheduler(conv, SlotPool(2, "stub"))
>>> seq = sched.add(Sequence.of(7, make_request(conv, [1, 2, 3], SamplingParams(max_new_tokens=2))))
>>> [(f.tokens, f.start, f.logits) for f in (sched.admit() and sched.schedule())]
[((1, 2, 3), 0, 1)]
>>> [(u.tokens, u.result) for u in sched.update(sched.schedule(), [Outcome(kept=3, tokens=(5,))])]
[((5,), None)]
>>> [(f.tokens, f.start) for f in sched.schedule()]
[((5,), 3)]
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

import numpy as np

from pyrt.llm.convention import Convention
from pyrt.llm.outputs import FinishReason, GenerationResult, Update
from pyrt.llm.request import Request
from pyrt.llm.slots import Slots
from pyrt.llm.timings import Clock

__all__ = ["Scheduler", "Sequence", "Feed", "Outcome", "Counters", "finish_reason"]


@dataclass(eq=False)
class Sequence:
    """One generation inside a scheduler: its request, slot, tokens written to the cache, new tokens."""

    id: int
    request: Request
    rng: np.random.Generator
    clock: Clock
    new: list[int] = field(default_factory=list)
    slot: int | None = None
    fed: int = 0  # tokens of prompt + new written to the cache (and still valid there)

    @classmethod
    def of(cls, seq_id: int, request: Request) -> Sequence:
        """A new sequence, its clock started and its random state seeded now."""
        return cls(seq_id, request, np.random.default_rng(request.params.seed), Clock())

    @property
    def prompt(self) -> tuple[int, ...]:
        return self.request.prompt

    @property
    def next_position(self) -> int:
        """The cache position the last new token will take when it is fed."""
        return len(self.prompt) + len(self.new) - 1

    def result(self, reason: FinishReason) -> GenerationResult:
        return GenerationResult(list(self.new), reason, self.clock.timings(len(self.prompt), len(self.new)),
                                list(self.prompt))


@dataclass(frozen=True)
class Feed:
    """``tokens`` of ``seq`` written to its slot from position ``start``; ``logits``: rows wanted, for its last
    tokens (0: none, a prompt chunk that does not end the prompt; 1: the next token's)."""

    seq: Sequence
    tokens: tuple[int, ...]
    start: int
    logits: int

    @property
    def slot(self) -> int:
        assert self.seq.slot is not None  # only running sequences, which hold a slot, are fed
        return self.seq.slot


@dataclass(frozen=True)
class Outcome:
    """What a step chose for one feed: ``kept`` of its tokens stay in the cache, then ``tokens`` are new."""

    kept: int
    tokens: tuple[int, ...] = ()


@dataclass
class Counters:
    steps: int = 0
    tokens_generated: int = 0
    prompt_tokens: int = 0
    occupancy: Counter[int] = field(default_factory=Counter)  # sequences per step -> steps


class Scheduler:
    """Waiting and running generations on ``conv``'s program, holding KV-cache slots taken from ``slots``."""

    def __init__(self, conv: Convention, slots: Slots, now: Callable[[], float] = time.perf_counter) -> None:
        self.conv, self.slots, self.now = conv, slots, now
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order
        self.counters = Counters()

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> Sequence:
        self.waiting.append(seq)
        return seq

    def admit(self) -> list[Sequence]:
        """Waiting sequences moved to running, first come first, while slots are free."""
        admitted = []
        while self.waiting:
            taken = self.slots.take(1)
            if not taken:
                break
            seq = self.waiting.popleft()
            seq.slot = taken[0]
            self.running.append(seq)
            admitted.append(seq)
        return admitted

    def schedule(self) -> list[Feed]:
        """This step's feeds: decoding sequences first (what they have not written yet), then prompt chunks in
        admission order, within the program's token budget per step."""
        budget = self.conv.tokens_per_step
        feeds: list[Feed] = []
        for seq in self.running:
            if seq.new and budget > 0:
                feeds.append(Feed(seq, (seq.new[-1],), seq.next_position, 1))
                budget -= 1
        for seq in self.running:
            if not seq.new and budget > 0:
                chunk = seq.prompt[seq.fed:seq.fed + budget]
                feeds.append(Feed(seq, tuple(chunk), seq.fed, int(seq.fed + len(chunk) == len(seq.prompt))))
                budget -= len(chunk)
        return feeds

    def update(self, feeds: Seq[Feed], outcomes: Seq[Outcome]) -> list[Update]:
        """Apply a step's outcomes: new tokens, cache positions, and the generations that end."""
        self.counters.steps += 1
        self.counters.occupancy[len(feeds)] += 1
        updates = []
        for feed, outcome in zip(feeds, outcomes, strict=True):
            seq = feed.seq
            if not seq.new:
                self.counters.prompt_tokens += len(feed.tokens)
            seq.fed = feed.start + outcome.kept
            if outcome.tokens:
                updates.append(self._append(seq, outcome.tokens))
        return updates

    def fail(self, feeds: Seq[Feed], error: BaseException) -> list[Update]:
        """A step's run failed: the generations it carried end with ``error`` (the others go on)."""
        updates = []
        for feed in feeds:
            feed.seq.clock.end = self.now()
            self._release(feed.seq)
            updates.append(Update(feed.seq.id, at=feed.seq.clock.end, error=error))
        return updates

    def abort(self, seq_id: int, reason: FinishReason) -> tuple[Update, bool] | None:
        """End generation ``seq_id`` now with ``reason``, its tokens kept; (its update, whether it was waiting)."""
        for seq in self.waiting:
            if seq.id == seq_id:
                self.waiting.remove(seq)
                return self._end(seq, (), reason), True
        for seq in self.running:
            if seq.id == seq_id:
                return self._end(seq, (), reason), False
        return None  # it ended already

    def abort_all(self, reason: FinishReason) -> list[Update]:
        ended = [self._end(seq, (), reason) for seq in [*self.waiting, *self.running]]
        self.waiting.clear()
        return ended

    def _append(self, seq: Sequence, tokens: tuple[int, ...]) -> Update:
        """``tokens`` added to ``seq`` up to the first that ends it; its update."""
        now = self.now()
        if not seq.new:
            seq.clock.prefilled = now
        taken = []
        for token in tokens:
            seq.new.append(token)
            taken.append(token)
            self.counters.tokens_generated += 1
            if len(seq.new) == 1:
                seq.clock.first = self.now()
            reason = finish_reason(seq, self.conv)
            if reason is not None:
                return self._end(seq, tuple(taken), reason)
        return Update(seq.id, tuple(taken), now)

    def _end(self, seq: Sequence, tokens: tuple[int, ...], reason: FinishReason) -> Update:
        seq.clock.end = self.now()
        self._release(seq)
        return Update(seq.id, tokens, seq.clock.end, result=seq.result(reason))

    def _release(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
        if seq.slot is not None:
            self.slots.give_back([seq.slot])
            seq.slot = None


def finish_reason(seq: Sequence, conv: Convention) -> FinishReason | None:
    """Why ``seq`` ends after its newest token, or None: EOS, a stop sequence, its cap, a full cache."""
    request, new = seq.request, seq.new
    if new[-1] in request.eos_ids or any(new[-len(s):] == list(s) for s in request.params.stop if len(s) <= len(new)):
        return "stop"
    cap = request.params.max_new_tokens
    if cap is not None and len(new) >= cap:
        return "length"
    if seq.next_position >= conv.max_context_len:
        return "cache_full"
    return None
