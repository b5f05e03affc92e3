"""Tree speculative sampling is exact in distribution: on a 6-token stand-in model that verifies trees, the 2nd and
3rd tokens of thousands of seeded generations with a tree draft follow the distribution computed from the target's
own logits after its processors (chi-square), with a draft that disagrees often enough that paths are cut, siblings
tried and rejected, and residuals drawn. A verifier that always follows the first child fails the same test."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pyrt.llm import Engine, SamplingParams
from pyrt.llm.processors import History, process
from pyrt.llm.sampling import distribution
from tests.fixtures import stub_llm as S
from tests.fixtures import tree_stub as T
from tests.llm.test_speculative_sampling import PROMPT, VOCAB, chi_square_p

SEEDS = 2000
CASES = {"plain": {"temperature": 1.5}, "cut": {"temperature": 1.0, "top_k": 4, "top_p": 0.9},
         "processed": {"temperature": 1.2, "repetition_penalty": 1.5, "logit_bias": {3: 1.5}}}


def params(case: str, seed: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=4, do_sample=True, seed=seed, eos_ids=(), **CASES[case])


def generate_all(case: str, seeds: int = SEEDS) -> tuple[np.ndarray, dict[str, Any]]:
    """[seeds, 4] tokens of one generation per seed (all in one engine, trees of 6), and the engine's stats."""
    llm, _ = T.stub(slots=64, tokens_per_step=512, vocab=VOCAB, context=16)
    draft = S.stub(slots=64, tokens_per_step=512, vocab=VOCAB, context=16, salt=7, noise=0.8)[0]
    engine = Engine(llm, draft=draft, draft_tokens=6, draft_tree=True)
    with engine.paused():
        streams = [engine.submit(PROMPT, params(case, seed)) for seed in range(seeds)]
    while engine.pending:
        engine.step()
    assert all(s.error is None for s in streams)
    return np.array([s.result.tokens for s in streams if s.result]), engine.stats()


def exact(case: str, index: int) -> np.ndarray:
    """The distribution of the ``index``-th new token under the target alone (after its processors), over every
    path."""
    out = np.zeros(VOCAB)
    p0 = params(case, 0)

    def walk(prefix: list[int], weight: float) -> None:
        scores = process(S.logits_after(PROMPT + prefix, VOCAB), p0, History(tuple(PROMPT), tuple(prefix)))
        p = distribution(scores, p0)
        if len(prefix) == index:
            out[:] += weight * p
            return
        for token in np.flatnonzero(p):
            walk([*prefix, int(token)], weight * p[token])

    walk([], 1.0)
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_2nd_and_3rd_tokens_follow_the_targets_distribution(case: str) -> None:
    tokens, stats = generate_all(case)
    assert tokens.shape == (SEEDS, 4)
    assert 0 < stats["accepted"] < stats["drafted"] and 0 < stats["accepted_depth"] < 3, stats
    for index in (1, 2):
        p = chi_square_p(tokens[:, index], exact(case, index))
        assert p > 1e-4, (case, index, p)  # fixed seeds: the same p-value every run


def test_the_test_catches_a_verifier_that_follows_the_first_child(monkeypatch: pytest.MonkeyPatch) -> None:
    import pyrt.llm.runner as runner
    from pyrt.llm.tree_verify import children_of

    real = runner.verify_tree

    def first_child(rows: Any, guesses: Any, parents: Any, *rest: Any) -> Any:
        kids, node, path = children_of(parents), -1, []
        while kids.get(node):
            node = kids[node][0]
            path.append(node)
        last = real(rows[[node + 1]], (), (), *rest[:2], rest[2].then(tuple(guesses[i] for i in path)))[1]
        return tuple(path), (*(guesses[i] for i in path), *last)

    monkeypatch.setattr(runner, "verify_tree", first_child)
    tokens, _ = generate_all("plain", seeds=1000)
    assert min(chi_square_p(tokens[:, i], exact("plain", i)) for i in (1, 2)) < 1e-6
