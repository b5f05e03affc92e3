"""Prefix caching on real exported files: a tiny ``transformers`` Llama with 4 KV-cache slots (reference engines on
the simulated GPU) and a one-sequence GPT-2 (ExecuTorch's portable kernels). A generation that starts from the
positions a slot holds gives transformers' greedy tokens, the same seeded samples as without caching, and
log-probabilities within 1e-5 of those without."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import pyrt
from pyrt.llm import Engine, SamplingParams
from pyrt.sim import simulated_gpus
from pyrt.testing import archs
from tests.fixtures import llm_models as L
from tests.fixtures.eager_slots import as_tree

pytestmark = [pytest.mark.export]

BASE = list(range(10, 30))  # 20 tokens: more than one prefill chunk of the slot file's 16


@pytest.fixture(scope="module")
def llama() -> Iterator[Any]:
    exported = L.batched("llama", "reference")
    with simulated_gpus(1), pyrt.Program(exported.path) as prog:
        yield prog


def logged(result: Any) -> np.ndarray:
    return np.array([t.logprob for t in result.logprobs])


def test_a_conversation_on_a_slot_file_equals_transformers_and_runs_without_caching(llama: Any) -> None:
    model = archs.causal_lm("llama")
    cached, plain = Engine(llama), Engine(llama, prefix_caching=False)
    greedy = SamplingParams(max_new_tokens=4, eos_ids=(), logprobs=1)
    history = list(BASE)
    for turn in range(3):
        history += [40 + turn, 41 + turn]
        off = plain.submit(history, greedy)
        assert off.wait(120) and off.result is not None and off.result.cached_tokens == 0
        on = cached.submit(history, greedy)  # the same Program's slots: it finds the one plain just wrote
        assert on.wait(120) and on.result is not None
        assert on.result.tokens == off.result.tokens == archs.greedy(model, history, 4), turn
        assert on.result.cached_tokens == len(history) - 1  # plain's slot holds history and 3 of its new tokens
        np.testing.assert_allclose(logged(on.result), logged(off.result), atol=1e-5, rtol=0)
        history += on.result.tokens
    sampled = SamplingParams(max_new_tokens=5, do_sample=True, temperature=1.1, seed=3, eos_ids=(), logprobs=1)
    prompt = [*BASE, 7, 8]
    first = pyrt.generate(llama, prompt, max_new_tokens=5, do_sample=True, temperature=1.1, seed=3, eos_ids=[],
                          logprobs=1, prefix_caching=False)
    again = cached.submit(prompt, sampled)
    assert again.wait(120) and again.result is not None and again.result.cached_tokens == len(prompt) - 1
    assert again.result.tokens == first.tokens
    np.testing.assert_allclose(logged(again.result), logged(first), atol=1e-5, rtol=0)
    assert cached.stats()["prefix_cache_hits"] > 0


def test_a_prompt_differing_at_p_reuses_p_positions_of_a_real_cache(llama: Any) -> None:
    model = archs.causal_lm("llama")
    pyrt.generate(llama, BASE, max_new_tokens=2, eos_ids=[])
    for p in (3, 17):
        other = [*BASE[:p], 90, *BASE[p + 1:]]
        engine = Engine(llama)
        handle = engine.submit(other, max_new_tokens=4, eos_ids=())
        assert handle.wait(120) and handle.result is not None
        assert handle.result.cached_tokens == p and handle.result.tokens == archs.greedy(model, other, 4), p
        pyrt.generate(llama, BASE, max_new_tokens=2, eos_ids=[])  # the slot holds BASE again


def test_a_one_sequence_file_starts_from_what_its_slot_holds() -> None:
    exported = L.exported("gpt2", "portable")
    model = archs.causal_lm("gpt2")
    with pyrt.Program(exported.path) as prog:
        first = pyrt.generate(prog, BASE, max_new_tokens=4, eos_ids=[])
        follow = [*BASE, *first.tokens, 60, 61]
        again = pyrt.generate(prog, follow, max_new_tokens=4, eos_ids=[])
    assert first.tokens == archs.greedy(model, BASE, 4) and again.tokens == archs.greedy(model, follow, 4)
    assert again.cached_tokens == len(BASE) + 3  # the last new token was never fed


def test_a_run_of_the_program_outside_the_engine_makes_it_forget_what_slots_hold(llama: Any) -> None:
    model = archs.causal_lm("llama")
    pyrt.generate(llama, BASE, max_new_tokens=2, eos_ids=[])
    assert pyrt.generate(llama, BASE, max_new_tokens=2, eos_ids=[]).cached_tokens == len(BASE) - 1
    runs = llama.runs()
    for slot in range(L.SLOTS):  # a caller's own run writes position 0.. of every slot
        llama.run(*as_tree(([9, 9, 9], [slot] * 3, [0, 1, 2], [2], range(32))))
    assert llama.runs() == runs + L.SLOTS
    again = pyrt.generate(llama, BASE, max_new_tokens=4, eos_ids=[])
    assert again.cached_tokens == 0 and again.tokens == archs.greedy(model, BASE, 4)


def shared_prompt_at_once(prog: Any, caching: bool, params: list[SamplingParams], cancel: int | None = None
                          ) -> list[Any]:
    """Four users of BASE joining one step (the engine paused), each with its own question; ``cancel``: that one is
    cancelled after the first step (the leader the others copy from, when 0)."""
    engine = Engine(prog, prefix_caching=caching)
    with engine.paused():
        handles = [engine.submit([*BASE, 40 + i, 7], p) for i, p in enumerate(params)]
        if cancel is not None:
            engine.step()
            handles[cancel].cancel()
    for handle in handles:
        assert handle.wait(120) and handle.error is None, handle.error
    return [h.result for h in handles]


@pytest.mark.parametrize("kind", ["reference", "portable"])
def test_users_of_one_prompt_at_once_copy_a_running_slots_positions_and_equal_transformers(kind: str) -> None:
    model = archs.causal_lm("llama")
    exported = L.batched("llama", kind)
    greedy = SamplingParams(max_new_tokens=4, eos_ids=(), logprobs=1)
    params = [greedy, SamplingParams(max_new_tokens=4, do_sample=True, temperature=1.1, seed=3, eos_ids=(),
                                     logprobs=1), greedy, greedy]
    with simulated_gpus(1), pyrt.Program(exported.path) as prog:
        assert prog.state_sizes()  # the caches are the method's state: copied on the (simulated) device or host
        on = shared_prompt_at_once(prog, True, params)
        off = shared_prompt_at_once(prog, False, params)
        assert [r.cached_tokens for r in on] == [0, len(BASE), len(BASE), len(BASE)]
        for i, (a, b) in enumerate(zip(on, off, strict=True)):
            assert a.tokens == b.tokens, i
            if params[i] is greedy:
                assert a.tokens == archs.greedy(model, [*BASE, 40 + i, 7], 4), i
            np.testing.assert_allclose(logged(a), logged(b), atol=1e-5, rtol=0)
        cancelled = shared_prompt_at_once(prog, True, [greedy] * 4, cancel=0)  # the leader goes mid-prompt
        assert cancelled[0].finish_reason == "cancelled"
        for i, result in enumerate(cancelled[1:], 1):
            assert result.tokens == archs.greedy(model, [*BASE, 40 + i, 7], 4), i


def test_copying_state_rows_names_a_run_outside_the_caches_and_counts_the_tensors_it_copied_in() -> None:
    from pyrt.errors import InputError

    exported = L.batched("llama", "portable")
    with pyrt.Program(exported.path) as prog:
        size = L.SLOTS * 2 * (L.MAX_SEQ_LEN + 1)  # slots x kv heads x rows: the test Llama's caches
        assert size in prog.state_sizes()
        with pytest.raises(InputError, match="outside 392 rows"):
            prog.copy_state_rows("forward", size, [(size - 1, 0, 2)])
        assert prog.copy_state_rows("forward", size, [(0, 49, 3)]) == 4  # 2 layers' keys and values
        assert prog.copy_state_rows("forward", size + 1, [(0, 49, 3)]) == 0
        assert prog.runs() == 0  # a copy is not a run
