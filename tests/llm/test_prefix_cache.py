"""Prefix caching against the stand-in program (tests/fixtures/stub_llm.py), in milliseconds.

The stub computes each row's logits from what its cache really holds at the slot's positions (an unwritten or
stale position raises), so a generation that reused positions it should not have gives other tokens than the
token-by-token reference, or fails. After every test the slots' memory is checked against the stub's cache:
each free slot remembers exactly ids its cache holds.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import pyrt
from pyrt.errors import InputError
from pyrt.llm import Engine, SamplingParams
from pyrt.llm.config import GenerationConfig
from pyrt.llm.slots import SlotTable
from pyrt.llm.stepping import CoreLoop
from tests.fixtures import stub_llm as S

GREEDY = SamplingParams(max_new_tokens=6, eos_ids=())
SAMPLED = SamplingParams(max_new_tokens=6, do_sample=True, temperature=1.2, top_k=9, seed=11, eos_ids=())
SYSTEM = list(range(3, 23))  # a 20-token "system prompt"


def want(prompt: list[int], params: SamplingParams = GREEDY) -> list[int]:
    return S.reference(prompt, params, S.convention())




def run(engine: Engine, prompt: list[int], params: SamplingParams = GREEDY) -> Any:
    handle = engine.submit(prompt, params)
    assert handle.wait(30) and handle.error is None
    return handle.result


def fed_prompt_tokens(lm: S.StubLM, before: int) -> int:
    return sum(lm.calls[before:])


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "seeded"])
def test_a_conversation_prefills_only_its_newest_turn_and_gives_the_same_tokens(params: SamplingParams) -> None:
    loop, lm = S.stub(slots=2, tokens_per_step=8)
    off_loop, _ = S.stub(slots=2, tokens_per_step=8)
    engine, plain = Engine(loop), Engine(off_loop, prefix_caching=False)
    history, asked, found = list(SYSTEM), 0, 0
    for turn in range(3):
        history += [30 + turn, 31 + turn, 32 + turn]  # the user's message
        calls = len(lm.calls)
        result, without = run(engine, history, params), run(plain, history, params)
        asked, found = asked + len(history), found + result.cached_tokens
        assert result.tokens == without.tokens == want(history, params), turn
        assert without.cached_tokens == 0
        if turn:  # the slot holds the last turn's prompt and every new token but the last (never fed)
            assert result.cached_tokens == len(history) - 4, turn
            assert sum(lm.calls[calls:]) == 4 + len(result.tokens) - 1  # 4 prompt tokens, then one per step
        history += result.tokens
    stats = engine.stats()
    assert (stats["prefix_cache_queries"], stats["prefix_cache_hits"]) == (asked, found) and found > 0
    assert plain.stats()["prefix_cache_queries"] == 0
    S.check_memory(loop, lm)


def test_a_prompt_differing_at_position_p_reuses_at_most_p_positions() -> None:
    loop, lm = S.stub(slots=1)
    engine = Engine(loop)
    base = list(range(5, 30))
    run(engine, base)
    for p in (0, 1, 7, 24):
        other = [*base[:p], 49, *base[p + 1:]]
        result = run(engine, other)
        assert result.cached_tokens == p and result.tokens == want(other), p
        run(engine, base)  # the slot holds base again
    assert run(engine, base).cached_tokens == len(base) - 1  # the last prompt token is fed again for its logits
    assert run(engine, base[:3]).cached_tokens == 2
    S.check_memory(loop, lm)


def test_a_generation_takes_the_slot_with_the_longest_prefix_and_unrelated_ones_spread() -> None:
    loop, lm = S.stub(slots=3)
    engine = Engine(loop)
    prompts = [[7, 8, 9, 10, 11], [20, 21, 22, 23], [30, 31, 32]]
    for p in prompts:  # each takes the slot used least recently: one slot each
        assert run(engine, p).cached_tokens == 0
    for p in reversed(prompts):
        assert run(engine, [*p, 40]).cached_tokens == len(p)
    assert {loop.core.slots.remembered(s)[:3] for s in range(3)} == {tuple(p[:3]) for p in prompts}
    S.check_memory(loop, lm)


def test_pyrt_generate_and_engines_share_the_programs_slot_memory() -> None:
    loop, lm = S.stub(slots=2)
    first = pyrt.generate(loop, SYSTEM + [40], max_new_tokens=4, eos_ids=[])
    assert first.cached_tokens == 0
    again = pyrt.generate(loop, [SYSTEM + [41], SYSTEM + [40, 1]], max_new_tokens=4, eos_ids=[])
    assert [r.tokens for r in again] == [want(SYSTEM + [41], GREEDY)[:4], want(SYSTEM + [40, 1], GREEDY)[:4]]
    # its reservation took the slot holding SYSTEM for its first prompt; the second prefills in the other slot
    assert [r.cached_tokens for r in again] == [len(SYSTEM), 0]
    follow = SYSTEM + [41, *again[0].tokens[:2], 9]
    assert run(Engine(loop), follow).cached_tokens == len(SYSTEM) + 3
    off = pyrt.generate(loop, SYSTEM + [40], max_new_tokens=4, eos_ids=[], prefix_caching=False)
    assert off.cached_tokens == 0 and off.tokens == first.tokens
    with pytest.raises(InputError, match="prefix_caching=1 must be a bool"):
        pyrt.generate(loop, SYSTEM, max_new_tokens=4, prefix_caching=1)
    S.check_memory(loop, lm)


def test_a_cancelled_generation_leaves_its_slot_remembering_what_was_written() -> None:
    loop, lm = S.stub(slots=1, tokens_per_step=8)
    engine = Engine(loop)
    prompt = list(range(5, 30))  # 25 tokens: chunks of 8
    with engine.paused():
        handle = engine.submit(prompt, GREEDY)
        engine.step()
        engine.step()  # 16 prompt tokens written
        handle.cancel()
        assert handle.wait(30)
    assert loop.core.slots.remembered(0) == tuple(prompt[:16])
    S.check_memory(loop, lm)
    result = run(engine, prompt)
    assert result.cached_tokens == 16 and result.tokens == want(prompt)


class FailsOnce:
    """The stub, but its ``fail_at``-th call raises before writing anything (a run that failed)."""

    def __init__(self, lm: S.StubLM, fail_at: int) -> None:
        self.lm, self.fail_at, self.count, self.source = lm, fail_at, 0, lm.source

    def run(self, *inputs: Any, method: str = "forward") -> Any:
        self.count += 1
        if self.count == self.fail_at:
            raise RuntimeError("the run failed")
        return self.lm.run(*inputs, method=method)


def test_a_failed_step_is_not_remembered() -> None:
    from pyrt.llm.core import EngineCore

    conv = S.convention(slots=1, tokens_per_step=8)
    lm = S.StubLM(conv)
    loop = CoreLoop(EngineCore(FailsOnce(lm, 3), conv))
    engine = Engine(loop)
    prompt = list(range(5, 30))
    handle = engine.submit(prompt, GREEDY)
    assert handle.wait(30) and isinstance(handle.error, RuntimeError)
    assert loop.core.slots.remembered(0) == tuple(prompt[:16])  # the third chunk's call failed
    result = run(engine, prompt)
    assert result.cached_tokens == 16 and result.tokens == want(prompt)
    S.check_memory(loop, lm)


def test_a_one_sequence_file_reuses_its_one_slot() -> None:
    loop, lm = S.single(full=True, tokens=8)
    engine = Engine(loop)
    prompt = list(range(5, 25))
    run(engine, prompt)
    calls = len(lm.calls)
    result = run(engine, [*prompt, 30, 31])
    assert result.cached_tokens == len(prompt) and result.tokens == want([*prompt, 30, 31])
    assert lm.calls[calls] == 2  # the two new prompt tokens, in one call
    S.check_memory(loop, lm)


def test_prompt_logprobs_feed_the_whole_prompt_again() -> None:
    loop, lm = S.stub(slots=1)
    engine = Engine(loop)
    prompt = list(range(5, 25))
    run(engine, prompt)
    asks = SamplingParams(max_new_tokens=3, eos_ids=(), prompt_logprobs=1, logprobs=1)
    cached, plain = run(engine, prompt, asks), run(Engine(S.stub(slots=1)[0], prefix_caching=False), prompt, asks)
    assert cached.cached_tokens == 0 and cached.tokens == plain.tokens
    assert [None if t is None else t.logprob for t in cached.prompt_logprobs] == \
        [None if t is None else t.logprob for t in plain.prompt_logprobs]
    logged = SamplingParams(max_new_tokens=5, eos_ids=(), logprobs=2)
    hit, miss = run(engine, prompt, logged), run(Engine(S.stub(slots=1)[0], prefix_caching=False), prompt, logged)
    assert hit.cached_tokens == len(prompt) - 1 and hit.tokens == miss.tokens
    assert np.allclose([t.logprob for t in hit.logprobs], [t.logprob for t in miss.logprobs], atol=1e-5, rtol=0)
    S.check_memory(loop, lm)


def test_speculative_decoding_and_penalties_give_the_same_tokens_from_a_cached_prefix() -> None:
    loop, lm = S.stub(slots=2)
    engine = Engine(loop, draft="ngram", draft_tokens=3)
    prompt = [*SYSTEM, *SYSTEM[:6]]
    params = SamplingParams(max_new_tokens=8, eos_ids=(), repetition_penalty=1.3)
    first = run(engine, prompt, params)
    again = run(engine, [*prompt, *first.tokens, 44], params)
    plain = run(Engine(S.stub(slots=2)[0], draft="ngram", prefix_caching=False), [*prompt, *first.tokens, 44], params)
    assert again.cached_tokens >= len(prompt) and again.tokens == plain.tokens
    S.check_memory(loop, lm)


def test_concurrent_generations_of_one_prompt_each_get_their_reference() -> None:
    loop, lm = S.stub(slots=4, tokens_per_step=16)
    engine = Engine(loop)
    run(engine, SYSTEM + [40])
    with engine.paused():  # four join at once: one finds the cached prefix, the others prefill theirs
        handles = [engine.submit(SYSTEM + [41 + i], SAMPLED) for i in range(4)]
    for i, handle in enumerate(handles):
        assert handle.wait(30) and handle.result is not None
        assert handle.result.tokens == want(SYSTEM + [41 + i], SAMPLED)
    assert sorted(h.result.cached_tokens for h in handles) == [0, 0, 0, len(SYSTEM)]
    # a generation joining mid-run finds the prefix a finished one left, while others still run
    with engine.paused():
        longer = SamplingParams(max_new_tokens=20, eos_ids=())
        long_prompt = SYSTEM + [41, handles[0].result.tokens[0], 7]  # takes the slot that served SYSTEM + [41]
        long = engine.submit(long_prompt, longer)
        engine.step()
        late = engine.submit(SYSTEM + [42, 3], GREEDY)  # the slot that served SYSTEM + [42] is free
        engine.step()
    assert late.wait(30) and long.wait(30) and long.result.cached_tokens == len(SYSTEM) + 2
    assert late.result.cached_tokens == len(SYSTEM) + 1
    assert late.result.tokens == want(SYSTEM + [42, 3]) and long.result.tokens == want(long_prompt, longer)
    S.check_memory(loop, lm)


def test_the_option_is_checked_once_in_the_config() -> None:
    assert GenerationConfig().prefix_caching is True
    with pytest.raises(InputError, match="prefix_caching='no' must be a bool") as info:
        GenerationConfig(prefix_caching="no")
    assert info.value.field == "prefix_caching"


def test_the_slot_table_compares_tokens_and_takes_the_least_recently_used_among_equals() -> None:
    table = SlotTable(3, "m.pte")
    taken = [table.take(None, p) for p in ([1, 2, 3], [1, 2, 4], [9])]
    assert taken == [0, 1, 2]  # nothing remembered yet: the lowest
    for slot, prompt in zip(taken, ([1, 2, 3], [1, 2, 4], [9]), strict=True):
        table.give_back(None, slot, prompt)
    assert table.take(None, [1, 2, 4, 5]) == 1 and table.reusable(1, [1, 2, 4, 5]) == 3
    assert table.take(None, [1, 2, 7]) == 0 and table.reusable(0, [1, 2, 7]) == 2
    assert table.take(None, [8]) == 2 and table.reusable(2, [8]) == 0
    table.give_back(None, 0)  # nothing remembered
    assert table.remembered(0) == () and table.reusable(0, [1, 2, 3]) == 0


class Counted(S.StubLM):
    """The stub, counting its runs as :meth:`pyrt.Program.runs` does (from any caller)."""

    made = 0

    def run(self, *inputs: Any, method: str = "forward") -> Any:  # type: ignore[override]
        self.made += 1
        return super().run(*inputs, method=method)

    def runs(self, method: str = "forward") -> int:
        return self.made


def test_a_run_the_core_did_not_make_makes_it_forget_every_slot() -> None:
    from pyrt.llm.core import EngineCore

    conv = S.convention(slots=2)
    lm = Counted(conv)
    loop = CoreLoop(EngineCore(lm, conv))
    engine = Engine(loop)
    prompt = list(range(5, 25))
    assert run(engine, prompt).cached_tokens == 0 and run(engine, prompt).cached_tokens == len(prompt) - 1
    slot = next(s for s in range(2) if loop.core.slots.remembered(s))
    lm.run(np.array([9, 9]), np.array([slot, slot]), np.array([0, 1]), np.array([1]), np.arange(32))  # a caller's
    result = run(engine, prompt)
    assert result.cached_tokens == 0 and result.tokens == want(prompt)
    S.check_memory(loop, lm)
