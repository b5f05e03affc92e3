"""Tree speculation on stand-in programs, in milliseconds: rows of a slot apart from positions, tree masks, growth,
verification, and engines with a tree draft whose greedy tokens equal plain greedy (tests/fixtures/tree_stub.py
refuses any read of a row a token may not see)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import pyrt
from pyrt.errors import InputError, TreeUnsupportedError
from pyrt.llm import Engine, SamplingParams
from pyrt.llm.config import GenerationConfig
from pyrt.llm.guesses import Proposal, fill
from pyrt.llm.rows import Placed, RowMap, ancestry, depths, feed_parents, tree_inputs
from pyrt.llm.tree import TreeGrower
from pyrt.llm.tree_verify import verify_tree
from tests.fixtures import stub_llm as S
from tests.fixtures import tree_stub as T

PROMPTS = [[5, 6, 7, 8, 9], [11, 12], list(range(20, 40)), [3], [30, 31, 32], [40, 41, 42, 43], [44, 45, 46]]
GREEDY = SamplingParams(max_new_tokens=14, eos_ids=())


def want(prompt: list[int], params: SamplingParams = GREEDY, conv: Any = None) -> list[int]:
    return S.reference(prompt, params, conv or T.convention())


def run_all(engine: Engine, prompts: list[list[int]], params: SamplingParams = GREEDY) -> list[list[int]]:
    streams = [engine.submit(p, params) for p in prompts]
    while engine.pending:
        engine.step()
    assert all(s.error is None for s in streams), [s.error for s in streams]
    return [s.result.tokens for s in streams if s.result]


def draft(kind: str, slots: int = 4) -> Any:
    """A chain-layout stub draft: "self" (the target's own logits), "near" (mostly agrees), "other" (mostly not)."""
    noise = {"self": None, "near": 0.5, "other": None}[kind]
    return S.stub(slots=slots, salt=0 if kind != "other" else 1, noise=noise, tokens_per_step=64)[0]


# -- rows, masks, trees: the pure parts ---------------------------------------------------------------


def test_a_row_map_keeps_accepted_rows_and_frees_rejected_ones() -> None:
    m = RowMap(10)
    assert m.place(0, 4) == [0, 1, 2, 3]  # a prompt: row p for position p
    assert m.place(4, 5) == [4, 5, 6, 7, 8]  # a root and four guesses
    m.keep([0, 2, 4])
    assert m.rows == [0, 1, 2, 3, 4, 6, 8]
    assert m.place(7, 3) == [5, 7, 9]  # the rejected rows come back, lowest first
    m.keep([0])
    assert m.rows == [0, 1, 2, 3, 4, 6, 8, 5]
    assert m.place(3, 2) == [3, 4]  # a feed from an earlier position lets go of what followed it
    m.rows = list(range(8))
    with pytest.raises(pyrt.PyrtError, match="3 tokens fed at position 8 but the slot has 2 free rows of 10"):
        m.place(8, 3)


def test_tree_parents_depths_and_ancestry() -> None:
    assert feed_parents(3, None, 2) == [-1, 0, 1]  # a chain
    assert feed_parents(4, (-1, -1, 0), 3) == [-1, 0, 0, 1]  # the root, two children of it, a grandchild
    assert depths([-1, 0, 0, 1]) == [0, 1, 1, 2]
    assert ancestry([-1, 0, 0, 1]).tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]
    with pytest.raises(pyrt.PyrtError, match="parent 2 does not come before it"):
        depths([-1, 2, 0])


def test_tree_inputs_let_each_token_read_its_accepted_rows_and_ancestors_only() -> None:
    tree = Placed(slot=1, start=3, tokens=(7, 8, 9, 10), parents=(-1, 0, 0, 1), accepted=(0, 2, 5),
                  writes=(1, 3, 4, 6), logits=4)
    prompt = Placed(slot=0, start=0, tokens=(4, 5), parents=(-1, 0), accepted=(), writes=(0, 1), logits=1)
    tokens, slots, positions, writes, rows, window, visible = tree_inputs([tree, prompt], 8)
    assert tokens.tolist() == [7, 8, 9, 10, 4, 5] and slots.tolist() == [1, 1, 1, 1, 0, 0]
    assert positions.tolist() == [3, 4, 4, 5, 0, 1]  # siblings share a position, not a row
    assert writes.tolist() == [1, 3, 4, 6, 0, 1] and rows.tolist() == [0, 1, 2, 3, 5] and window.tolist() == list(
        range(8))
    assert [np.flatnonzero(v).tolist() for v in visible] == [[0, 1, 2, 5], [0, 1, 2, 3, 5], [0, 1, 2, 4, 5],
                                                             [0, 1, 2, 3, 5, 6], [0], [0, 1]]


def test_best_first_growth_takes_the_likeliest_paths_within_the_size() -> None:
    g = TreeGrower(size=4, width=2)
    g.offer(-1, np.array([0.0, 0.7, 0.2, 0.1]))  # children 1 (0.7) and 2 (0.2)
    assert g.pop() == 0
    g.offer(0, np.array([0.5, 0.0, 0.0, 0.5]))  # under 1: 0 and 3, 0.35 each
    assert [g.pop(), g.pop(), g.pop(), g.pop()] == [1, 2, 3, None]  # 0.35, 0.35, then 2 (0.2); full
    assert g.proposal() == Proposal((1, 0, 3, 2), None, (-1, 0, 0, -1)) or g.proposal().parents == (-1, 0, 0, -1)
    assert g.path(2) == (1, 3) and g.depths == [1, 2, 2, 1]
    deep = TreeGrower(size=5, width=1, max_depth=2)
    deep.offer(-1, np.array([1.0]))
    deep.pop()
    deep.offer(0, np.array([1.0]))
    deep.pop()
    deep.offer(1, np.array([1.0]))  # depth 3: past max_depth, not offered
    assert deep.pop() is None


def test_a_tree_proposal_keeps_a_tree_when_cut_or_filled() -> None:
    tree = Proposal((4, 5, 6), None, (-1, -1, 0))
    assert tree.head(2) == Proposal((4, 5), None, (-1, -1)) or tree.head(2).parents == (-1, -1)
    filled = fill(tree, 9, 5, 10)
    assert filled.tokens == (4, 5, 6, 6, 6) and filled.parents == (-1, -1, 0, 2, 3)


def test_greedy_tree_verification_follows_the_targets_argmax_down_the_tree() -> None:
    rows = np.full((5, 6), -5.0)
    rows[0, 2] = rows[2, 4] = rows[4, 1] = rows[1, 0] = rows[3, 3] = 5.0  # argmax after: root 2, ...
    guesses, parents = (3, 2, 5, 4), (-1, -1, 1, 1)  # root: 3 and 2; under 2: 5 and 4
    rng = np.random.default_rng(0)
    assert verify_tree(rows, guesses, parents, GREEDY, rng) == ((1, 3), (2, 4, 1))
    assert verify_tree(rows, (3, 5, 1, 1), (-1, -1, 0, 1), GREEDY, rng) == ((), (2,))  # no child of the root
    with pytest.raises(InputError, match="a tree of 2 guesses"):
        verify_tree(rows, (1, 2), (-1, 0), GREEDY, rng)


def test_sampled_tree_verification_is_the_targets_distribution() -> None:
    """Chi-square of the first token of one tree check against the target's p: siblings tried in turn, each
    rejected token's mass gone (a draft that guesses its likeliest tokens and an unlikely one)."""
    from scipy.stats import chisquare

    p = np.array([0.05, 0.4, 0.25, 0.2, 0.1])
    rows = np.tile(np.log(p), (4, 1))
    params = SamplingParams(do_sample=True)
    rng = np.random.default_rng(1)
    n = 20000
    counts = np.zeros(5)
    for _ in range(n):
        _, tokens = verify_tree(rows, (1, 4, 2), (-1, -1, -1), params, rng)
        counts[tokens[0]] += 1
    assert chisquare(counts, p * n).pvalue > 1e-3
    for _ in range(2000):  # a path through a child: its second token follows the child's row
        path, tokens = verify_tree(rows, (1, 4, 2), (-1, -1, -1), params, rng)
        assert len(path) == 1 and tokens[0] == (1, 4, 2)[path[0]] or not path


# -- engines: greedy equals plain greedy -------------------------------------------------------------


@pytest.mark.parametrize("kind", ["self", "near", "other"])
@pytest.mark.parametrize("slots", [1, 4])
def test_greedy_with_a_tree_equals_greedy_without(kind: str, slots: int) -> None:
    llm, lm = T.stub(slots=slots)
    engine = Engine(llm, draft=draft(kind), draft_tokens=8, draft_tree=True)
    prompts = PROMPTS + [[1, 2, 3, 1, 2, 3, 1, 2]]
    assert run_all(engine, prompts) == [want(p) for p in prompts]
    stats = engine.stats()
    assert stats["drafted"] > 0 and 0 <= stats["accepted"] <= stats["drafted"] and S.free_slots(llm) == slots
    assert stats["tokens_generated"] == 14 * len(prompts) and max(lm.calls) <= 64
    if kind == "self":
        assert stats["tokens_per_pass"] > 1.7  # every pass past the first accepts its top child at least


def test_a_chain_on_a_tree_file_writes_row_p_for_position_p() -> None:
    llm, lm = T.stub(slots=2)
    engine = Engine(llm, draft=draft("near"), draft_tokens=4)  # a chain: parents None
    assert run_all(engine, PROMPTS[:3]) == [want(p) for p in PROMPTS[:3]]
    assert (lm.positions[lm.positions >= 0] == np.nonzero(lm.positions >= 0)[1]).all()


def test_a_tree_asked_of_a_file_that_cannot_verify_one_is_a_typed_error_naming_it() -> None:
    llm, _ = S.stub(slots=2)
    with pytest.raises(TreeUnsupportedError, match="draft_tree=True: stub.pte cannot verify a tree"):
        Engine(llm, draft="ngram", draft_tree=True)
    with pytest.raises(InputError, match="draft_tree=True needs a draft"):
        GenerationConfig(draft_tree=True)
    with pytest.raises(InputError, match="draft_tree=1 must be True or False"):
        GenerationConfig(draft="ngram", draft_tree=1)


def test_the_serve_command_line_takes_draft_tree() -> None:
    import argparse

    from pyrt.serve.flags import add_flags, configs

    parser = argparse.ArgumentParser()
    add_flags(parser)
    cfg, _ = configs(vars(parser.parse_args(["m.pte", "--draft", "ngram", "--draft-tree", "--draft-tokens", "32"])))
    assert cfg.generation.draft_tree is True and cfg.generation.draft_tokens == 32
    assert configs(vars(parser.parse_args(["m.pte", "--draft", "ngram"])))[0].generation.draft_tree is False
    with pytest.raises(InputError, match="--draft-tree=True needs a draft"):
        configs(vars(parser.parse_args(["m.pte", "--draft-tree"])))


def test_the_generate_command_line_takes_draft_tree() -> None:
    from pyrt.tools.cli_args import parser

    args = parser().parse_args(["generate", "m.pte", "--prompt-ids", "1,2", "--draft", "ngram", "--draft-tree"])
    assert args.draft_tree is True
    assert parser().parse_args(["generate", "m.pte", "--prompt-ids", "1,2"]).draft_tree is None  # the default


# -- engines: ends inside a path, cancel, a full cache ------------------------------------------------


def self_draft(slots: int = 4, **kw: Any) -> Any:
    """The target's own logits as a chain-layout draft: its likeliest child is always the target's argmax."""
    return S.stub(slots=slots, tokens_per_step=64, **kw)[0]


def test_eos_and_stop_sequences_inside_an_accepted_path_end_it_there() -> None:
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    full = want(prompt)
    eos, pair = full[3], full[5:7]
    llm, _ = T.stub(slots=2)
    engine = Engine(llm, draft=self_draft(), draft_tokens=8, draft_tree=True)
    ended = engine.submit(prompt, max_new_tokens=14, eos_ids=[eos])
    stopped = engine.submit(prompt, max_new_tokens=14, eos_ids=(), stop=[pair])
    while engine.pending:
        engine.step()
    assert ended.result is not None and ended.result.tokens == full[:full.index(eos) + 1]
    at = next(i for i in range(len(full)) if full[i:i + 2] == pair) + 2
    assert stopped.result is not None and (stopped.result.tokens, stopped.result.finish_reason) == (full[:at], "stop")
    assert S.free_slots(llm) == 2


def test_max_new_tokens_and_a_full_cache_inside_a_path_are_never_passed() -> None:
    llm, lm = T.stub(slots=1, context=16)
    engine = Engine(llm, draft=self_draft(1, context=16), draft_tokens=8, draft_tree=True)
    conv = T.convention(slots=1, context=16)
    capped = engine.submit([1, 2, 3], max_new_tokens=6, eos_ids=())
    while engine.pending:
        engine.step()
    assert capped.result is not None and capped.result.tokens == want([1, 2, 3], SamplingParams(
        max_new_tokens=6, eos_ids=()), conv) and capped.result.finish_reason == "length"
    assert max(lm.windows) <= 16
    full = engine.submit([1, 2, 3], eos_ids=())
    full.wait()
    assert full.result is not None and full.result.finish_reason == "cache_full"
    assert full.result.tokens == want([1, 2, 3], SamplingParams(eos_ids=()), conv)
    assert engine.stats()["checks"] > 0


def test_sequences_join_and_leave_mid_run_and_cancel_frees_slots_and_rows() -> None:
    llm, _ = T.stub(slots=3)
    draft_loop, _ = S.stub(slots=2, salt=1, tokens_per_step=64)  # fewer draft slots: a third decodes without
    engine = Engine(llm, draft=draft_loop, draft_tokens=6, draft_tree=True)
    with engine.paused():
        first = [engine.submit(p, GREEDY) for p in PROMPTS[:3]]
        for _ in range(3):
            engine.step()
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
    assert all(len(m.rows) <= 40 for m in llm.core.runner.maps.values())  # a slot's rows: its last sequence's


def test_a_tree_draft_file_keeps_its_own_rows_apart_too() -> None:
    """A draft that itself verifies trees (rows of its own per sequence): growing a tree rolls its cache back and
    forth between siblings' paths, and the target's tokens stay plain greedy's."""
    llm, _ = T.stub(slots=2)
    draft_loop, draft_lm = T.stub(slots=2, salt=0)
    engine = Engine(llm, draft=draft_loop, draft_tokens=8, draft_tree=True)
    assert run_all(engine, PROMPTS[:4]) == [want(p) for p in PROMPTS[:4]]
    assert engine.stats()["accepted"] > 0 and len(draft_lm.calls) > 0


def test_stats_report_the_tree_size_accepted_depth_and_tokens_per_pass() -> None:
    llm, _ = T.stub(slots=2)
    engine = Engine(llm, draft=self_draft(), draft_tokens=8, draft_tree=True)
    run_all(engine, PROMPTS[:2])
    stats = engine.stats()
    assert stats["draft_tree"] is True and stats["draft_tokens"] == 8
    depth = stats["accepted_depth"]
    assert depth == pytest.approx(stats["accepted"] / stats["checks"]) and depth >= 1
    passes = stats["tokens_generated"] - stats["accepted"]  # each pass: its accepted path, then one token
    assert stats["tokens_generated"] == 28 and stats["tokens_per_pass"] == pytest.approx(28 / passes)


def test_measured_acceptance_shapes_trees_by_rank() -> None:
    from pyrt.llm.tree import MIN_VISITS, Acceptance

    grown = TreeGrower(size=3, width=2)
    grown.offer(-1, np.array([0.0, 0.6, 0.4]))  # ranks: 1, 2
    grown.pop()
    grown.offer(0, np.array([0.5, 0.0, 0.5]))  # under 1: ranks 0, 2
    acceptance = Acceptance(width=2)
    acceptance.observe(grown, (1, 2, 7))  # rank 0 at the root, rank 1 under it; then a leaf: the walk ends
    assert acceptance.visits == 2 and acceptance.hits.tolist() == [1, 1]
    acceptance.observe(grown, (9,))  # a visit, no hit
    assert acceptance.visits == 3 and acceptance.rates() is None  # too few to shape a tree yet
    acceptance.visits = MIN_VISITS
    acceptance.hits[:] = (MIN_VISITS - 1, 0)
    rates = acceptance.rates()
    assert rates is not None and rates[0] > 0.8 > 0.1 > rates[1]
    deep = TreeGrower(size=3, width=2, rates=rates)  # a confident top child: a chain, not siblings
    deep.offer(-1, np.array([0.0, 0.34, 0.33, 0.33]))
    for node in range(2):
        deep.pop()
        deep.offer(node, np.array([0.0, 0.34, 0.33, 0.33]))
    deep.pop()
    assert deep.parents == [-1, 0, 1]


def test_a_node_whose_children_cannot_enter_the_tree_is_not_expanded() -> None:
    g = TreeGrower(size=3, width=3, rates=np.array([0.5, 0.3, 0.2]))
    g.offer(-1, np.array([0.5, 0.3, 0.2]))  # scores by rank: 0.5, 0.3, 0.2
    first = g.pop()
    assert first is not None and g.worth_expanding(first)  # its best child (0.25) beats the 0.2 one
    second = g.pop()  # the 0.3 sibling: its best child (0.15) loses to the 0.2 one, and one place is left
    assert second is not None and not g.worth_expanding(second)


def test_a_trees_size_is_bounded_by_its_slots_rows_not_by_max_new_tokens() -> None:
    from pyrt.llm import make_request
    from pyrt.llm.scheduler import Sequence, guess_cap

    conv = T.convention()
    seq = Sequence(1, make_request(conv, [1, 2, 3], SamplingParams(max_new_tokens=4)), max_guesses=8)
    seq.new = [5]
    assert guess_cap(seq, conv) == 2  # a chain: at most the new tokens left, less the one after it
    seq.tree = True
    assert guess_cap(seq, conv) == S.CONTEXT - 1 - 3  # a tree: the rows left (one path of it is kept at most)
    seq.new = [5, 6, 7, 8]
    assert guess_cap(seq, conv) == 0


@pytest.mark.parametrize("kind", ["self", "near"])
def test_a_tree_after_a_cached_prefix_reads_the_rows_its_slot_kept(kind: str) -> None:
    """Prefix caching and trees together: a second turn extending the first (its prompt, its answer, two more
    tokens) is fed from what its slot kept, at the rows the tree wrote them (apart from their positions); the
    stub refuses any wrong row, and the greedy tokens equal plain greedy."""
    llm, _ = T.stub(slots=2)
    engine = Engine(llm, draft=draft(kind), draft_tokens=8, draft_tree=True)
    first = run_all(engine, PROMPTS[:2])
    turns = [p + out + [17, 23] for p, out in zip(PROMPTS[:2], first, strict=True)]
    assert run_all(engine, turns) == [want(t) for t in turns]
    stats = engine.stats()
    assert stats["prefix_cache_hits"] >= sum(len(p) + len(out) - 1 for p, out in zip(PROMPTS[:2], first, strict=True))
