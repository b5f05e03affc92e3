"""The engine's parts against a stand-in program (tests/fixtures/stub_llm.py), in milliseconds: the pure
scheduler, the engine core stepped by hand (commands in, updates out: deterministic), the one stepping thread
and the front ends other threads use. Every generation is compared with the stub's own token-by-token reference
(greedy and seeded sampling)."""

from __future__ import annotations

import ast
import gc
import queue
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pyrt.errors import BusyError, InputError, ProgramClosedError, QueueFullError
from pyrt.llm import Engine, SamplingParams, make_request
from pyrt.llm.core import Cancel, CloseFront, EngineCore, FrontEnd, Pause, Resume, StepOnce, Stop, Submit
from pyrt.llm.outputs import Update
from pyrt.llm.scheduler import Feed, Outcome, Scheduler, Sequence
from pyrt.llm.slots import SlotTable
from pyrt.llm.stepping import CoreLoop
from tests.fixtures import stub_llm as S

PROMPTS = [[5, 6, 7, 8, 9], [11, 12], list(range(20, 40)), [3], [30, 31, 32], [40, 41, 42, 43], [44, 45, 46]]
GREEDY = SamplingParams(max_new_tokens=10, eos_ids=())
SAMPLED = SamplingParams(max_new_tokens=12, do_sample=True, temperature=1.3, top_k=8, seed=4, eos_ids=())


def want(prompt: list[int], params: SamplingParams = GREEDY, conv: Any = None) -> list[int]:
    return S.reference(prompt, params, conv or S.convention())


# -- the scheduler alone ---------------------------------------------------------------------------


def scheduler(slots: int = 2, budget: int = 8, context: int = 16) -> Scheduler:
    conv = S.convention(slots, budget, context=context)
    return Scheduler(conv, SlotTable(slots, "stub"), now=lambda: 0.0)


def add(sched: Scheduler, seq_id: int, prompt: list[int], **params: Any) -> Sequence:
    request = make_request(sched.conv, prompt, SamplingParams(**{"eos_ids": (), **params}))
    return sched.add(Sequence(seq_id, request))


def test_admission_is_first_come_while_slots_are_free() -> None:
    sched = scheduler(slots=2)
    seqs = [add(sched, i, [1, 2]) for i in range(3)]
    assert sched.admit() == seqs[:2] and [s.slot for s in seqs] == [0, 1, None] and list(sched.waiting) == seqs[2:]
    update = sched.abort(0, "cancelled")
    assert update is not None and update.result is not None and update.result.finish_reason == "cancelled"
    assert sched.admit() == [seqs[2]] and seqs[2].slot == 0  # the freed slot, reused
    assert sched.abort(0, "cancelled") is None  # it ended already


def test_a_waiting_sequence_whose_front_end_reserved_slots_takes_only_those() -> None:
    sched = scheduler(slots=3)
    sched.slots.reserve(7, 1)
    mine = [Sequence(i, make_request(sched.conv, [1, 2], GREEDY), front=7) for i in range(2)]
    other = Sequence(9, make_request(sched.conv, [1, 2], GREEDY))
    for seq in (*mine, other):
        sched.add(seq)
    assert sched.admit() == [mine[0], other] and [s.slot for s in (*mine, other)] == [0, None, 1]
    sched.abort(0, "cancelled")
    assert sched.admit() == [mine[1]] and mine[1].slot == 0 and sched.slots.free == 1


def test_decoding_sequences_go_first_and_prompts_are_chunked_within_the_budget() -> None:
    sched = scheduler(slots=2, budget=8)
    a = add(sched, 0, [1, 2, 3])
    sched.admit()
    sched.update(sched.schedule(), [Outcome(3, (9,))])
    b = add(sched, 1, list(range(10, 22)))  # 12 tokens, budget 8: two chunks
    sched.admit()
    feeds = sched.schedule()
    assert [(f.seq_id, f.tokens, f.start, f.logits) for f in feeds] == [
        (a.id, (9,), 3, 1), (b.id, tuple(range(10, 17)), 0, 0)]
    assert feeds[0].generated == (9,) and feeds[1].prefill  # plain values: what the runner samples with
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


def test_a_finished_grammar_ends_the_generation_after_its_token() -> None:
    sched = scheduler()
    add(sched, 0, [1, 2, 3])
    sched.admit()
    (update,) = sched.update(sched.schedule(), [Outcome(3, (5,), finished=True)])
    assert update.result is not None and update.result.finish_reason == "stop" and update.result.tokens == [5]


def test_an_outcome_that_keeps_some_fed_tokens_rewinds_the_cache_position() -> None:
    """A step that checked guesses keeps the ones accepted; the next feed overwrites the rest."""
    sched = scheduler()
    seq = add(sched, 0, [1, 2, 3])
    sched.admit()
    sched.update(sched.schedule(), [Outcome(3, (4,))])
    assert seq.slot is not None
    guess = Feed(seq.id, seq.slot, (4, 5, 6, 7), 3, 4, seq.request, tuple(seq.new))  # the last token, 3 guesses
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


# -- the engine core, stepped by hand ----------------------------------------------------------------


class Box(list[Any]):
    """An outbox / reply queue the core hands over to, kept as a list."""

    def put(self, item: Any) -> None:
        self.append(item)


def hand_over(out: list[tuple[Any, Any]]) -> None:
    for sink, item in out:
        sink.put(item)


def submit(core: EngineCore, front: FrontEnd, prompts: list[list[int]], params: SamplingParams = GREEDY,
           first: int = 0) -> list[Box]:
    boxes = [Box() for _ in prompts]
    items = tuple((first + i, make_request(core.conv, p, params), box, 0.0) for i, (p, box) in
                  enumerate(zip(prompts, boxes, strict=True)))
    hand_over(core.step([Submit(front, items)]))
    return boxes


def run(core: EngineCore, steps: int = 200) -> None:
    for _ in range(steps):
        if not core.has_work:
            return
        hand_over(core.step())
    raise AssertionError("the core still has work")


def tokens(box: Box) -> list[int]:
    return [t for u in box for t in u.tokens]


def final(box: Box) -> Update:
    assert box and box[-1].final, box
    last: Update = box[-1]
    return last


def stub_core(slots: int = 4, **kw: Any) -> tuple[EngineCore, S.StubLM]:
    loop, lm = S.stub(slots=slots, **kw)
    return loop.core, lm


def test_the_core_acknowledges_each_submission_and_steps_every_front_end_in_one_batch() -> None:
    core, lm = stub_core(slots=4)
    a = submit(core, FrontEnd(1), PROMPTS[:2])  # the step that applies it runs at once: one step already
    b = submit(core, FrontEnd(2), PROMPTS[2:4], SAMPLED, first=2)
    assert all(box[0].accepted for box in (*a, *b)) and lm.calls[0] == 5 + 2
    run(core)
    assert [tokens(x) for x in a] == [want(p) for p in PROMPTS[:2]]
    assert [tokens(x) for x in b] == [want(p, SAMPLED) for p in PROMPTS[2:4]]
    snap = core.snapshot()
    assert max(k for k, _ in snap.occupancy) == 4 and snap.free_slots == 4 and snap.running == snap.queued == 0
    assert max(lm.calls) <= 16


def test_the_queue_bound_is_one_rule_on_the_cores_own_counts() -> None:
    core, _ = stub_core(slots=2)
    bounded = FrontEnd(1, max_queued=1)
    hand_over(core.step([Pause(Box())]))
    boxes = submit(core, bounded, PROMPTS[:4])  # 2 slots free: 2 take them next step, 1 waits, the 4th refused
    assert [box[0].accepted for box in boxes] == [True, True, True, False]
    error = final(boxes[3]).error
    assert isinstance(error, QueueFullError) and (error.waiting, error.slots, error.limit) == (1, 2, 1)
    hand_over(core.step([StepOnce(Box())]))  # two admitted: the bound holds the same, one still waits
    (again,) = submit(core, bounded, [PROMPTS[4]], first=9)
    assert isinstance(final(again).error, QueueFullError)
    hand_over(core.step([Resume()]))
    run(core)
    assert tokens(boxes[2]) == want(PROMPTS[2]) and final(boxes[2]).result is not None


def test_a_reserving_front_end_takes_free_slots_or_is_refused_whole() -> None:
    core, _ = stub_core(slots=2)
    hog = submit(core, FrontEnd(1), [PROMPTS[0]])  # holds slot 0
    batch = submit(core, FrontEnd(2, reserve=4, transient=True), PROMPTS[1:4], first=1)  # one slot for 3 prompts
    refused = submit(core, FrontEnd(3, reserve=1, transient=True), [PROMPTS[4]], first=7)
    error = final(refused[0]).error
    assert isinstance(error, BusyError) and "all 2 of its KV-cache slots are held" in str(error)
    run(core)
    assert [tokens(x) for x in (*hog, *batch)] == [want(p) for p in PROMPTS[:4]]
    assert core.slots.free == 2 and not core.snapshot().fronts[1:]  # the transient front end went


def test_cancel_close_and_stop_end_generations_as_cancelled_keeping_their_tokens() -> None:
    core, _ = stub_core(slots=2)
    front = FrontEnd(1)
    boxes = submit(core, front, PROMPTS[:3])
    hand_over(core.step([Cancel(0)]))
    assert final(boxes[0]).result.finish_reason == "cancelled"  # type: ignore[union-attr]
    assert tokens(boxes[0]) == want(PROMPTS[0])[:1]  # the first step gave its first token, then it was cancelled
    closed = Box()
    hand_over(core.step([CloseFront(front, closed)]))
    assert closed == [None] and all(final(b).result.finish_reason == "cancelled" for b in boxes[1:])  # type: ignore
    late = submit(core, FrontEnd(2), [PROMPTS[3]], first=5)
    hand_over(core.step([Stop()]))
    assert final(late[0]).result.finish_reason == "cancelled"  # type: ignore[union-attr]
    (after,) = submit(core, FrontEnd(3), [PROMPTS[4]], first=6)
    assert isinstance(final(after).error, ProgramClosedError) and core.slots.free == 2


def test_a_paused_core_applies_commands_but_steps_only_when_asked() -> None:
    core, lm = stub_core()
    held, step = Box(), Box()
    hand_over(core.step([Pause(held)]))
    boxes = submit(core, FrontEnd(1), PROMPTS[:2])
    assert held == [None] and lm.calls == [] and all(b[0].accepted for b in boxes) and core.has_work
    assert not core.wants_step
    hand_over(core.step([StepOnce(step)]))
    assert step == [2] and len(lm.calls) == 1
    hand_over(core.step([Resume()]))
    run(core)
    assert [tokens(b) for b in boxes] == [want(p) for p in PROMPTS[:2]]


def test_a_bug_in_a_step_ends_the_generations_and_the_core_goes_on() -> None:
    class Broken:
        name = "broken"

        def propose(self, rooms: Any) -> dict[int, Any]:
            return {}

        def release(self, seq_id: int) -> None:
            raise KeyError("a bug")  # called outside the run's own error handling

        def close(self) -> None:
            pass

    core, _ = stub_core(slots=2)
    box = Box()
    request = make_request(core.conv, [5, 6], SamplingParams(max_new_tokens=1))
    with pytest.raises(KeyError):  # its one step ends it, and ending it meets the bug
        core.step([Submit(FrontEnd(1, drafter=Broken(), draft_tokens=2), ((0, request, box, 0.0),))])
    bug = KeyError("a bug")
    hand_over(core.fail_all(bug))
    assert box[-1].error is bug and core.failures == 1 and not core.has_work and core.slots.free == 2
    (later,) = submit(core, FrontEnd(2), [PROMPTS[1]], first=3)
    run(core)
    assert tokens(later) == want(PROMPTS[1])


def test_pyrt_llm_constructs_at_most_two_threading_primitives_all_in_the_stepping_loop() -> None:
    kinds = {"Lock", "RLock", "Condition", "Event", "Semaphore", "BoundedSemaphore", "Barrier"}
    made = []
    for path in sorted((Path(__file__).resolve().parents[2] / "pyrt" / "llm").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in kinds:
                made.append((path.name, node.func.attr))
    assert len(made) <= 2 and {name for name, _ in made} <= {"stepping.py"}, made


# -- front ends, through the core's stepping thread -----------------------------------------------------


def test_many_generations_from_two_engines_equal_their_references_and_share_steps() -> None:
    loop, lm = S.stub(slots=4)
    first, second = Engine(loop), Engine(loop)
    with first.paused():  # both engines' generations join the same first step
        streams = [(first if i % 2 else second).submit(p, GREEDY if i % 2 else SAMPLED) for i, p in enumerate(PROMPTS)]
    for i, (p, s) in enumerate(zip(PROMPTS, streams, strict=True)):
        assert s.wait(30) and s.result is not None and s.result.tokens == want(p, GREEDY if i % 2 else SAMPLED), i
    assert max(map(int, first.stats()["occupancy"])) == 4 and S.free_slots(loop) == 4
    assert max(lm.calls) <= 16 and first.stats() == {**second.stats(), "draft": None, "draft_tokens": 0}


def test_iterating_a_generation_waits_for_the_core_and_a_dropped_one_is_cancelled() -> None:
    loop, _ = S.stub(slots=2)
    engine = Engine(loop)
    with engine.paused():
        kept, dropped = engine.submit(PROMPTS[0], GREEDY), engine.submit(PROMPTS[1], GREEDY)
        engine.step()
        first = next(kept)
        assert first == want(PROMPTS[0])[0] and engine.running == 2
        del dropped
        gc.collect()  # its finalizer posts the cancellation: applied before the next step
        engine.step()
        assert engine.running == 1 and S.free_slots(loop) == 1
    assert [first, *kept] == want(PROMPTS[0]) and kept.result is not None
    assert S.free_slots(loop) == 2


def test_cancel_keeps_the_tokens_so_far() -> None:
    loop, _ = S.stub(slots=2)
    engine = Engine(loop)
    with engine.paused():
        stream = engine.submit(PROMPTS[0], GREEDY)
        engine.step()
        engine.step()
        engine.cancel(stream)
        assert stream.wait(30)
    assert stream.result is not None and stream.result.finish_reason == "cancelled"
    assert stream.result.tokens == want(PROMPTS[0])[:2] and stream.tokens == stream.result.tokens


def test_the_queue_bound_counts_generations_that_will_wait_for_a_slot() -> None:
    loop, _ = S.stub(slots=2)
    engine = Engine(loop, max_queued=1)
    with engine.paused():
        taken = [engine.submit(p, GREEDY) for p in PROMPTS[:2]]  # the two free slots' takers, at the next step
        waits = engine.submit(PROMPTS[2], GREEDY)  # the queue's one place
        with pytest.raises(BusyError, match=r"1 generations already wait for one of 2 KV-cache slots "
                                            r"\(max_queued=1\)"):
            engine.submit(PROMPTS[3], GREEDY)
        engine.step()  # two admitted: the bound holds the same, one still waits
        with pytest.raises(BusyError):
            engine.submit(PROMPTS[3], GREEDY)
    for s in (*taken, waits):
        assert s.wait(30)
    assert waits.result is not None and waits.result.tokens == want(PROMPTS[2])
    with pytest.raises(InputError, match="max_queued=-1 must be an int >= 0 or None"):
        Engine(loop, max_queued=-1)


def test_paused_holds_every_step_back() -> None:
    loop, lm = S.stub()
    engine = Engine(loop)
    with engine.paused():
        stream = engine.submit(PROMPTS[0], GREEDY)
        assert not stream.wait(0.2) and lm.calls == []
    assert stream.wait(30) and stream.result is not None and stream.result.tokens == want(PROMPTS[0])


def test_threads_submit_read_and_cancel_while_one_thread_steps() -> None:
    loop, _ = S.stub(slots=3)
    engine = Engine(loop)
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
    assert not errors and got == {i: want(p) for i, p in enumerate(PROMPTS)}
    assert long.wait(5) and long.result is not None and long.result.finish_reason in ("cancelled", "cache_full")
    assert engine.pending == 0 and S.free_slots(loop) == 3


def test_the_stepping_thread_ends_when_idle_and_the_next_command_starts_another() -> None:
    loop, _ = S.stub(slots=1)
    engine = Engine(loop)
    before = {t.ident for t in threading.enumerate()}
    assert engine.submit(PROMPTS[0], GREEDY).wait(30)
    for t in threading.enumerate():
        if t.name.startswith("pyrt-core-") and t.ident not in before:
            t.join(30)  # idle: it ends by itself
    assert not any(t.name.startswith("pyrt-core-stub") for t in threading.enumerate())
    assert engine.submit(PROMPTS[1], GREEDY).wait(30) and S.free_slots(loop) == 1


def test_a_generation_that_has_ended_is_counted_in_the_stats_it_can_read() -> None:
    """The stats a caller reads once it holds its last token count that token (a server's stats route answered
    a client that had its whole answer with the counts of the step before)."""
    loop, _ = S.stub(slots=2)
    engine = Engine(loop)
    seen: list[tuple[bool, int]] = []
    with engine.paused():
        streams = [engine.submit(p, GREEDY) for p in PROMPTS[:2]]
        for stream in streams:  # on the stepping thread: it reads the published stats, not the handle
            stream.on_update(lambda: seen.append((loop.published.running == 0, engine.stats()["tokens_generated"])))
    for stream in streams:
        stream.wait(30)
    total = sum(len(want(p)) for p in PROMPTS[:2])
    assert engine.stats()["tokens_generated"] == total and engine.stats()["free_slots"] == 2
    assert seen[-1] == (True, total), seen


def test_close_cancels_everything_and_gives_the_slots_back() -> None:
    loop, _ = S.stub(slots=2)
    engine = Engine(loop)
    with engine.paused():
        streams = [engine.submit(p, GREEDY) for p in PROMPTS[:3]]
        engine.step()
        engine.close()  # applied while the core holds its steps
    for s in streams:
        assert s.wait(30)
    assert [s.result.finish_reason for s in streams if s.result] == ["cancelled"] * 3
    assert S.free_slots(loop) == 2 and engine.pending == 0


def test_a_dropped_engine_cancels_its_generations_and_others_go_on() -> None:
    loop, _ = S.stub(slots=2)
    keeper, dropped = Engine(loop), Engine(loop)
    with keeper.paused():
        mine = keeper.submit(PROMPTS[0], GREEDY)
        theirs = dropped.submit(PROMPTS[1], GREEDY)
        del dropped
        gc.collect()
    assert theirs.wait(30) and theirs.result is not None and theirs.result.finish_reason == "cancelled"
    assert mine.wait(30) and mine.result is not None and mine.result.tokens == want(PROMPTS[0])


def test_engines_on_one_core_never_share_a_slot() -> None:
    loop, lm = S.stub(slots=3)
    first, second = Engine(loop), Engine(loop)
    with second.paused():  # all five queued before the first step: every slot is taken, then reused
        a = [first.submit(p, GREEDY) for p in PROMPTS[:2]]
        b = [second.submit(p, GREEDY) for p in PROMPTS[2:5]]
    for s in a + b:
        assert s.wait(30)
    assert [s.result.tokens for s in a + b if s.result] == [want(p) for p in PROMPTS[:5]]
    assert S.free_slots(loop) == 3 and np.all(lm.cache[:, 0] >= 0)


def test_a_listener_that_raises_does_not_stop_the_core() -> None:
    loop, _ = S.stub(slots=2)
    engine = Engine(loop)
    with engine.paused():
        noisy, quiet = engine.submit(PROMPTS[0], GREEDY), engine.submit(PROMPTS[1], GREEDY)
        noisy.on_update(lambda: 1 / 0)
    assert noisy.wait(30) and quiet.wait(30) and quiet.result is not None
    assert noisy.result is not None and noisy.result.tokens == want(PROMPTS[0])


def test_a_closed_core_refuses_submissions_and_a_listener_may_not_wait_for_it() -> None:
    loop, _ = S.stub(slots=2)
    engine = Engine(loop)
    waiting: queue.SimpleQueue[BaseException] = queue.SimpleQueue()
    with engine.paused():
        stream = engine.submit(PROMPTS[0], GREEDY)

        def listener() -> None:  # on the stepping thread: waiting for the core there would never end
            try:
                engine.step()
            except BaseException as exc:  # noqa: BLE001 - checked below
                waiting.put(exc)
        stream.on_update(listener)
        engine.step()
    assert "must not call the engine" in str(waiting.get(timeout=30))
    loop.close()
    assert stream.wait(30) and stream.result is not None and stream.result.finish_reason in ("cancelled", "length")
    with pytest.raises(ProgramClosedError):
        engine.submit(PROMPTS[1], GREEDY)
    assert not engine.alive


# -- pyrt.generate on the stub ------------------------------------------------------------------------


def test_generate_gives_one_result_per_prompt_each_its_reference() -> None:
    import pyrt

    loop, _ = S.stub(slots=4)
    results = pyrt.generate(loop, PROMPTS, max_new_tokens=10, eos_ids=[])  # 7 prompts, 4 slots
    assert [r.tokens for r in results] == [want(p) for p in PROMPTS] and S.free_slots(loop) == 4
    sampled = pyrt.generate(loop, PROMPTS[:3], max_new_tokens=10, do_sample=True, temperature=0.8, seed=[3, 1, 4],
                            eos_ids=[])
    assert [r.tokens for r in sampled] == [
        want(p, SamplingParams(max_new_tokens=10, do_sample=True, temperature=0.8, seed=s, eos_ids=()))
        for p, s in zip(PROMPTS[:3], [3, 1, 4], strict=True)]


def test_generate_streams_and_refuses_at_once_when_every_slot_is_held() -> None:
    import pyrt

    loop, _ = S.stub(slots=1)
    with Engine(loop).paused():  # the core holds its steps: the first generation keeps its slot meanwhile
        stream = pyrt.generate(loop, PROMPTS[0], max_new_tokens=10, eos_ids=[], stream=True)
        with pytest.raises(BusyError, match="its one KV-cache slot is held by other generations"):
            pyrt.generate(loop, PROMPTS[1], max_new_tokens=2)
    assert list(stream) == want(PROMPTS[0]) and S.free_slots(loop) == 1
    assert pyrt.generate(loop, PROMPTS[1], max_new_tokens=10, eos_ids=[]).tokens == want(PROMPTS[1])


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
    ({"temperature": -0.5, "do_sample": True}, r"temperature=-0.5 must be a finite number >= 0 \(0: greedy\)"),
    ({"temperature": float("nan"), "do_sample": True}, r"temperature=nan must be a finite number >= 0 \(0: greedy\)"),
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

    loop, lm = S.stub(slots=2)
    call = {"prompt_ids": PROMPTS[0], "max_new_tokens": 4, **kwargs}
    with pytest.raises(InputError, match=match):
        pyrt.generate(loop, call.pop("prompt_ids"), **call)
    assert lm.calls == [] and S.free_slots(loop) == 2


def test_a_full_queue_names_its_bound_as_the_caller_set_it() -> None:
    loop, _ = S.stub(slots=1)
    engine = Engine(loop, max_queued=0)
    with engine.paused():
        taker = engine.submit(PROMPTS[0], GREEDY)  # the free slot's taker (kept: a dropped handle is cancelled)
        engine.step()
        with pytest.raises(QueueFullError) as caught:
            engine.submit(PROMPTS[1], GREEDY)
    assert (caught.value.waiting, caught.value.slots, caught.value.limit) == (0, 1, 0)
    assert "(max_queued_requests=0)" in str(caught.value.renamed("max_queued_requests"))
    assert taker.wait(30) and taker.result is not None and taker.result.tokens == want(PROMPTS[0])


def _watch_steps(lm: Any) -> list[str]:
    """Make ``lm``'s forward calls record the thread that runs each, failing when two threads step at once."""
    real, inside, names = lm.run, [], []

    def watched(*args: Any, **kw: Any) -> Any:
        inside.append(threading.current_thread())
        assert len(inside) == 1, "two threads stepped the core at once"
        names.append(threading.current_thread().name)
        try:
            return real(*args, **kw)
        finally:
            inside.pop()

    lm.run = watched
    return names


def test_a_core_loop_is_only_ever_stepped_by_one_thread() -> None:
    """Six callers submitting and waiting at once: each step runs on one thread at a time (a waiting caller's
    while no other steps, else the loop's), and every generation ends."""
    loop, lm = S.stub(slots=4)
    names = _watch_steps(lm)
    done: list[bool] = []
    callers = [threading.Thread(target=lambda: done.append(Engine(loop).submit(PROMPTS[0], GREEDY).wait(30)))
               for _ in range(6)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(60)
    assert names and done == [True] * 6 and isinstance(loop, CoreLoop)


def test_generate_steps_the_core_on_the_calling_thread_and_starts_none() -> None:
    """pyrt.generate's steps run on its caller's thread (no handoff between threads per token)."""
    import pyrt

    loop, lm = S.stub(slots=4)
    names = _watch_steps(lm)
    before = {t.ident for t in threading.enumerate()}
    results = pyrt.generate(loop, PROMPTS[:3], max_new_tokens=5, eos_ids=[])
    assert [r.tokens for r in results] == [want(p, SamplingParams(max_new_tokens=5, eos_ids=())) for p in PROMPTS[:3]]
    assert names and set(names) == {threading.current_thread().name}
    assert not [t for t in threading.enumerate() if t.ident not in before and t.name.startswith("pyrt-core-")]


def test_a_caller_that_stops_stepping_with_work_left_hands_the_core_to_a_thread() -> None:
    """A generation posted without waiting (an event loop's) goes on after the caller stepping the core has what
    it waited for: a stepping thread takes over, and the posted one ends without anyone waiting on it."""
    loop, lm = S.stub(slots=2)
    names = _watch_steps(lm)
    engine, longer = Engine(loop), SamplingParams(max_new_tokens=8, eos_ids=())
    short, posted = engine.post_all([make_request(loop.conv, PROMPTS[0], SamplingParams(max_new_tokens=2, eos_ids=())),
                                     make_request(loop.conv, PROMPTS[1], longer)], start=False)  # no thread yet
    assert short.wait(30) and short.result is not None  # stepped here, both fed each step
    for _ in range(3000):
        if posted.done:
            break
        threading.Event().wait(0.01)  # nobody steps here: the core's own thread must finish it
    assert posted.done and posted.result is not None and posted.result.tokens == want(PROMPTS[1], longer)
    here = names.count(threading.current_thread().name)  # the steps until the short one ended, then the thread's
    assert here and names[:here] == [threading.current_thread().name] * here
    assert names[here:] and all(n.startswith("pyrt-core-") for n in names[here:])
