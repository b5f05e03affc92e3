"""Logits processors, min-p, log-probabilities and signed seeds of ``SamplingParams``, against ``transformers``.

The processors are checked row by row against ``transformers``' own logits processors (no export),
then end to end: greedy generation with a penalty, a bias or ``min_tokens`` on an exported Llama
equals ``model.generate`` with the same processor, with and without a draft (speculative
verification applies them to each row with the guesses before it), and the log-probabilities a
generation reports are the log-softmax of the model's logits after temperature.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import pyrt
from pyrt.errors import InputError
from pyrt.llm.params import SamplingParams
from pyrt.llm.processors import History, process, token_logprobs
from pyrt.llm.sampling import probabilities
from tests.fixtures import llm_models as L

transformers = pytest.importorskip("transformers")
VOCAB = 50


def rows(seed: int, n: int = 6) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 3, (n, VOCAB)).astype(np.float32)


def hf(processor: Any, ids: list[int], row: np.ndarray) -> np.ndarray:
    out = processor(torch.tensor([ids]), torch.tensor(row[None], dtype=torch.float64))
    return out[0].numpy()


@pytest.mark.parametrize("seed", range(4))
def test_each_processor_is_transformers_own(seed: int) -> None:
    g = transformers.generation.logits_process
    prompt, new = [3, 9, 9, 12], [40, 3, 7]
    h = History(tuple(prompt), tuple(new), frozenset({7, 8}))
    for row in rows(seed):
        np.testing.assert_allclose(process(row, SamplingParams(repetition_penalty=1.7), h),
                                   hf(g.RepetitionPenaltyLogitsProcessor(1.7), prompt + new, row), rtol=1e-12)
        bias = {3: 2.5, 11: -100.0}
        np.testing.assert_allclose(process(row, SamplingParams(logit_bias=bias), h),
                                   hf(g.SequenceBiasLogitsProcessor({(k,): v for k, v in bias.items()}),
                                      prompt + new, row), rtol=1e-12)
        masked = process(row, SamplingParams(min_tokens=4), h)
        want = hf(g.MinNewTokensLengthLogitsProcessor(len(prompt), 4, [7, 8]), prompt + new, row)
        assert np.array_equal(np.isinf(masked), np.isinf(want)) and np.isinf(masked[[7, 8]]).all()
        assert np.array_equal(process(row, SamplingParams(min_tokens=3), h), row)  # 3 new tokens: no mask


def test_frequency_and_presence_penalties_are_openais() -> None:
    row, new = rows(9)[0].astype(np.float64), (4, 4, 4, 10)
    got = process(row, SamplingParams(frequency_penalty=0.5, presence_penalty=-1.0), History((4, 20), new))
    want = row.copy()
    want[4] -= 3 * 0.5 - 1.0
    want[10] -= 0.5 - 1.0
    np.testing.assert_allclose(got, want)  # the prompt's 20 is not counted: OpenAI counts the output


@pytest.mark.parametrize("min_p", [0.05, 0.2, 0.6])
def test_min_p_is_transformers_warper(min_p: float) -> None:
    warper = transformers.generation.logits_process.MinPLogitsWarper(min_p)
    for row in rows(3):
        got = probabilities(row, min_p=min_p)
        want = torch.softmax(torch.tensor(hf(warper, [1], row)), -1).numpy()
        np.testing.assert_allclose(got, want, atol=1e-12)


def test_logprobs_are_the_log_softmax_after_temperature_with_the_top_alternatives() -> None:
    row = rows(5)[0]
    out = token_logprobs(row, 17, SamplingParams(do_sample=True, temperature=0.5, logprobs=3))
    want = torch.log_softmax(torch.tensor(row, dtype=torch.float64) / 0.5, -1).numpy()
    assert out.token == 17 and abs(out.logprob - want[17]) < 1e-12
    assert [t for t, _ in out.top] == list(np.argsort(-want)[:3]) and abs(out.top[0][1] - want.max()) < 1e-12


def test_bounds_are_checked_once_naming_the_field() -> None:
    for kwargs, field in [({"presence_penalty": 2.5}, "presence_penalty"),
                          ({"frequency_penalty": -3}, "frequency_penalty"),
                          ({"repetition_penalty": 0.0}, "repetition_penalty"), ({"min_p": 1.5}, "min_p"),
                          ({"logit_bias": {5: 101}}, "logit_bias"), ({"logit_bias": {-1: 1}}, "logit_bias"),
                          ({"min_tokens": -1}, "min_tokens"), ({"logprobs": 21}, "logprobs"),
                          ({"seed": 1 << 64}, "seed"), ({"grammar": object()}, "grammar")]:
        with pytest.raises(InputError) as caught:
            SamplingParams(**kwargs)
        assert caught.value.field == field, (kwargs, caught.value)


@pytest.fixture(scope="module")
def llama() -> L.Exported:
    return L.batched("llama", "portable")


def hf_greedy(model: Any, prompt: list[int], n: int, **processors: Any) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, pad_token_id=0,
                             **{"eos_token_id": None, **processors})
    return [int(t) for t in out[0, len(prompt):]]


@pytest.mark.export
@pytest.mark.parametrize("draft", [None, "ngram"])
def test_greedy_with_processors_equals_transformers_generate(llama: L.Exported, draft: str | None) -> None:
    prompt, n = [5, 6, 7, 5, 6, 7, 5, 6], 20
    plain = hf_greedy(llama.model, prompt, n)
    eos = plain[2]  # a token greedy decoding gives early: min_tokens holds it off
    cases = [({"repetition_penalty": 1.8}, {"repetition_penalty": 1.8}),
             ({"logit_bias": {eos: 4.0, 9: -100}}, {"sequence_bias": {(eos,): 4.0, (9,): -100.0}}),
             ({"min_tokens": 6, "eos_ids": [eos]}, {"min_new_tokens": 6, "eos_token_id": eos})]
    with pyrt.Program(llama.path) as prog:
        for ours, theirs in cases:
            want = hf_greedy(llama.model, prompt, n, **theirs)
            assert want != plain and len(want) > 3, ours  # the processor changes the tokens (the test can fail)
            kwargs = {"eos_ids": [], **ours}
            got = pyrt.generate(prog, prompt, max_new_tokens=n, draft=draft, draft_tokens=3, **kwargs).tokens
            assert got == want, (ours, got, want)


@pytest.mark.export
def test_generation_logprobs_match_transformers_logits(llama: L.Exported) -> None:
    prompt, n = [5, 6, 7, 8], 8
    with pyrt.Program(llama.path) as prog:
        out = pyrt.generate(prog, prompt, max_new_tokens=n, eos_ids=[], do_sample=True, temperature=0.7, seed=-5,
                            logprobs=2)
        again = pyrt.generate(prog, prompt, max_new_tokens=n, eos_ids=[], do_sample=True, temperature=0.7,
                              seed=(1 << 64) - 5)
    assert again.tokens == out.tokens  # a negative seed draws as its two's-complement bits
    with torch.no_grad():
        logits = llama.model(torch.tensor([prompt + out.tokens])).logits[0].double()
    logs = torch.log_softmax(logits / 0.7, -1).numpy()
    assert out.logprobs is not None and len(out.logprobs) == n
    for j, item in enumerate(out.logprobs):
        row = logs[len(prompt) - 1 + j]
        assert item.token == out.tokens[j] and abs(item.logprob - row[item.token]) < 1e-4, (j, item)
        assert [t for t, _ in item.top] == list(np.argsort(-row)[:2])
    assert out.cumulative_logprob == pytest.approx(sum(i.logprob for i in out.logprobs))


@pytest.mark.export
@pytest.mark.parametrize("budget", ["whole", "chunked"])
def test_prompt_logprobs_match_transformers_logits(llama: L.Exported, budget: str) -> None:
    """Every prompt token's log-probability (the first: None), the prompt prefilled in chunks of the file's token
    budget (16) when it is longer, beside other sequences; the generated tokens are unchanged."""
    prompt = list(range(5, 41)) if budget == "chunked" else [5, 6, 7, 8, 9]
    with pyrt.Program(llama.path) as prog:
        plain = pyrt.generate(prog, [prompt, [3, 4]], max_new_tokens=4, eos_ids=[])
        got = pyrt.generate(prog, [prompt, [3, 4]], max_new_tokens=4, eos_ids=[], prompt_logprobs=2, logprobs=0)
    assert [r.tokens for r in got] == [r.tokens for r in plain]
    with torch.no_grad():
        logs = torch.log_softmax(llama.model(torch.tensor([prompt])).logits[0].double(), -1).numpy()
    items = got[0].prompt_logprobs
    assert items is not None and len(items) == len(prompt) and items[0] is None
    for p in range(1, len(prompt)):
        assert items[p].token == prompt[p] and abs(items[p].logprob - logs[p - 1][prompt[p]]) < 1e-4, p
        assert [t for t, _ in items[p].top] == list(np.argsort(-logs[p - 1])[:2])
