"""The engine's parts against a stand-in program (tests/fixtures/stub_llm.py), in milliseconds: the pure
scheduler, the runner's inputs, the one stepping thread and the queues other threads use. Every generation is
compared with the stub's own token-by-token reference (greedy and seeded sampling)."""

from __future__ import annotations

import gc
import threading
from typing import Any

import numpy as np
import pytest

from pyrt.errors import BusyError, InputError
from pyrt.llm import Engine, SamplingParams, make_request
from pyrt.llm.scheduler import Outcome, Scheduler, Sequence
from pyrt.llm.slots import SlotPool
from tests.fixtures import stub_llm as S

PROMPTS = [[5, 6, 7, 8, 9], [11, 12], list(range(20, 40)), [3], [30, 31, 32], [40, 41, 42, 43], [44, 45, 46]]
GREEDY = SamplingParams(max_new_tokens=10, eos_ids=())


def want(prompt: list[int], params: SamplingParams = GREEDY, conv: Any = None) -> list[int]:
    return S.reference(prompt, params, conv or S.convention())


# -- the scheduler alone ---------------------------------------------------------------------------


def scheduler(slots: int = 2, budget: int = 8, context: int = 16) -> Scheduler:
    conv = S.convention(slots, budget, context=context)
    return Scheduler(conv, SlotPool(slots, "stub"), now=lambda: 0.0)


def add(sched: Scheduler, seq_id: int, prompt: list[int], **params: Any) -> Sequence:
    request = make_request(sched.conv, prompt, SamplingParams(**{"eos_ids": (), **params}))
    return sched.add(Sequence.of(seq_id, request))


def test_admission_is_first_come_while_slots_are_free() -> None:
    sched = scheduler(slots=2)
    seqs = [add(sched, i, [1, 2]) for i in range(3)]
    assert sched.admit() == seqs[:2] and [s.slot for s in seqs] == [0, 1, None] and list(sched.waiting) == seqs[2:]
    (update, waiting), _ = sched.abort(0, "cancelled"), None
    assert not waiting and update.result is not None and update.result.finish_reason == "cancelled"
    assert sched.admit() == [seqs[2]] and seqs[2].slot == 0  # the freed slot, reused


def test_decoding_sequences_go_first_and_prompts_are_chunked_within_the_budget() -> None:
    sched = scheduler(slots=2, budget=8)
    a = add(sched, 0, [1, 2, 3])
    sched.admit()
    sched.update(sched.schedule(), [Outcome(3, (9,))])
    b = add(sched, 1, list(range(10, 22)))  # 12 tokens, budget 8: two chunks
    sched.admit()
    feeds = sched.schedule()
    assert [(f.seq, f.tokens, f.start, f.logits) for f in feeds] == [(a, (9,), 3, 1), (b, tuple(range(10, 17)), 0, 0)]
    sched.update(feeds, [Outcome(1, (4,)), Outcome(7)])
    assert b.fed == 7 and not b.new and a.new == [9, 4]
    feeds = sched.schedule()
    assert [(f.tokens, f.start, f.logits) for f in feeds] == [((4,), 4, 1), (tuple(range(17, 22)), 7, 1)]
    assert sched.counters.prompt_tokens == 3 + 7


@pytest.mark.parametrize(("params", "tokens", "reason", "kept"), [
    ({"eos_ids": (7,)}, (5, 7, 8), "stop", [5, 7]),
    ({"stop": ((5, 6),)}, (5, 6, 8), "stop", [5, 6]),
    ({"max_new_tokens": 2}, (5, 6, 8), "length", [5, 6]),
    ({}, (5, 6, 7, 8, 9, 10, 11, 12, 13), "cache_full", [5, 6, 7, 8, 9, 10, 11, 12]),
])
def test_a_step_giving_several_tokens_ends_at_the_first_that_ends_the_generation(
        params: dict[str, Any], tokens: tuple[int, ...], reason: str, kept: list[int]) -> None:
    sched = scheduler(context=16)
    seq = add(sched, 0, list(range(1, 10)), **params)  # 9 prompt tokens: room for 8 new in 16 positions
    sched.admit()
    (update,) = sched.update(sched.schedule(), [Outcome(9, tokens)])
    assert update.result is not None and (update.result.finish_reason, update.result.tokens) == (reason, kept)
    assert list(update.tokens) == kept and seq.slot is None and sched.slots.free == 2


def test_an_outcome_that_keeps_some_fed_tokens_rewinds_the_cache_position() -> None:
    """A step that checked guesses keeps the ones accepted; the next feed overwrites the rest."""
    sched = scheduler()
    seq = add(sched, 0, [1, 2, 3])
    sched.admit()
    sched.update(sched.schedule(), [Outcome(3, (4,))])
    from pyrt.llm.scheduler import Feed

    guess = Feed(seq, (4, 5, 6, 7), 3, 4)  # the last token and three guesses
    sched.update([guess], [Outcome(2, (5, 9))])  # 4 and the guess 5 kept, then 9 (the model's own)
    assert seq.fed == 5 and seq.new == [4, 5, 9]
    assert [(f.tokens, f.start) for f in sched.schedule()] == [((9,), 5)]


def test_a_failed_step_ends_the_generations_it_carried_and_frees_their_slots() -> None:
    sched = scheduler()
    add(sched, 0, [1, 2])
    sched.admit()
    boom = RuntimeError("boom")
    (update,) = sched.fail(sched.schedule(), boom)
    assert update.error is boom and sched.slots.free == 2 and not sched.has_work


# -- the engine on the stub --------------------------------------------------------------------------


def test_many_generations_in_shared_steps_equal_their_references() -> None:
    llm, lm = S.stub(slots=4)
    engine = Engine(llm)
    sampled = SamplingParams(max_new_tokens=12, do_sample=True, temperature=1.3, top_k=8, seed=4, eos_ids=())
    streams = [engine.submit(p, GREEDY if i % 2 else sampled) for i, p in enumerate(PROMPTS)]
    while engine.pending:
        engine.step()
    for i, (p, s) in enumerate(zip(PROMPTS, streams, strict=True)):
        assert s.result is not None and s.result.tokens == want(p, GREEDY if i % 2 else sampled), i
    assert max(map(int, engine.stats()["occupancy"])) == 4 and llm.slots.free == 4
    assert max(lm.calls) <= 16


def test_iterating_a_generation_steps_the_engine_and_a_dropped_one_is_cancelled() -> None:
    llm, _ = S.stub(slots=2)
    engine = Engine(llm)
    kept, dropped = engine.submit(PROMPTS[0], GREEDY), engine.submit(PROMPTS[1], GREEDY)
    first = next(kept)
    assert first == want(PROMPTS[0])[0] and engine.running == 2
    del dropped
    gc.collect()
    assert engine.running == 1 and llm.slots.free == 1  # cancelled at once: nothing was stepping
    assert [first, *kept] == want(PROMPTS[0]) and kept.result is not None and llm.slots.free == 2


def test_cancel_keeps_the_tokens_so_far() -> None:
    llm, _ = S.stub(slots=2)
    engine = Engine(llm)
    stream = engine.submit(PROMPTS[0], GREEDY)
    engine.step()
    engine.step()
    engine.cancel(stream)
    assert stream.result is not None and stream.result.finish_reason == "cancelled"
    assert stream.result.tokens == want(PROMPTS[0])[:2] and stream.tokens == stream.result.tokens


def test_the_queue_bound_counts_generations_that_will_wait_for_a_slot() -> None:
    llm, _ = S.stub(slots=2)
    engine = Engine(llm, max_queued=1)
    taken = [engine.submit(p, GREEDY) for p in PROMPTS[:2]]  # the two free slots' takers, at the next step
    waits = engine.submit(PROMPTS[2], GREEDY)  # the queue's one place
    with pytest.raises(BusyError, match=r"1 generations already wait for one of 2 KV-cache slots \(max_queued=1\)"):
        engine.submit(PROMPTS[3], GREEDY)
    engine.step()  # two admitted: the bound holds the same, one still waits
    with pytest.raises(BusyError):
        engine.submit(PROMPTS[3], GREEDY)
    for s in (*taken, waits):
        s.wait()
    assert waits.result is not None and waits.result.tokens == want(PROMPTS[2])
    with pytest.raises(InputError, match="max_queued=-1 must be an int >= 0 or None"):
        Engine(llm, max_queued=-1)


def test_paused_holds_every_step_back() -> None:
    llm, lm = S.stub()
    engine = Engine(llm)
    with engine.paused():
        stream = engine.submit(PROMPTS[0], GREEDY)
        done = threading.Event()
        threading.Thread(target=lambda: (stream.wait(), done.set()), daemon=True).start()
        assert not done.wait(0.2) and lm.calls == []
    assert done.wait(30) and stream.result is not None and stream.result.tokens == want(PROMPTS[0])


def test_one_thread_runs_the_engine_while_others_submit_read_and_cancel() -> None:
    llm, _ = S.stub(slots=3)
    engine = Engine(llm)
    runner = threading.Thread(target=engine.run, daemon=True)
    runner.start()
    got: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def client(i: int) -> None:
        try:
            stream = engine.submit(PROMPTS[i], GREEDY)
            got[i] = list(stream)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    long = engine.submit(PROMPTS[0], SamplingParams(eos_ids=()))  # until the cache is full
    next(long)
    long.cancel()
    for t in threads:
        t.join(60)
    engine.stop()
    runner.join(5)  # at once: stop wakes a waiting loop
    assert not errors and not runner.is_alive()
    assert got == {i: want(p) for i, p in enumerate(PROMPTS)}
    assert long.wait(5) and long.result is not None and long.result.finish_reason == "cancelled"
    assert engine.pending == 0 and llm.slots.free == 3


def test_a_generation_that_has_ended_is_counted_in_the_stats_it_can_read() -> None:
    """The stats a caller reads once it holds its last token count that token (a server's stats route answered
    a client that had its whole answer with the counts of the step before)."""
    llm, _ = S.stub(slots=2)
    engine = Engine(llm)
    seen: list[tuple[bool, int, int]] = []
    streams = [engine.submit(p, GREEDY) for p in PROMPTS[:2]]
    for stream in streams:
        stream.on_update(lambda s=stream: seen.append((s.done, engine.stats()["tokens_generated"], len(s.tokens))))
    for stream in streams:
        stream.wait(30)
    total = sum(len(want(p)) for p in PROMPTS[:2])
    assert engine.stats()["tokens_generated"] == total and engine.stats()["free_slots"] == 2
    ends = [generated for done, generated, _ in seen if done]
    assert len(ends) == 2 and ends[-1] == total, seen


def test_close_cancels_everything_and_gives_the_slots_back() -> None:
    llm, _ = S.stub(slots=2)
    engine = Engine(llm)
    streams = [engine.submit(p, GREEDY) for p in PROMPTS[:3]]
    engine.step()
    engine.close()
    assert [s.result.finish_reason for s in streams if s.result] == ["cancelled"] * 3
    assert llm.slots.free == 2 and engine.pending == 0


def test_engines_sharing_a_pool_never_share_a_slot() -> None:
    llm, lm = S.stub(slots=3)
    first, second = Engine(llm), Engine(llm)
    a = [first.submit(p, GREEDY) for p in PROMPTS[:2]]
    b = [second.submit(p, GREEDY) for p in PROMPTS[2:5]]
    for _ in range(40):
        first.step()
        second.step()
    assert [s.result.tokens for s in a + b if s.result] == [want(p) for p in PROMPTS[:5]]
    assert llm.slots.free == 3 and np.all(lm.cache[:, 0] >= 0)


# -- pyrt.generate on the stub ------------------------------------------------------------------------


def test_generate_gives_one_result_per_prompt_each_its_reference() -> None:
    import pyrt

    llm, _ = S.stub(slots=4)
    results = pyrt.generate(llm, PROMPTS, max_new_tokens=10, eos_ids=[])  # 7 prompts, 4 slots
    assert [r.tokens for r in results] == [want(p) for p in PROMPTS] and llm.slots.free == 4
    sampled = pyrt.generate(llm, PROMPTS[:3], max_new_tokens=10, do_sample=True, temperature=0.8, seed=[3, 1, 4],
                            eos_ids=[])
    assert [r.tokens for r in sampled] == [
        want(p, SamplingParams(max_new_tokens=10, do_sample=True, temperature=0.8, seed=s, eos_ids=()))
        for p, s in zip(PROMPTS[:3], [3, 1, 4], strict=True)]


def test_generate_streams_and_refuses_at_once_when_every_slot_is_held() -> None:
    import pyrt

    llm, _ = S.stub(slots=1)
    stream = pyrt.generate(llm, PROMPTS[0], max_new_tokens=10, eos_ids=[], stream=True)
    first = next(stream)
    with pytest.raises(BusyError, match="its one KV-cache slot is held by other generations"):
        pyrt.generate(llm, PROMPTS[1], max_new_tokens=2)
    assert [first, *stream] == want(PROMPTS[0]) and llm.slots.free == 1
    assert pyrt.generate(llm, PROMPTS[1], max_new_tokens=10, eos_ids=[]).tokens == want(PROMPTS[1])


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"prompt_ids": list(range(1, 50))}, "has 49 tokens, more than the cache's 48 positions"),
    ({"prompt_ids": [5, 50]}, r"prompt_ids\[1\]=50 is outside the vocabulary \[0, 50\)"),
    ({"prompt_ids": [5, -1]}, r"prompt_ids\[1\]=-1 is outside the vocabulary"),
    ({"prompt_ids": [5, 2.0]}, r"prompt_ids\[1\]=2.0 is not an int token id"),
    ({"prompt_ids": []}, "prompt_ids is empty"),
    ({"prompt_ids": "hello"}, "must be a sequence of token ids"),
    ({"prompt_ids": [[5, 6], [7, 60]]}, r"prompt_ids\[1\]\[1\]=60 is outside the vocabulary"),
    ({"max_new_tokens": 45}, "max_new_tokens=45 goes past the cache: a 5-token prompt leaves room for 44"),
    ({"max_new_tokens": 0}, "max_new_tokens=0 must be an int >= 1"),
    ({"temperature": 0.0, "do_sample": True}, "temperature=0.0 must be a finite number > 0"),
    ({"temperature": float("nan"), "do_sample": True}, "temperature=nan must be a finite number > 0"),
    ({"top_k": 0}, "top_k=0 must be an int >= 1"),
    ({"top_p": 1.5}, r"top_p=1.5 must be a number in \(0, 1\]"),
    ({"seed": -(2**63) - 1}, "seed=-9223372036854775809 must be an int >= -9223372036854775808"),
    ({"seed": [1, 2, 3]}, "seed has 3 values for 1 prompts"),
    ({"eos_ids": [500]}, r"eos_ids\[0\]=500 is outside the vocabulary"),
    ({"do_sample": "yes"}, "do_sample='yes' must be a bool"),
    ({"stream": 1}, "stream=1 must be a bool"),
])
def test_bad_requests_are_input_errors_naming_the_field_before_any_step(kwargs: dict[str, Any], match: str) -> None:
    import pyrt

    llm, lm = S.stub(slots=2)
    call = {"prompt_ids": PROMPTS[0], "max_new_tokens": 4, **kwargs}
    with pytest.raises(InputError, match=match):
        pyrt.generate(llm, call.pop("prompt_ids"), **call)
    assert lm.calls == [] and llm.slots.free == 2


def test_a_full_queue_names_its_bound_as_the_caller_set_it() -> None:
    from pyrt.errors import QueueFullError

    llm, _ = S.stub(slots=1)
    engine = Engine(llm, max_queued=0)
    taker = engine.submit(PROMPTS[0], GREEDY)  # the free slot's taker (kept: a dropped handle is cancelled)
    with pytest.raises(QueueFullError) as caught:
        engine.submit(PROMPTS[1], GREEDY)
    assert (caught.value.waiting, caught.value.slots, caught.value.limit) == (0, 1, 0)
    assert "(max_queued_requests=0)" in str(caught.value.renamed("max_queued_requests"))
    assert taker.wait(30) and taker.result is not None and taker.result.tokens == want(PROMPTS[0])
