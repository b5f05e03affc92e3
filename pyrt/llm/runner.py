"""One step on the program: a plan's feeds turned into the program's inputs, the run, the next tokens chosen.

:class:`Runner` owns each running sequence's sampler state (:class:`Sampler`: its random state,
seeded once from its request, and its grammar's matcher), made by :meth:`Runner.start` and dropped
by :meth:`Runner.end`; the plan's feeds are plain values. :meth:`Runner.run` builds
``tokens [T], slots [T], positions [T], rows [R], window [W]`` for a
slot-layout file (W: the step's largest position + 1, rounded up to :data:`WINDOW_STEP`), or
``tokens [1, seq], input_pos`` for a one-sequence file (one feed per step), runs the method,
and gives each feed its :class:`~pyrt.llm.scheduler.Outcome`: every fed token kept, and for a
feed that asks for logits, the token :func:`pyrt.llm.sampling.sample` draws from its last row
(float32 or wider, numpy) with the sequence's parameters and random state. A feed that carries
guesses (a :class:`~pyrt.llm.scheduler.Proposal`) has a row for its last token and one per guess:
:func:`pyrt.llm.verify.verify` keeps the guesses the target accepts and adds the token after them;
the rejected guesses' tokens are not kept (the next step overwrites their cache positions).
On a file that verifies trees (``conv.tree``) each slot's rows are a :class:`~pyrt.llm.rows.RowMap` (its
sequence's logical positions apart from rows, :mod:`pyrt.llm.rows`; a sequence fed from position 0 lets go of
every row its slot held, one fed from a later position keeps the rows of the positions before it, as a slot's
cache does), and a feed whose proposal is a tree is checked by
:func:`pyrt.llm.tree_verify.verify_tree`: the accepted path's rows stay, the others are free again.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from pyrt.llm.convention import SLOTS, Convention
from pyrt.llm.kv_copy import KvCopier
from pyrt.llm.processors import History, TokenLogprob, process, token_logprobs
from pyrt.llm.request import Request
from pyrt.llm.rows import Placed, RowMap, feed_parents, tree_inputs
from pyrt.llm.scheduler import Copy, Feed, Outcome
from pyrt.llm.tree_verify import verify_tree
from pyrt.llm.verify import verify

WINDOW_STEP = 32
NUMPY_FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


@dataclass
class Sampler:
    """One sequence's sampling state: ``rng`` (``numpy.random.default_rng`` of its seed) and its grammar's matcher."""

    rng: np.random.Generator
    matcher: Any = None  # structured output: the grammar's state (its allowed ids next; advanced per token)

    @classmethod
    def of(cls, request: Request) -> Sampler:
        grammar = request.params.grammar
        return cls(np.random.default_rng(request.params.numpy_seed), None if grammar is None else grammar.matcher())

    def history(self, request: Request, generated: tuple[int, ...]) -> History:
        """What the logits processors read for the next token after ``generated`` (the grammar's mask included)."""
        allowed = None if self.matcher is None else self.matcher.allowed(request.eos_ids)
        return History(request.prompt, generated, request.eos_ids, allowed)

    def chose(self, tokens: tuple[int, ...]) -> bool:
        """``tokens`` were chosen: the grammar advances over them; whether it is complete after them."""
        if self.matcher is None:
            return False
        for token in tokens:
            self.matcher.accept(token)
        return bool(self.matcher.finished)


class Runner:
    """Runs steps of ``conv``'s method on ``program``, sampling each sequence with its :class:`Sampler`."""

    def __init__(self, program: Any, conv: Convention) -> None:
        self.program, self.conv = program, conv
        self.samplers: dict[int, Sampler] = {}  # sequence id -> its sampler
        self.maps: dict[int, RowMap] = {}  # slot -> the rows its sequence holds (files that verify trees)
        self.copier = KvCopier(program, conv)

    @property
    def copies(self) -> bool:
        """Whether the program's caches can be copied between slots (:mod:`pyrt.llm.kv_copy`)."""
        return self.copier.supported

    def copy(self, copies: Seq[Copy]) -> None:
        """Each copy's positions from its source slot to its sequence's, in order, before this step's run. On a file
        that verifies trees the source's rows are those its :class:`RowMap` holds for the positions, the
        destination's the lowest free rows of its slot's map (placed as a feed's would be)."""
        for c in copies:
            src_rows: Seq[int] = range(c.start, c.end)
            dst_rows: Seq[int] = src_rows
            if self.conv.tree:
                held = self.maps.get(c.src)
                if held is not None and len(held.rows) >= c.end:
                    src_rows = held.rows[c.start:c.end]
                mine = self.maps.setdefault(c.dst, RowMap(self.conv.max_context_len, self.source))
                dst_rows = mine.place(c.start, c.end - c.start)
            self.copier.copy(c.src, c.dst, src_rows, dst_rows)

    def start(self, seq_id: int, request: Request) -> Sampler:
        """Sequence ``seq_id`` joins: its sampler, seeded now."""
        sampler = self.samplers[seq_id] = Sampler.of(request)
        return sampler

    def end(self, seq_id: int) -> None:
        """Sequence ``seq_id`` ended: its sampler goes."""
        self.samplers.pop(seq_id, None)

    def run(self, feeds: Seq[Feed]) -> list[Outcome]:
        """One forward call for ``feeds``; each feed's outcome, in order."""
        rows = self.logits(feeds)
        out = []
        for feed, logits in zip(feeds, rows, strict=True):
            if not feed.logits:
                out.append(Outcome(len(feed.tokens)))
                continue
            params, sampler = feed.request.params, self.samplers[feed.seq_id]
            if params.prompt_logprobs is not None and feed.prefill:
                out.append(prompt_outcome(feed, logits, sampler))
                continue
            guesses, probs = feed.guesses, None if feed.proposal is None else feed.proposal.probs
            history = sampler.history(feed.request, feed.generated)
            before = len(feed.tokens) - len(guesses)
            parents = None if feed.proposal is None else feed.proposal.parents
            if parents is not None:
                path, chosen = verify_tree(logits, guesses, parents, params, sampler.rng, history)
                kept = [*range(before), *(before + i for i in path)]
                logged = logprobs(logits[[0, *(1 + i for i in path)]], chosen, history, params) \
                    if params.logprobs is not None else ()
            else:
                accepted, chosen = verify(logits, guesses, probs, params, sampler.rng, history)
                kept = list(range(before + accepted))
                logged = logprobs(logits, chosen, history, params) if params.logprobs is not None else ()
            if self.conv.tree:
                self.maps[feed.slot].keep(kept)
            out.append(Outcome(len(kept), chosen, logged, finished=sampler.chose(chosen)))
        return out

    def logits(self, feeds: Seq[Feed]) -> list[np.ndarray]:
        """Per feed, its ``[feed.logits, vocab]`` rows (the logits of its last tokens), in feed order: one call of
        a slot file, or one call per feed of a one-sequence file."""
        if self.conv.layout == SLOTS:
            return self._slots_step(feeds)
        return [self._single_step(feed) for feed in feeds]

    def _tree_step(self, feeds: Seq[Feed]) -> list[np.ndarray]:
        """A step of a file that verifies trees: each feed's tokens at rows of its sequence's :class:`RowMap`."""
        placed, spans, used, rows = [], [], 0, 0
        for feed in feeds:
            held = self.maps.setdefault(feed.slot, RowMap(self.conv.max_context_len, self.source))
            writes = held.place(feed.start, len(feed.tokens))
            guess_parents = None if feed.proposal is None else feed.proposal.parents
            parents = feed_parents(len(feed.tokens), guess_parents, len(feed.guesses))
            placed.append(Placed(feed.slot, feed.start, feed.tokens, tuple(parents), tuple(held.rows[:feed.start]),
                                 tuple(writes), feed.logits))
            used = max(used, *held.rows)
            spans.append((rows, rows + feed.logits))
            rows += feed.logits
        logits = self._run(tree_inputs(placed, window_size(used + 1, self.conv.max_context_len)))
        return [logits[a:b] for a, b in spans]

    @property
    def source(self) -> str:
        return str(getattr(self.program, "source", ""))

    def _slots_step(self, feeds: Seq[Feed]) -> list[np.ndarray]:
        if self.conv.tree:
            return self._tree_step(feeds)
        tokens: list[int] = []
        slots: list[int] = []
        positions: list[int] = []
        rows: list[int] = []
        spans = []  # each feed's rows of the logits
        for feed in feeds:  # a step's inputs are a few dozen ints: lists, then one array each
            count, slot = len(feed.tokens), feed.slot
            tokens.extend(feed.tokens)
            slots.extend([slot] * count)
            positions.extend(range(feed.start, feed.start + count))
            spans.append((len(rows), len(rows) + feed.logits))
            rows.extend(range(len(tokens) - feed.logits, len(tokens)))
        window = window_size(max(positions) + 1, self.conv.max_context_len)
        inputs = (np.array(tokens, np.int64), np.array(slots, np.int64), np.array(positions, np.int64),
                  np.array(rows or [0], np.int64),  # the program returns at least one row
                  np.arange(window, dtype=np.int64))
        logits = self._run(inputs)
        return [logits[a:b] for a, b in spans]

    def _single_step(self, feed: Feed) -> np.ndarray:
        ids = np.asarray([feed.tokens], dtype=np.int64)
        count = 1 if self.conv.start_position else len(feed.tokens)
        pos = np.arange(feed.start, feed.start + count, dtype=np.int64)
        logits = self._run((ids, pos))  # [1, seq, vocab] or the last position's [1, vocab], as rows of vocab
        return logits[len(logits) - feed.logits:]

    def _run(self, inputs: tuple[np.ndarray, ...]) -> np.ndarray:
        """The method's logits as ``[n, vocab]`` float rows (float32 when the program's are bfloat16)."""
        conv = self.conv
        if conv.torch_io:  # a bfloat16 program runs on torch kernels: torch is imported already
            import torch

            out = self.program.run(*(torch.from_numpy(a) for a in inputs), method=conv.method)
            floats: np.ndarray = out.reshape(-1, conv.vocab_size).float().numpy()  # bf16 -> float32 is exact
            return floats
        rows = np.asarray(self.program.run(*inputs, method=conv.method)).reshape(-1, conv.vocab_size)
        return rows if rows.dtype in NUMPY_FLOATS else rows.astype(np.float32)  # ml_dtypes' bfloat16 (numpy kernels)


def prompt_outcome(feed: Feed, rows: np.ndarray, sampler: Sampler) -> Outcome:
    """A prompt chunk fed with a logits row per token: the log-probabilities of the prompt tokens those rows predict
    (row ``j``: the token after the chunk's ``j``-th), and, where the chunk ends the prompt, the first new token."""
    params = feed.request.params
    prompt = feed.request.prompt
    first = () if feed.start else (None,)
    after = range(feed.start + 1, min(feed.start + len(feed.tokens), len(prompt) - 1) + 1)
    alternatives = replace(params, logprobs=params.prompt_logprobs)
    logged = (*first, *(token_logprobs(rows[p - feed.start - 1], prompt[p], alternatives) for p in after))
    if feed.start + len(feed.tokens) < len(prompt):
        return Outcome(len(feed.tokens), prompt_logprobs=logged)
    history = sampler.history(feed.request, ())
    _, chosen = verify(rows[-1:], (), None, params, sampler.rng, history)
    tokens = logprobs(rows[-1:], chosen, history, params) if params.logprobs is not None else ()
    return Outcome(len(feed.tokens), chosen, tokens, logged, finished=sampler.chose(chosen))


def logprobs(rows: np.ndarray, chosen: tuple[int, ...], history: History, params: Any) -> tuple[TokenLogprob, ...]:
    """Each chosen token's log-probability (and alternatives) from the row it was chosen from: row ``j`` follows
    ``history`` and the chosen tokens before ``j``."""
    return tuple(token_logprobs(process(rows[j], params, history.then(chosen[:j])), token, params)
                 for j, token in enumerate(chosen))


def window_size(needed: int, context: int) -> int:
    """The positions a step attends to: ``needed`` rounded up to a multiple of :data:`WINDOW_STEP` (at most the
    context), so that a generation changes the program's input shapes every WINDOW_STEP tokens, not every token
    (positions past a token's own are masked, whatever they hold).

    >>> window_size(5, 48), window_size(40, 48)
    (32, 48)
    """
    return min(-(-needed // WINDOW_STEP) * WINDOW_STEP, context)
