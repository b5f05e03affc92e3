"""A draft program: a second, smaller LLM file guessing the target's next tokens.

:class:`DraftModel` keeps, for every target sequence it guesses for, a KV-cache slot of the
draft program (taken from the drafter's own table of the draft's slots when the sequence first
guesses, given back when it ends) and the tokens written there. Each step it first brings the draft's cache up to
the sequence's tokens (after a check, the draft's cache keeps the prefix that the target kept:
the rest is rolled back, overwritten from there by the next feed), then guesses one token at a
time, every guessing sequence in one call of the draft per token: greedy picks the draft's
argmax, sampling draws from the draft's distribution after the request's temperature, top-k and
top-p (that distribution rides along for :func:`pyrt.llm.verify.verify`). A sequence for which
no draft slot is free, or whose tokens fill the draft's cache, guesses nothing that step. After
its catch-up each sequence feeds the draft :data:`WIDTH` tokens per call (the one to feed and the
one before it, written again), so that the draft's calls keep one shape (pyrt's runtime runs a
repeated shape on its fast path; a GPU replays one CUDA graph).

The draft must share the target's vocabulary, BOS and EOS ids (:func:`check_pair`). It runs as
loaded: :func:`pyrt.llm.drafting.open_draft` opens a file fully resident (no weight streaming).

>>> small = pyrt.Program("small.pte")                                          # doctest: +SKIP
>>> draft = DraftModel(small, engine_convention(small, "forward"), target_conv, "m.pte")  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pyrt.errors import InputError
from pyrt.llm.convention import SLOTS, Convention
from pyrt.llm.guesses import DraftQuery, Proposal
from pyrt.llm.params import SamplingParams
from pyrt.llm.processors import History, process
from pyrt.llm.request import Request
from pyrt.llm.runner import Runner
from pyrt.llm.sampling import NOTHING, distribution, draw, greedy_token, probabilities
from pyrt.llm.scheduler import Feed
from pyrt.llm.slots import SlotTable, kept_prefix
from pyrt.llm.tree import Acceptance, TreeGrower

WIDTH = 2  # tokens a sequence feeds the draft per call once caught up (its catch-up after a check: 1 or 2)


@dataclass
class DraftSlot:
    """One target sequence's place in the draft: its id and request, the draft's slot, what is written there."""

    id: int
    request: Request
    slot: int
    written: list[int] = field(default_factory=list)  # token ids at the draft cache's positions 0, 1, ...

    @property
    def fed(self) -> int:
        return len(self.written)


@dataclass
class _Guessing:
    query: DraftQuery
    place: DraftSlot
    room: int
    context: tuple[int, ...]
    tokens: list[int] = field(default_factory=list)
    probs: list[np.ndarray] = field(default_factory=list)


class DraftModel:
    """Guesses from the draft ``program`` (following ``conv``) for sequences of a target whose convention is ``target``
    (``owned``: this drafter opened ``program`` and closes it)."""

    def __init__(self, program: Any, conv: Convention, target: Convention, target_source: str,
                 owned: bool = False) -> None:
        self.program, self.conv, self.name = program, conv, str(program.source)
        check_pair(conv, target, self.name, target_source)
        self.runner = Runner(program, conv)
        self.slots = SlotTable(conv.slots, self.name)  # the draft's cache slots, this drafter's alone
        self._owned = owned
        self._places: dict[int, DraftSlot] = {}  # target sequence id -> its place in the draft
        self.acceptance = Acceptance()  # what shapes its trees, measured on the trees the target checked
        self._trees: dict[int, tuple[int, TreeGrower]] = {}  # target sequence id -> (its context then, last tree)

    def propose(self, rooms: Seq[tuple[DraftQuery, int]]) -> dict[int, Proposal]:
        """Up to ``room`` guesses per sequence, by sequence id (sequences left out guess nothing this step)."""
        items = []
        for query, room in rooms:
            context = query.context
            room = min(room, self.conv.max_context_len - len(context) + 1)  # the last guess needs no position
            place = self._place(query) if room > 0 else None
            if place is not None:
                del place.written[kept_prefix(place.written, context, len(context) - 1):]  # roll back
                items.append(_Guessing(query, place, room, context))
        if not items:
            return {}
        first = self._catch_up(items)
        trees = [(item, row) for item, row in zip(items, first, strict=True) if item.query.tree]
        grown = self._grow(trees) if trees else {}
        chains = [(item, row) for item, row in zip(items, first, strict=True) if not item.query.tree]
        if not chains:
            return grown
        items = [item for item, _ in chains]
        work, rows = items, [row for _, row in chains]
        while True:
            for item, row in zip(work, rows, strict=True):
                history = item.query.history().then(tuple(item.tokens))
                token, probs = choose(row, item.query.request.params, item.query.rng, history)
                item.tokens.append(token)
                if probs is not None:
                    item.probs.append(probs)
            work = [w for w in work if len(w.tokens) < w.room]
            if not work:
                break
            width = WIDTH if WIDTH * len(work) <= self.conv.tokens_per_step else 1  # slots <= the token budget
            rows = [r[-1] for r in self._run([self._tail(w.place, (*w.context, *w.tokens), width) for w in work])]
        return {**grown, **{w.query.id: Proposal(tuple(w.tokens), np.stack(w.probs) if w.probs else None)
                            for w in items}}

    def _grow(self, trees: list[tuple[_Guessing, np.ndarray]]) -> dict[int, Proposal]:
        """A best-first tree per sequence (:class:`~pyrt.llm.tree.TreeGrower`) of ``room`` guesses: each round adds
        every growing tree's best candidate and expands it, all of them in one call of the draft (each sequence's
        path fed from where its cache left the tree's last one)."""
        growers = []
        rates = self.acceptance.rates()
        for item, row in trees:
            before = self._trees.pop(item.query.id, None)
            if before is not None:  # the tree checked last: where the target's tokens went through it
                self.acceptance.observe(before[1], item.context[before[0]:])
            depth = self.conv.max_context_len - len(item.context)  # the deepest path the draft's cache holds
            cap = item.query.request.params.max_new_tokens
            if cap is not None:  # a longer path than the new tokens left (less the one after it) is cut
                depth = min(depth, cap - len(item.query.new) - 1)
            grower = TreeGrower(item.room, max_depth=max(depth, 1), rates=rates)
            self._trees[item.query.id] = (len(item.context), grower)
            grower.offer(-1, draft_probs(row, item.query.request.params, item.query.history()))
            growers.append((item, grower))
        while True:
            expand, added = [], False
            for item, grower in growers:
                node = grower.pop()
                added = added or node is not None
                if node is not None and not grower.full and grower.depths[node] < (grower.max_depth or 0) \
                        and grower.worth_expanding(node):
                    expand.append((item, grower, node))
            if not added:
                break
            paths = []
            for item, grower, node in expand:
                tokens = (*item.context, *grower.path(node))
                del item.place.written[kept_prefix(item.place.written, tokens, len(tokens) - 1):]  # roll back
                paths.append((item.place, tokens))
            for (item, grower, node), row in zip(expand, self._feed_paths(paths), strict=True):
                history = item.query.history().then(grower.path(node))
                grower.offer(node, draft_probs(row, item.query.request.params, history))
        return {item.query.id: grower.proposal() for item, grower in growers}

    def _feed_paths(self, paths: list[tuple[DraftSlot, tuple[int, ...]]]) -> list[np.ndarray]:
        """Each place's ``tokens`` fed from what it has written (as few calls as the draft's token budget allows,
        one per place on a one-sequence file); the draft's logits after each one's last token."""
        last: dict[int, np.ndarray] = {}
        while len(last) < len(paths):
            budget, feeds = self.conv.tokens_per_step, list[Feed]()
            for place, tokens in paths:
                if place.id in last or budget <= 0 or (feeds and self.conv.layout != SLOTS):
                    continue
                fed = min(place.fed, len(tokens) - 1)
                chunk = tokens[fed:fed + budget]
                feeds.append(Feed(place.id, place.slot, chunk, fed, int(fed + len(chunk) == len(tokens)),
                                  place.request))
                budget -= len(chunk)
            for feed, rows in zip(feeds, self._run(feeds), strict=True):
                if feed.logits:
                    last[feed.seq_id] = rows[-1]
        return [last[place.id] for place, _ in paths]

    def _place(self, query: DraftQuery) -> DraftSlot | None:
        place = self._places.get(query.id)
        if place is None:
            slot = self.slots.take(None)
            if slot is None:
                return None
            place = self._places[query.id] = DraftSlot(query.id, query.request, slot)
        return place

    def _catch_up(self, work: list[_Guessing]) -> list[np.ndarray]:
        """Feed each sequence's tokens the draft has not written (in chunks within the draft's token budget); the
        draft's logits after each sequence's last token, in ``work``'s order."""
        last: dict[int, np.ndarray] = {}
        while len(last) < len(work):
            budget = self.conv.tokens_per_step
            feeds: list[Feed] = []
            for w in work:
                if w.place.id in last or budget <= 0 or (feeds and self.conv.layout != SLOTS):
                    continue
                feed = self._tail(w.place, w.context)
                if len(feed.tokens) > budget:  # a chunk of what is not written yet: the last one gives the logits
                    fed = w.place.fed
                    chunk = w.context[fed:fed + budget]
                    feed = Feed(w.place.id, w.place.slot, chunk, fed, int(fed + len(chunk) == len(w.context)),
                                w.place.request)
                feeds.append(feed)
                budget -= len(feed.tokens)
            for feed, rows in zip(feeds, self._run(feeds), strict=True):
                if feed.logits:
                    last[feed.seq_id] = rows[-1]
        return [last[w.place.id] for w in work]

    def _tail(self, place: DraftSlot, tokens: tuple[int, ...], width: int = WIDTH) -> Feed:
        """A feed of ``tokens`` from what ``place`` has not written, but at least ``width`` of them (those before
        written again: the same tokens at the same positions), asking for the last one's logits."""
        start = max(0, min(place.fed, len(tokens) - width))
        return Feed(place.id, place.slot, tokens[start:], start, 1, place.request)

    def _run(self, feeds: list[Feed]) -> list[np.ndarray]:
        """One call of the draft (one per feed on a one-sequence file); what each feed wrote is recorded."""
        for feed in feeds:  # a failed call leaves a place's cache unknown: nothing of it counts as written
            place = self._places[feed.seq_id]
            del place.written[feed.start:]
        rows = self.runner.logits(feeds)
        for feed in feeds:
            self._places[feed.seq_id].written.extend(feed.tokens)
        return rows

    def release(self, seq_id: int) -> None:
        """Sequence ``seq_id`` ended: its draft slot goes back to the draft's pool."""
        self._trees.pop(seq_id, None)
        place = self._places.pop(seq_id, None)
        if place is not None:
            self.runner.end(seq_id)
            self.slots.give_back(None, place.slot)

    def close(self) -> None:
        """Every draft slot back to the pool (and the draft's Program closed, when this drafter opened it)."""
        for seq_id in list(self._places):
            self.release(seq_id)
        if self._owned:
            self._owned = False
            self.program.close()


def choose(row: np.ndarray, params: SamplingParams, rng: np.random.Generator,
           history: History = NOTHING) -> tuple[int, np.ndarray | None]:
    """The draft's guess from its logits ``row`` and the distribution it was drawn from (None: greedy), after the
    same logits processors as the target's (a sequence of ``history``)."""
    scores = process(row, params, history)
    if not params.do_sample:
        return greedy_token(scores), None
    probs = distribution(scores, params)
    return draw(probs, rng), probs


def draft_probs(row: np.ndarray, params: SamplingParams, history: History = NOTHING) -> np.ndarray:
    """The draft's distribution after its logits ``row``, that a tree grows by: the request's after its logits
    processors (temperature 1 for greedy requests, whose draft ranks by probability all the same)."""
    scores = process(row, params, history)
    return distribution(scores, params) if params.do_sample else probabilities(scores)


def check_pair(draft: Convention, target: Convention, draft_source: str, target_source: str) -> None:
    """InputError naming what differs when ``draft`` cannot guess for ``target``: vocabulary, BOS, EOS ids."""
    pairs = (("vocab_size", draft.vocab_size, target.vocab_size), ("bos_id", draft.bos_id, target.bos_id),
             ("eos_ids", sorted(set(draft.eos_ids)), sorted(set(target.eos_ids))))
    differ = [f"{name} {mine!r} vs {theirs!r}" for name, mine, theirs in pairs if mine != theirs]
    if differ:
        raise InputError(f"draft {draft_source} does not fit target {target_source}: {'; '.join(differ)} (a draft "
                         "needs the target's vocabulary, BOS and EOS ids)", field="draft")


__all__ = ["DraftModel", "DraftSlot", "check_pair", "choose", "kept_prefix"]
