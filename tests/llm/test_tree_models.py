"""Tree speculation on real architectures: pyrt's slot module that verifies trees, run eagerly as an engine's program
over tiny random transformers models (tests/fixtures/eager_slots.py), greedy tokens against transformers' own
greedy decoding, alone and as a batch, with a draft made by perturbing the target's matrices."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest

from pyrt.llm import Engine, SamplingParams
from pyrt.testing import archs
from tests.fixtures import eager_slots as E

PROMPTS = [[5, 6, 7, 8, 9], [11, 12], list(range(20, 40)), [3], [30, 31, 32]]
NEW = 12


@functools.cache
def target(name: str) -> Any:
    return archs.causal_lm(name)


@functools.cache
def wanted(name: str) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(archs.greedy(target(name), p, NEW)) for p in PROMPTS)


def run(engine: Engine, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    streams = [engine.submit(p, params) for p in prompts]
    while engine.pending:
        engine.step()
    assert all(s.error is None for s in streams), [s.error for s in streams]
    return [s.result.tokens for s in streams if s.result]


def test_a_tree_steps_logits_equal_transformers_for_every_node() -> None:
    """A prompt, then one step of a root and a tree of five guesses (siblings at one position): each node's logits are
    transformers' after the prompt and that node's path, whatever its siblings wrote."""
    import torch

    from pyrt.llm.rows import Placed, RowMap, feed_parents, tree_inputs

    model = target("llama")
    program = E.EagerSlots(model, slots=2)
    prompt, root = [5, 6, 7, 8], 9
    rows = RowMap(E.MAX_SEQ_LEN)
    placed = rows.place(0, len(prompt))
    program.run(*tree_inputs([Placed(1, 0, tuple(prompt), tuple(feed_parents(4, None, 0)), (), tuple(placed), 1)],
                             32))
    guesses, parents = (10, 11, 12, 13, 14), (-1, -1, 0, 0, 2)
    accepted = tuple(rows.rows)
    placed = rows.place(len(prompt), 1 + len(guesses))
    parents_in_feed = tuple(feed_parents(6, parents, 5))
    step = Placed(1, len(prompt), (root, *guesses), parents_in_feed, accepted, tuple(placed), 6)
    logits = program.run(*tree_inputs([step], 32))
    paths = [[root], [root, 10], [root, 11], [root, 10, 12], [root, 10, 13], [root, 10, 12, 14]]
    for row, path in zip(logits, paths, strict=True):
        with torch.no_grad():
            theirs = model(torch.tensor([prompt + path])).logits[0, -1].numpy()
        np.testing.assert_allclose(row, theirs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["llama", "qwen2", "gpt2"])
def test_greedy_with_a_tree_equals_transformers_alone_and_as_a_batch(name: str) -> None:
    llm, _ = E.loop(target(name), slots=4)
    draft, _ = E.loop(E.perturbed(target(name), 0.1), slots=4, tree=False, name="draft")  # an older file: chains
    engine = Engine(llm, draft=draft, draft_tokens=16, draft_tree=True)
    greedy = SamplingParams(max_new_tokens=NEW, eos_ids=())
    assert run(engine, PROMPTS[:1], greedy) == [list(wanted(name)[0])]
    assert run(engine, PROMPTS, greedy) == [list(w) for w in wanted(name)]
    stats = engine.stats()
    assert stats["drafted"] > 0 and 0 < stats["accepted"] < stats["drafted"]
