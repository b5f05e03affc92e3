"""Prefix caching across running generations against the stand-in program (tests/fixtures/stub_llm.py), in
milliseconds: a generation whose prompt begins with what a running generation's slot holds gets those positions
copied (``pyrt.llm.kv_copy``) instead of prefilling them, and one whose prefix is still being prefilled by a
generation admitted before it waits for it.

The stub's copy refuses a position never written or stale (what a generation is still writing reads as such), and
its logits come from what its cache really holds, so a wrong copy gives other tokens than the token-by-token
reference. After each test every free slot remembers exactly what the stub's cache holds there.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pyrt.llm import Engine, SamplingParams
from pyrt.llm.kv_copy import KvCopier
from tests.fixtures import stub_llm as S

GREEDY = SamplingParams(max_new_tokens=6, eos_ids=(), logprobs=2)
SYSTEM = list(range(3, 28))  # a 25-token system prompt: more than a prefill chunk of 16


def sampled(seed: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=6, do_sample=True, temperature=1.2, top_k=9, seed=seed, eos_ids=(),
                          logprobs=1)


def want(prompt: list[int], params: SamplingParams = GREEDY) -> list[int]:
    return S.reference(prompt, params, S.convention())




def logged(result: Any) -> np.ndarray:
    return np.array([t.logprob for t in result.logprobs])


def at_once(copies: bool, prompts: list[list[int]], params: list[SamplingParams]) -> tuple[list[Any], S.StubLM]:
    loop, lm = S.stub(slots=4, tokens_per_step=16, copies=copies, greedy_check=False)
    engine = Engine(loop)
    with engine.paused():
        handles = [engine.submit(p, q) for p, q in zip(prompts, params, strict=True)]
    for handle in handles:
        assert handle.wait(30) and handle.error is None, handle.error
    S.check_memory(loop, lm)
    return [h.result for h in handles], lm


def test_users_of_one_system_prompt_at_once_prefill_it_once_and_get_their_reference() -> None:
    prompts = [SYSTEM + [41 + i, 7] for i in range(4)]
    params = [GREEDY, sampled(1), sampled(2), GREEDY]
    on, lm = at_once(True, prompts, params)
    off, plain = at_once(False, prompts, params)
    for i, (a, b) in enumerate(zip(on, off, strict=True)):
        assert a.tokens == b.tokens == want(prompts[i], params[i]), i
        np.testing.assert_allclose(logged(a), logged(b), atol=1e-5, rtol=0)
    assert [r.cached_tokens for r in on] == [0, *[len(SYSTEM)] * 3]  # the first prefills, the others copy
    assert [r.cached_tokens for r in off] == [0] * 4
    assert sum(lm.calls) == sum(plain.calls) - 3 * len(SYSTEM)
    assert len(lm.calls) < len(plain.calls) and lm.copied


def test_n_generations_of_one_prompt_copy_all_but_its_last_token() -> None:
    prompt = SYSTEM + [41]
    params = [sampled(seed) for seed in (5, 6, 7)]
    on, lm = at_once(True, [prompt] * 3, params)
    assert [r.cached_tokens for r in on] == [0, len(prompt) - 1, len(prompt) - 1]
    for r, p in zip(on, params, strict=True):
        assert r.tokens == want(prompt, p)
    assert [r.tokens for r in on] == [r.tokens for r in at_once(False, [prompt] * 3, params)[0]]


def test_a_user_joining_mid_run_copies_what_the_running_slot_wrote_and_kept() -> None:
    loop, lm = S.stub(slots=4, tokens_per_step=16, copies=True, greedy_check=True)
    engine = Engine(loop)
    long = SamplingParams(max_new_tokens=12, eos_ids=())
    with engine.paused():
        first = engine.submit(SYSTEM + [41], long)
        for _ in range(4):  # its prompt (2 chunks, the first new token), then 2 new tokens
            engine.step()
        new = list(loop.core.scheduler.running[0].new)  # the core is paused: its state stands still
        assert len(new) == 3
        follow = SYSTEM + [41, *new[:2], 9]  # the last new token is not written yet: it is not copied
        late = engine.submit(follow, long)
        other = engine.submit(SYSTEM + [45], long)
    for handle, prompt in ((first, SYSTEM + [41]), (late, follow), (other, SYSTEM + [45])):
        assert handle.wait(30) and handle.result is not None
        assert handle.result.tokens == want(prompt, long)
    assert late.result.cached_tokens == len(SYSTEM) + 3 and other.result.cached_tokens == len(SYSTEM)
    S.check_memory(loop, lm)


def test_cancelling_the_generation_a_follower_waits_on_lets_the_follower_prefill_itself() -> None:
    loop, lm = S.stub(slots=4, tokens_per_step=16, copies=True, greedy_check=True)
    engine = Engine(loop)
    with engine.paused():
        lead = engine.submit(SYSTEM + [41], GREEDY)
        follow = engine.submit(SYSTEM + [42], GREEDY)
        engine.step()  # lead feeds 16, follow waits
        engine.step()  # follow copies 16 and waits again
        lead.cancel()
    assert lead.wait(30) and lead.result.finish_reason == "cancelled"
    assert follow.wait(30) and follow.result.tokens == want(SYSTEM + [42], GREEDY)
    assert follow.result.cached_tokens == 16
    S.check_memory(loop, lm)


def test_a_cancelled_follower_leaves_its_slot_remembering_what_was_copied() -> None:
    loop, lm = S.stub(slots=4, tokens_per_step=16, copies=True, greedy_check=True)
    engine = Engine(loop)
    with engine.paused():
        lead = engine.submit(SYSTEM + [41], GREEDY)
        follow = engine.submit(SYSTEM + [42], GREEDY)
        engine.step()
        engine.step()
        follow.cancel()
    assert follow.wait(30) and follow.result.finish_reason == "cancelled"
    slot = loop.core.slots
    assert any(len(slot.remembered(s)) == 16 for s in range(slot.size))  # the chunk copied, kept
    assert lead.wait(30) and lead.result.tokens == want(SYSTEM + [41], GREEDY)
    S.check_memory(loop, lm)
    second = Engine(loop)  # another front end on the program's slots
    again = second.submit(SYSTEM + [42], GREEDY)
    assert again.wait(30) and again.result.tokens == want(SYSTEM + [42], GREEDY)
    assert again.result.cached_tokens == len(SYSTEM)


def test_a_failed_copy_ends_its_generation_and_is_not_remembered() -> None:
    loop, lm = S.stub(slots=4, tokens_per_step=16, copies=True)

    def broken(method: str, size: int, runs: Any) -> int:
        raise RuntimeError("copy failed")

    lm.copy_state_rows = broken  # type: ignore[method-assign]
    engine = Engine(loop)
    with engine.paused():
        lead = engine.submit(SYSTEM + [41], GREEDY)
        follow = engine.submit(SYSTEM + [42], GREEDY)
    assert follow.wait(30) and isinstance(follow.error, RuntimeError)
    assert lead.wait(30) and lead.result.tokens == want(SYSTEM + [41], GREEDY)
    S.check_memory(loop, lm)


def test_without_exposed_state_nothing_is_copied_and_nobody_waits() -> None:
    loop, lm = S.stub(slots=4, tokens_per_step=16, copies=False)
    assert not KvCopier(lm, loop.core.conv).supported and not loop.core.scheduler.copies
    single, one = S.single()
    assert not single.core.runner.copies
    prompts = [SYSTEM + [41], SYSTEM + [42]]
    off, plain = at_once(False, prompts, [GREEDY, GREEDY])
    assert [r.cached_tokens for r in off] == [0, 0] and not plain.copied


def test_prefix_caching_off_copies_nothing() -> None:
    loop, lm = S.stub(slots=4, tokens_per_step=16, copies=True)
    engine = Engine(loop, prefix_caching=False)
    handles = engine.add_all([])  # nothing
    assert handles == []
    with engine.paused():
        handles = [engine.submit(SYSTEM + [41 + i], GREEDY) for i in range(3)]
    for i, handle in enumerate(handles):
        assert handle.wait(30) and handle.result.tokens == want(SYSTEM + [41 + i], GREEDY)
        assert handle.result.cached_tokens == 0
    assert not lm.copied
