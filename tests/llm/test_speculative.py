"""Speculative decoding on the stand-in program (tests/fixtures/stub_llm.py), in milliseconds: the scheduler's room
for guesses, prompt lookup, verification, and engines with a draft whose greedy tokens equal the stub's own
token-by-token reference. The target stubs check every write against the row before it (``greedy_check``) and
refuse reads of stale entries, so a rejected guess that stays in the cache fails at once."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import pyrt
from pyrt.errors import InputError
from pyrt.llm import Engine, NgramDrafter, SamplingParams, make_request
from pyrt.llm.draft_model import kept_prefix
from pyrt.llm.guesses import Proposal
from pyrt.llm.ngram import lookup
from pyrt.llm.scheduler import Outcome, Scheduler, Sequence, guess_cap
from pyrt.llm.slots import SlotTable
from pyrt.llm.verify import verify
from tests.fixtures import stub_llm as S

PROMPTS = [[5, 6, 7, 8, 9], [11, 12], list(range(20, 40)), [3], [30, 31, 32], [40, 41, 42, 43], [44, 45, 46]]
GREEDY = SamplingParams(max_new_tokens=14, eos_ids=())


def want(prompt: list[int], params: SamplingParams = GREEDY, conv: Any = None) -> list[int]:
    return S.reference(prompt, params, conv or S.convention())


def drafts(kind: str, slots: int = 4) -> Any:
    """``kind``'s draft for a stub target: "ngram", "self" (the target's own logits: every guess right) or "other"
    (another model's logits: most guesses wrong)."""
    if kind == "ngram":
        return "ngram"
    return S.stub(slots=slots, salt=0 if kind == "self" else 1)[0]


def run_all(engine: Engine, prompts: list[list[int]], params: SamplingParams = GREEDY) -> list[list[int]]:
    streams = [engine.submit(p, params) for p in prompts]
    while engine.pending:
        engine.step()
    assert all(s.error is None for s in streams), [s.error for s in streams]
    return [s.result.tokens for s in streams if s.result]


# -- the pure parts ---------------------------------------------------------------------------------


def test_lookup_takes_the_longest_ngram_then_the_most_recent_match() -> None:
    assert lookup([1, 2, 3, 7, 2, 3, 8, 1, 2, 3], 2) == (7, 2)  # "1 2 3" once before; "2 3" would say 8
    assert lookup([4, 2, 3, 7, 2, 3], 3) == (7, 2, 3)  # "2 3": the most recent earlier one; "3" alone is later
    assert lookup([9, 1, 5, 1], 4) == (5, 1, 5, 1)  # the match runs into the end: the copy goes on
    assert lookup([1, 2, 3], 3) == () and lookup([1], 3) == () and lookup([1, 1], 0) == ()
    assert lookup([1, 2, 9, 2], 3, max_n=3, min_n=2) == ()  # "2" alone is not tried
    with pytest.raises(InputError, match="min_n=3 is more than max_n=2"):
        NgramDrafter(max_n=2, min_n=3)


def test_greedy_verification_keeps_guesses_while_they_are_the_argmax() -> None:
    rows = np.eye(5)[[1, 2, 3, 4]] * 3.0  # argmax 1, 2, 3, 4
    rng = np.random.default_rng(0)
    assert verify(rows, (1, 2, 3), None, GREEDY, rng) == (3, (1, 2, 3, 4))
    assert verify(rows, (1, 0, 3), None, GREEDY, rng) == (1, (1, 2))
    assert verify(rows[:1], (), None, GREEDY, rng) == (0, (1,))
    with pytest.raises(InputError, match="2 guesses need 3 logits rows, got 4"):
        verify(rows, (1, 2), None, GREEDY, rng)


def test_sampled_verification_without_guesses_draws_what_sample_draws() -> None:
    from pyrt.llm.sampling import sample

    params = SamplingParams(do_sample=True, temperature=0.9, top_k=7)
    logits = S.logits_after([1, 2, 3])
    assert verify(logits[None], (), None, params, np.random.default_rng(5)) == (
        0, (sample(logits, params, np.random.default_rng(5)),))


def test_guess_caps_and_the_shares_of_a_step() -> None:
    conv = S.convention(slots=4, tokens_per_step=16, context=16)
    sched = Scheduler(conv, SlotTable(4, "stub"), now=lambda: 0.0)
    seqs = [sched.add(Sequence(i, make_request(conv, p, SamplingParams(max_new_tokens=m, eos_ids=())), max_guesses=4))
            for i, (p, m) in enumerate([([1, 2], 3), ([3] * 12, None), ([4, 5], None)])]
    sched.admit()
    sched.update(sched.schedule(), [Outcome(2, (7,)), Outcome(12, (8,)), Outcome(2, (9,))])
    assert [guess_cap(s, conv) for s in seqs] == [1, 3, 13]  # max_new_tokens 3 -> 1; positions 13, 14, 15 free
    assert sched.guess_room() == [(seqs[0], 1), (seqs[1], 3), (seqs[2], 4)]
    late = sched.add(Sequence(3, make_request(conv, list(range(10)), SamplingParams(eos_ids=())), max_guesses=4))
    sched.admit()  # a 10-token prompt to feed keeps half of the 16 - 3 decoding tokens: 7 for guesses
    assert sched.guess_room() == [(seqs[0], 1), (seqs[1], 3), (seqs[2], 3)]
    feeds = sched.schedule({0: Proposal((6,)), 2: Proposal((6, 6, 6, 6))})  # more than its room: cut to it
    assert [(f.tokens, f.start, f.logits) for f in feeds] == [
        ((7, 6), 2, 2), ((8,), 12, 1), ((9, 6, 6, 6), 2, 4), (tuple(range(9)), 0, 0)]  # the prompt gets the rest
    assert late.slot == 3 and sched.guess_room() != []


def test_an_older_files_rows_leave_room_for_guesses_only_beside_few_sequences() -> None:
    conv = S.convention(slots=4, tokens_per_step=16, max_rows=4)  # rows bound = max_batch_size
    sched = Scheduler(conv, SlotTable(4, "stub"), now=lambda: 0.0)
    seqs = [sched.add(Sequence(i, make_request(conv, [1 + i], SamplingParams(eos_ids=())), max_guesses=4))
            for i in range(4)]
    sched.admit()
    sched.update(sched.schedule(), [Outcome(1, (5,))] * 4)
    assert sched.guess_room() == []  # four decoding: every row taken
    sched.abort(3, "cancelled")
    sched.abort(2, "cancelled")
    assert sched.guess_room() == [(seqs[0], 1), (seqs[1], 1)]


def test_a_proposal_is_filled_to_its_room_with_deterministic_guesses() -> None:
    from pyrt.llm.drafting import fill

    probs = np.full((1, 5), 0.2)
    filled = fill(Proposal((3,), probs), 9, 3, 5)
    assert filled.tokens == (3, 3, 3) and filled.probs is not None
    assert np.array_equal(filled.probs, [[0.2] * 5, [0, 0, 0, 1, 0], [0, 0, 0, 1, 0]])
    assert fill(None, 9, 2, 10).tokens == (9, 9) and fill(None, 9, 2, 10).probs is None
    same = Proposal((1, 2))
    assert fill(same, 9, 2, 10) is same


def test_kept_prefix_is_where_the_draft_rolls_back_to() -> None:
    assert kept_prefix([1, 2, 3], [1, 2, 3, 4], 3) == 3 and kept_prefix([1, 5, 3], [1, 2, 3], 9) == 1
    assert kept_prefix([], [1], 0) == 0


# -- engines with a draft: greedy token for token -------------------------------------------------------


@pytest.mark.parametrize("kind", ["ngram", "self", "other"])
@pytest.mark.parametrize("slots", [1, 4])
def test_greedy_with_a_draft_equals_greedy_without(kind: str, slots: int) -> None:
    llm, lm = S.stub(slots=slots, greedy_check=True)
    engine = Engine(llm, draft=drafts(kind), draft_tokens=4)
    prompts = PROMPTS + [[1, 2, 3, 1, 2, 3, 1, 2]]  # a prompt that repeats: prompt lookup guesses
    assert run_all(engine, prompts) == [want(p) for p in prompts]
    stats = engine.stats()
    assert stats["drafted"] > 0 and 0 <= stats["accepted"] <= stats["drafted"] and S.free_slots(llm) == slots
    if kind == "self":
        assert stats["accepted"] == stats["drafted"] and stats["acceptance_rate"] == 1.0
        assert stats["tokens_per_pass"] > 3  # 14 tokens: the first, then up to 5 per pass
    assert stats["tokens_per_pass"] >= 1.0 and stats["tokens_generated"] == 14 * len(prompts)
    assert max(lm.rows) <= 16 and max(lm.calls) <= 16


def test_sequences_join_and_leave_mid_run_and_cancel_frees_both_slots() -> None:
    llm, _ = S.stub(slots=3, greedy_check=True)
    draft, draft_lm = S.stub(slots=2, salt=1)  # fewer draft slots: a third sequence decodes without guesses
    engine = Engine(llm, draft=draft, draft_tokens=3)
    with engine.paused():
        first = [engine.submit(p, GREEDY) for p in PROMPTS[:3]]
        for _ in range(3):
            engine.step()
        assert engine.drafter.slots.free == 0
        late = [engine.submit(p, GREEDY) for p in PROMPTS[3:6]]
        engine.cancel(first[1])
        engine.step()
        kept = first[1].result.tokens if first[1].result else None
        assert kept is not None and kept == want(PROMPTS[1])[:len(kept)]
    while engine.pending:
        engine.step()
    got = [s.result.tokens for s in first + late if s.result]
    assert got[:1] + got[2:] == [want(p) for i, p in enumerate(PROMPTS[:6]) if i != 1]
    assert S.free_slots(llm) == 3 and engine.drafter.slots.free == 2 and engine.stats()["drafted"] > 0
    engine.close()
    assert (draft_lm.cache >= S.STALE).all()


@pytest.mark.parametrize("kind", ["self", "ngram"])
def test_eos_and_stop_sequences_inside_an_accepted_run_end_it_there(kind: str) -> None:
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    full = want(prompt)
    eos, pair = full[3], full[5:7]
    llm, _ = S.stub(slots=2, greedy_check=True)
    engine = Engine(llm, draft=drafts(kind), draft_tokens=4)
    ended = engine.submit(prompt, max_new_tokens=14, eos_ids=[eos])
    stopped = engine.submit(prompt, max_new_tokens=14, eos_ids=(), stop=[pair])
    while engine.pending:
        engine.step()
    assert ended.result is not None and ended.result.tokens == full[:full.index(eos) + 1]
    at = next(i for i in range(len(full)) if full[i:i + 2] == pair) + 2
    assert stopped.result is not None and (stopped.result.tokens, stopped.result.finish_reason) == (full[:at], "stop")


def test_max_new_tokens_and_a_full_cache_are_never_passed() -> None:
    llm, lm = S.stub(slots=1, greedy_check=True, context=16)
    engine = Engine(llm, draft=S.stub(slots=1, context=16)[0], draft_tokens=4)  # every guess right
    capped = engine.submit([1, 2, 3], max_new_tokens=6, eos_ids=())
    while engine.pending:
        engine.step()
    assert capped.result is not None and capped.result.tokens == want([1, 2, 3], SamplingParams(max_new_tokens=6,
                                                                                                  eos_ids=()))
    assert (lm.cache[0, 3 + 5:] == S.UNWRITTEN).all()  # no guess past the 6th token: its own position stays empty
    full = engine.submit([1, 2, 3], eos_ids=())
    full.wait()
    assert full.result is not None and full.result.finish_reason == "cache_full"
    assert full.result.tokens == want([1, 2, 3], SamplingParams(eos_ids=()), S.convention(context=16))


def test_one_sequence_files_check_guesses_only_when_their_logits_cover_every_position() -> None:
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    for full, checks in ((True, True), (False, False)):
        llm, lm = S.single(full=full, greedy_check=True)
        engine = Engine(llm, draft="ngram", draft_tokens=4)
        assert engine.max_guesses == (4 if full else 0)
        assert run_all(engine, [prompt, PROMPTS[0]]) == [want(prompt), want(PROMPTS[0])]
        assert (engine.stats()["drafted"] > 0) == checks and (max(lm.rows) > 1) == checks
        llm, lm = S.single(full=full)  # a draft program beside it; a 20-token prompt in two calls
        engine = Engine(llm, draft=S.stub(slots=2, salt=3, noise=0.5)[0], draft_tokens=4)
        assert run_all(engine, PROMPTS) == [want(p) for p in PROMPTS]
        assert (engine.stats()["accepted"] > 0) == checks


def test_a_rejected_guess_kept_in_the_cache_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A mutant verifier that keeps every guess (the rejected ones too) before the target's token: the stub's next
    write does not follow the row before it, and the generation fails with the stub's assertion."""
    import pyrt.llm.runner as runner

    real = runner.verify
    monkeypatch.setattr(runner, "verify", lambda rows, guesses, *a: (
        len(guesses), (*guesses, real(rows, guesses, *a)[1][-1])))
    llm, _ = S.stub(slots=1, greedy_check=True)
    engine = Engine(llm, draft=drafts("other"), draft_tokens=4)
    stream = engine.submit(PROMPTS[0], GREEDY)
    stream.wait()
    assert isinstance(stream.error, AssertionError) and "after a row whose argmax" in str(stream.error)
    assert S.free_slots(llm) == 1


def test_a_read_past_a_rolled_back_position_is_caught() -> None:
    lm = S.StubLM(S.convention(slots=1))
    lm.run([1, 2, 3, 4], [0] * 4, [0, 1, 2, 3], [3], range(4))
    lm.run([5], [0], [2], [0], range(4))  # rolled back to 2: position 3 is stale now
    with pytest.raises(AssertionError, match="stale entry"):
        lm.run([6], [0], [4], [0], range(8))


def test_a_failing_draft_ends_the_generations_it_guessed_for_and_frees_both_slots() -> None:
    llm, _ = S.stub(slots=2)
    draft, draft_lm = S.stub(slots=2, salt=1)
    calls = {"n": 0}
    real = draft_lm.run

    def flaky(*args: Any, **kw: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("draft boom")
        return real(*args, **kw)

    draft_lm.run = flaky  # type: ignore[method-assign]
    engine = Engine(llm, draft=draft)
    with engine.paused():  # both join the first step: the third draft call guesses for both
        doomed = [engine.submit(p, GREEDY) for p in PROMPTS[:2]]
    while engine.pending:
        engine.step()
    assert [str(s.error) for s in doomed] == ["draft boom"] * 2
    assert S.free_slots(llm) == 2 and engine.drafter.slots.free == 2
    assert run_all(engine, PROMPTS[2:4]) == [want(p) for p in PROMPTS[2:4]]  # the engine goes on


def test_a_draft_must_share_the_vocabulary_bos_and_eos() -> None:
    llm, _ = S.stub()
    for kw, named in (({"vocab": 60}, "vocab_size 60 vs 50"), ({"eos": (3,)}, r"eos_ids \[3\] vs \[2\]")):
        with pytest.raises(InputError, match=f"draft stub.pte does not fit target stub.pte: {named}"):
            Engine(llm, draft=S.stub(**kw)[0])
    for bad, match in (("nram", "draft='nram': pass None"), (3, "draft=int: pass None"),):
        with pytest.raises(InputError, match=match):
            Engine(llm, draft=bad)
    with pytest.raises(InputError, match="draft_tokens=0 must be an int >= 1"):
        pyrt.generate(llm, [1, 2], max_new_tokens=2, draft="ngram", draft_tokens=0)
    with pytest.raises(InputError, match="vocab_size"):
        pyrt.generate(llm, [1, 2], max_new_tokens=2, draft=S.stub(vocab=60)[0])
    assert S.free_slots(llm) == 4  # the reservation went back


def test_generate_with_a_draft_reports_passes_and_guesses() -> None:
    llm, _ = S.stub(slots=4, greedy_check=True)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    out = pyrt.generate(llm, [prompt, PROMPTS[0]], max_new_tokens=14, eos_ids=[], draft=drafts("self"))
    assert [r.tokens for r in out] == [want(prompt), want(PROMPTS[0])]
    assert all(r.accepted == r.drafted > 0 and r.tokens_per_pass > 2 and r.acceptance_rate == 1.0 for r in out)
    plain = pyrt.generate(llm, prompt, max_new_tokens=14, eos_ids=[])
    assert (plain.passes, plain.drafted, plain.tokens_per_pass) == (14, 0, 1.0)


def test_the_ngram_index_guesses_what_lookup_guesses() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from pyrt.llm.ngram import NgramIndex

    @settings(max_examples=300)
    @given(st.lists(st.integers(0, 4), min_size=0, max_size=40), st.integers(1, 6), st.integers(1, 4),
           st.integers(0, 3))
    def same(ids: list[int], k: int, max_n: int, cut: int) -> None:
        index = NgramIndex(max_n, 1)
        for i in range(0, len(ids), cut + 1):  # grown in chunks, guessing after each
            index.extend(ids[i:i + cut + 1])
            assert index.guess(k) == lookup(ids[:i + cut + 1], k, max_n, 1)

    same()


def test_drafts_with_a_small_token_budget_or_one_sequence_guess_within_their_bounds() -> None:
    """A draft of 4 slots taking 4 tokens per call catches a 20-token prompt up in chunks; a one-sequence draft
    (last-position logits) guesses for one sequence at a time. The stubs assert their bounds."""
    for draft, slots in ((S.stub(slots=4, tokens_per_step=4, max_rows=4, salt=1, noise=0.5)[0], 4),
                         (S.single(full=False, salt=1, noise=0.5)[0], 1)):
        llm, _ = S.stub(slots=3, greedy_check=True)
        engine = Engine(llm, draft=draft, draft_tokens=3)
        assert run_all(engine, PROMPTS) == [want(p) for p in PROMPTS]
        stats = engine.stats()
        assert 0 < stats["accepted"] < stats["drafted"] and engine.drafter.slots.free == slots


@pytest.mark.parametrize("kind", ["ngram", "other"])
def test_the_stepping_thread_with_a_draft_serves_clients_on_other_threads(kind: str) -> None:
    import threading

    llm, _ = S.stub(slots=3, greedy_check=True)
    draft = drafts(kind, slots=2)
    engine = Engine(llm, draft=draft, draft_tokens=3)
    got: dict[int, list[int]] = {}

    def client(i: int) -> None:
        got[i] = list(engine.submit(PROMPTS[i], GREEDY))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    doomed = engine.submit(PROMPTS[0], SamplingParams(eos_ids=()))
    next(doomed)
    doomed.cancel()
    for t in threads:
        t.join(60)
    assert got == {i: want(p) for i, p in enumerate(PROMPTS)}
    assert doomed.wait(5) and doomed.result is not None and doomed.result.finish_reason in ("cancelled", "cache_full")
    assert S.free_slots(llm) == 3 and (kind == "ngram" or engine.drafter.slots.free == 2)
    stats = engine.stats()
    assert {"draft", "draft_tokens", "drafted", "accepted", "acceptance_rate", "tokens_per_pass"} <= set(stats)
    assert stats["draft_tokens"] == 3 and stats["draft"] == ("ngram" if kind == "ngram" else "stub.pte")
