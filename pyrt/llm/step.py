"""One forward call of an LLM program for the tokens several sequences feed it this step.

A :class:`Feed` is one sequence's share of a step: its slot, the tokens it feeds (a prompt chunk,
or the token it generated last) and the position of the first. :func:`run_step` turns the feeds
into the program's inputs -- ``tokens [T], slots [T], positions [T], rows [R], window [W]`` for a
slot-layout file (W: the step's largest position + 1, rounded up), ``tokens [1, seq], input_pos``
for a one-sequence file (one feed) -- runs it, and returns the last token's logits of each feed
that asks for them (float32 or wider, numpy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pyrt.llm.convention import SLOTS, Convention

WINDOW_STEP = 32
NUMPY_FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


@dataclass(frozen=True)
class Feed:
    """``tokens`` of the sequence in ``slot``, the first at position ``start``; ``logits``: return the last's."""

    slot: int
    tokens: tuple[int, ...]
    start: int
    logits: bool


def run_step(program: Any, conv: Convention, feeds: list[Feed]) -> list[np.ndarray]:
    """The logits rows (``[vocab]`` each) of the feeds that ask for them, in feed order."""
    if conv.layout == SLOTS:
        return _slots_step(program, conv, feeds)
    (feed,) = feeds  # a one-sequence file runs one sequence per call
    row = _single_step(program, conv, feed)
    return [row] if feed.logits else []


def _slots_step(program: Any, conv: Convention, feeds: list[Feed]) -> list[np.ndarray]:
    tokens = np.fromiter((t for f in feeds for t in f.tokens), np.int64)
    slots = np.repeat(np.fromiter((f.slot for f in feeds), np.int64), [len(f.tokens) for f in feeds])
    positions = np.concatenate([np.arange(f.start, f.start + len(f.tokens), dtype=np.int64) for f in feeds])
    ends = np.cumsum([len(f.tokens) for f in feeds]) - 1
    wanted = [int(e) for f, e in zip(feeds, ends, strict=True) if f.logits]
    rows = np.asarray(wanted or [0], np.int64)  # the program returns at least one row
    window = np.arange(_window(int(positions.max()) + 1, conv.max_context_len), dtype=np.int64)
    logits = _run(program, conv, (tokens, slots, positions, rows, window))
    return [logits[i] for i in range(len(wanted))]


def _window(needed: int, context: int) -> int:
    """The positions a step attends to: ``needed`` rounded up to a multiple of :data:`WINDOW_STEP` (at most the
    context), so that a generation changes the program's input shapes every WINDOW_STEP tokens, not every token
    (positions past a token's own are masked, whatever they hold)."""
    return min(-(-needed // WINDOW_STEP) * WINDOW_STEP, context)


def _single_step(program: Any, conv: Convention, feed: Feed) -> np.ndarray:
    ids = np.asarray([feed.tokens], dtype=np.int64)
    count = 1 if conv.start_position else len(feed.tokens)
    pos = np.arange(feed.start, feed.start + count, dtype=np.int64)
    logits = _run(program, conv, (ids, pos))
    row: np.ndarray = logits[-1]  # [1, seq, vocab] or the last position's [1, vocab], as rows of vocab
    return row


def _run(program: Any, conv: Convention, inputs: tuple[np.ndarray, ...]) -> np.ndarray:
    """The method's logits as ``[n, vocab]`` float rows (float32 when the program's are bfloat16)."""
    if conv.torch_io:  # a bfloat16 program runs on torch kernels: torch is imported already
        import torch

        out = program.run(*(torch.from_numpy(a) for a in inputs), method=conv.method)
        floats: np.ndarray = out.reshape(-1, conv.vocab_size).float().numpy()  # bf16 -> float32 is exact
        return floats
    rows = np.asarray(program.run(*inputs, method=conv.method)).reshape(-1, conv.vocab_size)
    return rows if rows.dtype in NUMPY_FLOATS else rows.astype(np.float32)  # ml_dtypes' bfloat16 (numpy kernels)
