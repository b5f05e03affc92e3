"""Continuous batching's decisions: who runs in a step, what each feeds, and what a step's tokens end.

Pure bookkeeping: no locks, no threads, no program, no random state (the runner owns each sequence's
sampler: :mod:`pyrt.llm.runner`). :class:`Scheduler` keeps the waiting queue (first come, first
admitted as KV-cache slots free for it) and the running list; :meth:`~Scheduler.schedule`
plans one step (every decoding sequence feeds what it has not yet written -- the token it
generated last -- then prompts are fed in chunks, in admission order, within the program's
token budget per step); :meth:`~Scheduler.update` takes what the step chose for each feed
(:class:`Outcome`: how many fed tokens stay in the cache, which new tokens follow) and returns
an :class:`~pyrt.llm.outputs.Update` per generation, ending those that meet an EOS id, a stop
sequence, their ``max_new_tokens`` or a full cache. A feed may carry several tokens and ask for
logits at several of its last positions, and an outcome may keep only some of them: a step
that checks guessed tokens overwrites the rejected ones' cache positions at the next.

Speculative decoding: :meth:`~Scheduler.guess_room` says how many tokens each decoding
sequence may guess this step (at most its ``max_guesses``; within what its cache and
``max_new_tokens`` leave, and what the step's token budget and logits rows leave after the
decoding tokens, with up to half the rest kept for prompt chunks; shared out evenly); a drafter's
:class:`Proposal` for a sequence then rides on its feed after its last token, one logits row each.

Prefix caching across running generations (where the program can copy cache positions between slots,
``copies``): :meth:`~Scheduler.catch_up` brings each prefilling sequence that ``reuses`` up to the longest
prefix of its prompt another running sequence has written and kept (a :class:`Copy` the core has run before
the step), and :meth:`~Scheduler.waits` holds back the prompt chunks of one whose next positions a sequence
admitted before it is still prefilling with the same tokens (the earliest never waits, so someone always
feeds), so that users of one system prompt at once prefill it once.

>>> from pyrt.llm.params import SamplingParams
>>> from pyrt.llm.request import make_request
>>> from pyrt.llm.slots import SlotTable
>>> conv = Convention("forward", batch=1, max_prefill=8, dynamic=True, max_context_len=16, vocab_size=10,
...                   bos_id=None, eos_ids=(), n_layers=None, constants={}, layout="slots", slots=2)
>>> sched = Scheduler(conv, SlotTable(2, "stub"))
>>> seq = sched.add(Sequence(7, make_request(conv, [1, 2, 3], SamplingParams(max_new_tokens=2))))
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
from collections.abc import Callable, Mapping
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field, replace

from pyrt.llm.convention import Convention
from pyrt.llm.guesses import Proposal
from pyrt.llm.outputs import FinishReason, GenerationResult, Update
from pyrt.llm.processors import TokenLogprob
from pyrt.llm.request import Request
from pyrt.llm.slots import SlotTable, kept_prefix
from pyrt.llm.timings import Clock

__all__ = ["Scheduler", "Sequence", "Feed", "Outcome", "Copy", "Counters", "finish_reason", "guess_cap",
           "share_out"]


@dataclass(eq=False)
class Sequence:
    """One generation inside a scheduler: its request, slot, tokens written to the cache, new tokens.

    ``front``: the front end that submitted it (its slots come from that front end's reservation, if it has one);
    ``max_guesses``: the most tokens it may guess per step (0: no draft); ``reuses``: it takes the free slot whose
    cache holds the longest prefix of its prompt and feeds from there (prefix caching).
    """

    id: int
    request: Request
    clock: Clock = field(default_factory=Clock)
    front: int | None = None
    max_guesses: int = 0
    reuses: bool = False
    tree: bool = False  # its guesses are a tree: max_new_tokens bounds their depth (the draft's), not their number
    new: list[int] = field(default_factory=list)
    slot: int | None = None
    fed: int = 0  # tokens of prompt + new written to the cache (and still valid there)
    cached: int = 0  # prompt tokens its slot held already when it took it (not fed)
    passes: int = 0  # steps that gave it new tokens
    drafted: int = 0  # guessed tokens checked
    accepted: int = 0  # guessed tokens the target kept
    logprobs: list[TokenLogprob] = field(default_factory=list)  # per new token, when its parameters ask
    prompt_logprobs: list[TokenLogprob | None] = field(default_factory=list)  # per prompt token (the first: None)

    @property
    def prompt(self) -> tuple[int, ...]:
        return self.request.prompt

    @property
    def constrained(self) -> bool:
        """Structured output: a grammar chooses its ids (it guesses none)."""
        return self.request.params.grammar is not None

    @property
    def next_position(self) -> int:
        """The cache position the last new token will take when it is fed."""
        return len(self.prompt) + len(self.new) - 1

    @property
    def context(self) -> tuple[int, ...]:
        """Every token so far: the prompt, then the new ones."""
        return (*self.prompt, *self.new)

    def result(self, reason: FinishReason) -> GenerationResult:
        params = self.request.params
        return GenerationResult(list(self.new), reason, self.clock.timings(len(self.prompt), len(self.new)),
                                list(self.prompt), self.passes, self.drafted, self.accepted,
                                list(self.logprobs) if params.logprobs is not None else None,
                                list(self.prompt_logprobs) if params.prompt_logprobs is not None else None,
                                self.cached)


@dataclass(frozen=True)
class Feed:
    """A plain value: ``tokens`` of sequence ``seq_id`` written to ``slot`` from position ``start``; ``logits``:
    rows wanted, for its last tokens (0: none, a prompt chunk that does not end the prompt; 1: the next token's;
    1 + the guesses of ``proposal``, whose tokens end ``tokens``). ``request`` and ``generated`` (its new tokens
    before this step) are what the runner samples with."""

    seq_id: int
    slot: int
    tokens: tuple[int, ...]
    start: int
    logits: int
    request: Request
    generated: tuple[int, ...] = ()
    proposal: Proposal | None = None

    @property
    def guesses(self) -> tuple[int, ...]:
        return () if self.proposal is None else self.proposal.tokens

    @property
    def prefill(self) -> bool:
        """A prompt chunk (the sequence has no new token yet)."""
        return not self.generated


@dataclass(frozen=True)
class Outcome:
    """What a step chose for one feed: ``kept`` of its tokens stay in the cache, then ``tokens`` are new (with their
    ``logprobs`` where the parameters ask); ``finished``: its grammar is complete after them (structured output)."""

    kept: int
    tokens: tuple[int, ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()
    prompt_logprobs: tuple[TokenLogprob | None, ...] = ()  # of the prompt tokens the fed ones predict
    finished: bool = False


@dataclass(frozen=True)
class Copy:
    """Positions ``start .. end - 1`` of slot ``src`` (written and kept by the running generation there) copied to
    slot ``dst`` of generation ``seq_id``, before the step that reads them (:meth:`Scheduler.catch_up`)."""

    seq_id: int
    src: int
    dst: int
    start: int
    end: int


@dataclass
class Counters:
    steps: int = 0
    tokens_generated: int = 0
    prompt_tokens: int = 0
    occupancy: Counter[int] = field(default_factory=Counter)  # sequences per step -> steps
    passes: int = 0  # (sequence, step) pairs that gave new tokens: tokens_generated / passes is tokens per pass
    drafted: int = 0  # guessed tokens checked
    accepted: int = 0  # guessed tokens kept
    prefix_queries: int = 0  # prompt tokens of the sequences that looked for a cached prefix
    prefix_hits: int = 0  # of those, the tokens their slots held already (not fed)
    checks: int = 0  # (sequence, step) pairs that checked guesses: accepted / checks is the accepted depth


class Scheduler:
    """Waiting and running generations on ``conv``'s program, holding KV-cache slots taken from ``slots``."""

    def __init__(self, conv: Convention, slots: SlotTable, now: Callable[[], float] = time.perf_counter,
                 copies: bool = False) -> None:
        self.conv, self.slots, self.now = conv, slots, now
        self.copies = copies  # the program copies cache positions between slots (pyrt.llm.kv_copy)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order
        self.by_id: dict[int, Sequence] = {}  # every waiting or running sequence
        self.counters = Counters()

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> Sequence:
        self.waiting.append(seq)
        self.by_id[seq.id] = seq
        return seq

    def admit(self) -> list[Sequence]:
        """Waiting sequences moved to running, first come first, each as a slot is free for it (a front end's
        reservation, or the shared slots); one that ``reuses`` takes the slot holding the longest prefix of its
        prompt and starts feeding after it."""
        admitted = []
        for seq in list(self.waiting):
            slot = self.slots.take(seq.front, seq.prompt if seq.reuses else None)
            if slot is None:
                continue
            self.waiting.remove(seq)
            seq.slot = slot
            if seq.reuses:
                seq.fed = seq.cached = self.slots.reusable(slot, seq.prompt)
                self.counters.prefix_queries += len(seq.prompt)
                self.counters.prefix_hits += seq.cached
            self.running.append(seq)
            admitted.append(seq)
        return admitted

    def catch_up(self) -> list[Copy]:
        """Copies that bring each prefilling sequence that ``reuses`` up to the longest prefix of its prompt a running
        sequence's slot holds written and kept (positions before its ``fed``: never one being written), in admission
        order (a copy may read what an earlier one wrote); none when the program cannot copy. Each sequence's ``fed``
        and ``cached`` count the copied positions from now (the core runs the copies before the step's run)."""
        if not self.copies:
            return []
        out = []
        for seq in self.running:
            if seq.new or not seq.reuses:
                continue
            limit, best, source = len(seq.prompt) - 1, seq.fed, None
            for other in self.running:
                if other is not seq and other.fed > best:
                    held = kept_prefix(other.context[:other.fed], seq.prompt, limit)
                    if held > best:
                        best, source = held, other
            if source is not None:
                assert seq.slot is not None and source.slot is not None  # running sequences hold a slot
                out.append(Copy(seq.id, source.slot, seq.slot, seq.fed, best))
                self.counters.prefix_hits += best - seq.fed
                seq.cached += best - seq.fed
                seq.fed = best
        return out

    def copy_failed(self, copies: Seq[Copy], error: BaseException) -> list[Update]:
        """The copies did not run: their sequences end with ``error``, their slots remembering what they held
        before (the positions the copies were to write are not remembered)."""
        seqs = []
        for copy in copies:
            seq = self.by_id.get(copy.seq_id)
            if seq is not None:
                seq.fed = min(seq.fed, copy.start)
                if seq not in seqs:
                    seqs.append(seq)
        return self.fail_sequences(seqs, error)

    def waits(self, seq: Sequence) -> bool:
        """Whether prefilling ``seq`` leaves its next prompt positions to a sequence admitted before it that is still
        prefilling the same tokens (a copy brings them over once written): only where the program copies."""
        if not self.copies or not seq.reuses or seq.new:
            return False
        limit = len(seq.prompt) - 1
        for other in self.running:
            if other is seq:
                return False
            if not other.new and kept_prefix(other.prompt, seq.prompt, limit) > seq.fed:
                return True
        return False

    def schedule(self, proposals: Mapping[int, Proposal] | None = None) -> list[Feed]:
        """This step's feeds: decoding sequences first (what they have not written yet, then the guesses of their
        proposal, by sequence id), then prompt chunks in admission order, within the program's token budget and
        logits rows per step (guesses past :meth:`guess_room`'s are dropped)."""
        budget, rows = self.conv.tokens_per_step, self.conv.max_rows
        rooms = {seq.id: k for seq, k in self.guess_room()} if proposals else {}
        feeds: list[Feed] = []
        for seq in self.running:
            if seq.new and budget > 0:
                assert seq.slot is not None  # running sequences hold a slot
                proposal = (proposals or {}).get(seq.id)
                proposal = None if proposal is None else proposal.head(rooms.get(seq.id, 0))
                guesses = () if proposal is None else proposal.tokens
                feeds.append(Feed(seq.id, seq.slot, (seq.new[-1], *guesses), seq.next_position, 1 + len(guesses),
                                  seq.request, tuple(seq.new), proposal if guesses else None))
                budget, rows = budget - 1 - len(guesses), rows - 1 - len(guesses)
        for seq, chunk, ends in self._prompt_chunks(budget, rows):
            assert seq.slot is not None
            wants = seq.request.params.prompt_logprobs is not None
            feeds.append(Feed(seq.id, seq.slot, chunk, seq.fed, len(chunk) if wants else int(ends), seq.request))
        return feeds

    def guess_room(self) -> list[tuple[Sequence, int]]:
        """How many tokens each decoding sequence may guess this step (those that may guess at least one): at most
        its ``max_guesses`` and :func:`guess_cap`, shared out one at a time in admission order within the step's
        token budget and logits rows less the decoding tokens' own, a row for each prompt being prefilled, and the
        prompt tokens still to feed up to half the budget's rest (prompts are never starved; guesses not taken go
        to them)."""
        decoding = [seq for seq in self.running if seq.new]
        prefilling = [seq for seq in self.running if not seq.new]
        spare = self.conv.tokens_per_step - len(decoding)
        pending = sum(len(seq.prompt) - seq.fed for seq in prefilling)
        tokens = spare - min(pending, spare // 2)
        rows = self.conv.max_rows - len(decoding) - len(prefilling)
        caps = [0 if seq.constrained else min(seq.max_guesses, guess_cap(seq, self.conv)) for seq in decoding]
        shares = share_out(caps, min(tokens, rows))
        return [(seq, k) for seq, k in zip(decoding, shares, strict=True) if k > 0]

    def _prompt_chunks(self, budget: int, rows: int) -> list[tuple[Sequence, tuple[int, ...], bool]]:
        """(sequence, the prompt tokens it feeds, whether they end its prompt) in admission order, within ``budget``;
        a sequence that wants its prompt's log-probabilities feeds at most the logits ``rows`` left (a row each,
        one kept for each prompt after it)."""
        out = []
        prefilling = [seq for seq in self.running if not seq.new and not self.waits(seq)]
        for i, seq in enumerate(prefilling):
            if budget <= 0:
                break
            size = budget
            if seq.request.params.prompt_logprobs is not None:
                size = min(size, max(1, rows - (len(prefilling) - i - 1)))
            chunk = tuple(seq.prompt[seq.fed:seq.fed + size])
            ends = seq.fed + len(chunk) == len(seq.prompt)
            out.append((seq, chunk, ends))
            budget -= len(chunk)
            rows -= len(chunk) if seq.request.params.prompt_logprobs is not None else int(ends)
        return out

    def update(self, feeds: Seq[Feed], outcomes: Seq[Outcome]) -> list[Update]:
        """Apply a step's outcomes: new tokens, cache positions, and the generations that end."""
        self.counters.steps += 1
        self.counters.occupancy[len(feeds)] += 1
        updates = []
        for feed, outcome in zip(feeds, outcomes, strict=True):
            seq = self.by_id[feed.seq_id]
            if not seq.new:
                self.counters.prompt_tokens += len(feed.tokens)
            seq.fed = feed.start + outcome.kept
            seq.prompt_logprobs.extend(outcome.prompt_logprobs)
            if feed.guesses:
                accepted = outcome.kept - (len(feed.tokens) - len(feed.guesses))
                seq.drafted, seq.accepted = seq.drafted + len(feed.guesses), seq.accepted + accepted
                self.counters.drafted += len(feed.guesses)
                self.counters.accepted += accepted
                self.counters.checks += 1
            if outcome.tokens:
                seq.passes += 1
                self.counters.passes += 1
                updates.append(self._append(seq, outcome.tokens, outcome.logprobs, outcome.finished))
        return updates

    def fail(self, feeds: Seq[Feed], error: BaseException) -> list[Update]:
        """A step's run failed: the generations it carried end with ``error`` (the others go on)."""
        return self.fail_sequences([self.by_id[feed.seq_id] for feed in feeds], error)

    def fail_sequences(self, seqs: Seq[Sequence], error: BaseException) -> list[Update]:
        """``seqs`` end with ``error`` (a run that carried them failed), their slots freed."""
        updates = []
        for seq in seqs:
            seq.clock.end = self.now()
            self._release(seq)
            updates.append(Update(seq.id, at=seq.clock.end, error=error))
        return updates

    def abort(self, seq_id: int, reason: FinishReason) -> Update | None:
        """End generation ``seq_id`` now with ``reason``, its tokens kept; its update (None: it ended already)."""
        seq = self.by_id.get(seq_id)
        return None if seq is None else self._end(seq, (), reason)

    def abort_all(self, reason: FinishReason, front: int | None = None) -> list[Update]:
        """End every generation (of front end ``front``, when given) with ``reason``."""
        return [self._end(seq, (), reason) for seq in [*self.waiting, *self.running]
                if front is None or seq.front == front]

    def _append(self, seq: Sequence, tokens: tuple[int, ...], logprobs: tuple[TokenLogprob, ...] = (),
                finished: bool = False) -> Update:
        """``tokens`` added to ``seq`` up to the first that ends it (``finished``: its grammar ends after the last);
        its update."""
        now = self.now()
        prompt_logprobs = tuple(seq.prompt_logprobs) if not seq.new else ()
        if not seq.new:
            seq.clock.prefilled = now
        taken = []
        for i, token in enumerate(tokens):
            seq.new.append(token)
            taken.append(token)
            if logprobs:
                seq.logprobs.append(logprobs[i])
            self.counters.tokens_generated += 1
            if len(seq.new) == 1:
                seq.clock.first = self.now()
            reason = finish_reason(seq, self.conv, finished and i == len(tokens) - 1)
            if reason is not None:
                return replace(self._end(seq, tuple(taken), reason, logprobs[:len(taken)]),
                               prompt_logprobs=prompt_logprobs)
        return Update(seq.id, tuple(taken), now, logprobs=logprobs[:len(taken)], prompt_logprobs=prompt_logprobs)

    def _end(self, seq: Sequence, tokens: tuple[int, ...], reason: FinishReason,
             logprobs: tuple[TokenLogprob, ...] = ()) -> Update:
        seq.clock.end = self.now()
        self._release(seq)
        return Update(seq.id, tokens, seq.clock.end, result=seq.result(reason), logprobs=logprobs)

    def _release(self, seq: Sequence) -> None:
        self.by_id.pop(seq.id, None)
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        if seq.slot is not None:  # its cache holds what it fed and kept (a step that failed kept nothing)
            self.slots.give_back(seq.front, seq.slot, seq.context[:seq.fed])
            seq.slot = None


def guess_cap(seq: Sequence, conv: Convention) -> int:
    """The most tokens ``seq`` may guess after its last one: the cache positions left after that token's, and
    ``max_new_tokens`` less the tokens it has and the one the target adds after the guesses.

    A step that checks k guesses writes the last token and the guesses at ``next_position .. next_position + k``
    and gives at most k + 1 new tokens. A tree of k guesses takes k + 1 rows of the slot too, but one path of it at
    most is kept: its size is not bounded by ``max_new_tokens`` (its depth is, by the draft: a path that runs past
    the cap is cut there, as any accepted run is).
    """
    room = conv.max_context_len - 1 - seq.next_position
    cap = seq.request.params.max_new_tokens
    if cap is not None:
        left = cap - len(seq.new) - 1
        room = min(room, left) if not seq.tree or left <= 0 else room  # a tree: one path of it is kept at most
    return max(room, 0)


def share_out(caps: Seq[int], total: int) -> list[int]:
    """``total`` units given one at a time to each in turn, none past its cap.

    >>> share_out([4, 1, 4], 7), share_out([4, 4], 3), share_out([2], 9)
    ([3, 1, 3], [2, 1], [2])
    """
    shares = [0] * len(caps)
    total = max(total, 0)
    while total > 0:
        open_ = [i for i, cap in enumerate(caps) if shares[i] < cap]
        if not open_:
            break
        for i in open_[:total]:
            shares[i] += 1
        total -= min(total, len(open_))
    return shares


def finish_reason(seq: Sequence, conv: Convention, finished: bool = False) -> FinishReason | None:
    """Why ``seq`` ends after its newest token, or None: EOS, a stop sequence, its grammar complete (``finished``), its
    cap, a full cache."""
    request, new = seq.request, seq.new
    if new[-1] in request.eos_ids or any(new[-len(s):] == list(s) for s in request.params.stop if len(s) <= len(new)):
        return "stop"
    if finished:
        return "stop"
    cap = request.params.max_new_tokens
    if cap is not None and len(new) >= cap:
        return "length"
    if seq.next_position >= conv.max_context_len:
        return "cache_full"
    return None
