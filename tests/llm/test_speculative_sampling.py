"""Speculative sampling is exact in distribution: on a 6-token stand-in model, the 2nd and 3rd tokens of thousands of
seeded generations with a draft follow the distribution computed from the target's own logits (chi-square), with a
draft that disagrees with the target often enough that guesses are both accepted and rejected (and resampled).
A verifier that keeps every guess fails the same test, so it can fail."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pyrt.llm import Engine, SamplingParams
from pyrt.llm.sampling import distribution
from tests.fixtures import stub_llm as S

VOCAB = 6
SEEDS = 3000
NOISE = 0.8  # the draft: the target's logits plus 0.8 times another model's
PROMPT = [0, 1, 2, 3, 4, 5, 0, 2, 4, 1, 3, 5]  # every token: prompt lookup always finds a match to guess from
CASES = {"plain": {"temperature": 1.5}, "cut": {"temperature": 1.0, "top_k": 4, "top_p": 0.9}}


def target() -> tuple[Any, Any]:
    return S.stub(slots=64, tokens_per_step=512, vocab=VOCAB, context=16)


def draft(kind: str) -> Any:
    if kind == "ngram":
        return "ngram"
    return S.stub(slots=64, tokens_per_step=512, vocab=VOCAB, context=16, salt=7, noise=NOISE)[0]


def params(case: str, seed: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=4, do_sample=True, seed=seed, eos_ids=(), **CASES[case])


def generate_all(kind: str | None, case: str, seeds: int = SEEDS) -> tuple[np.ndarray, dict[str, Any]]:
    """[seeds, 4] tokens of one generation per seed (all in one engine), and the engine's stats."""
    llm, _ = target()
    engine = Engine(llm, draft=None if kind is None else draft(kind), draft_tokens=3)
    with engine.paused():
        streams = [engine.submit(PROMPT, params(case, seed)) for seed in range(seeds)]
    while engine.pending:
        engine.step()
    return np.array([s.result.tokens for s in streams if s.result]), engine.stats()


def exact(case: str, index: int) -> np.ndarray:
    """The distribution of the ``index``-th new token (0-based) under the target alone, summed over every path."""
    out = np.zeros(VOCAB)

    def walk(prefix: list[int], weight: float) -> None:
        p = distribution(S.logits_after(PROMPT + prefix, VOCAB), params(case, 0))
        if len(prefix) == index:
            out[:] += weight * p
            return
        for token in np.flatnonzero(p):
            walk([*prefix, int(token)], weight * p[token])

    walk([], 1.0)
    return out


def chi_square_p(tokens: np.ndarray, probs: np.ndarray) -> float:
    """The chi-square test's p-value of ``tokens`` against ``probs`` (cells expecting fewer than 5 merged); a token
    of probability 0 seen at all gives 0.0."""
    from scipy import stats

    seen = np.bincount(tokens, minlength=VOCAB).astype(float)
    if seen[probs == 0].sum():
        return 0.0
    expected = probs * len(tokens)
    small = (expected < 5) & (probs > 0)
    keep = (expected >= 5)
    obs = np.append(seen[keep], seen[small].sum()) if small.any() else seen[keep]
    exp = np.append(expected[keep], expected[small].sum()) if small.any() else expected[keep]
    return float(stats.chisquare(obs, exp).pvalue)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("kind", ["program", "ngram"])
def test_the_2nd_and_3rd_tokens_follow_the_targets_distribution(kind: str, case: str) -> None:
    tokens, stats = generate_all(kind, case)
    assert tokens.shape == (SEEDS, 4)
    assert 0 < stats["accepted"] < stats["drafted"], stats  # guesses accepted, and rejected then resampled
    assert 0.05 < stats["acceptance_rate"] < 0.95, stats
    for index in (1, 2):
        p = chi_square_p(tokens[:, index], exact(case, index))
        assert p > 1e-4, (kind, case, index, p)  # fixed seeds: the same p-value every run


def test_the_test_catches_a_verifier_that_keeps_every_guess(monkeypatch: pytest.MonkeyPatch) -> None:
    import pyrt.llm.runner as runner

    real = runner.verify
    monkeypatch.setattr(runner, "verify", lambda rows, guesses, *a: (
        len(guesses), (*guesses, real(rows[-1:], (), *a)[1][-1])))
    tokens, _ = generate_all("program", "plain", seeds=1000)
    assert min(chi_square_p(tokens[:, i], exact("plain", i)) for i in (1, 2)) < 1e-6


def test_a_seed_gives_the_same_tokens_run_to_run() -> None:
    def once() -> list[list[int]]:
        llm, _ = S.stub(slots=4, vocab=VOCAB, context=16)
        engine = Engine(llm, draft=draft("program"), draft_tokens=3)
        with engine.paused():  # the same steps each run: a draft's guesses (and draws) depend on who shares them
            streams = [engine.submit(PROMPT, params("cut", seed)) for seed in range(8)]
        while engine.pending:
            engine.step()
        return [s.result.tokens for s in streams if s.result]

    first = once()
    assert first == once() and len({tuple(t) for t in first}) > 1
