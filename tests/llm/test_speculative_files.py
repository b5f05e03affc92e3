"""Speculative decoding on exported files: greedy tokens with a draft (prompt lookup, the target itself, a smaller
draft file) equal transformers' greedy decoding, on slot files written now (a logits row per token), older ones
(rows bounded by the slots: fewer guesses), one-sequence files (logits of every position, or the last only), in
pyrt's runtime and ExecuTorch's."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import pyrt
import pyrt.llm
from pyrt.errors import TreeUnsupportedError
from pyrt.sim import simulated_gpus
from pyrt.testing import archs
from tests.fixtures import llm_models as L
from tests.fixtures.eager_slots import as_tree

pytestmark = pytest.mark.export

NEW = 12
ECHO = [5, 6, 7, 8, 9, 10, 11, 5, 6, 7, 8, 9]  # repeats itself: prompt lookup has something to guess from


@contextlib.contextmanager
def opened(*paths: Any) -> Iterator[list[Any]]:
    with simulated_gpus(1), contextlib.ExitStack() as stack:
        yield [stack.enter_context(pyrt.Program(p)) for p in paths]


def want(name: str) -> list[list[int]]:
    model = archs.causal_lm(name)
    return [list(w) for w in L.solo_greedy(name, NEW)] + [archs.greedy(model, ECHO, NEW)]


def test_slot_files_return_a_logits_row_per_token() -> None:
    exported = L.batched("llama", "reference")
    info = pyrt.inspect(exported.path)
    forward = next(m for m in info["methods"] if m["name"] == "forward")
    assert [s["shape"] for s in forward["input_specs"]][:4] == [[16], [16], [16], [16]]
    with opened(exported.path) as (prog,):
        conv = pyrt.llm.read_convention(prog)
        assert (conv.slots, conv.max_rows) == (L.SLOTS, 16)
        assert pyrt.llm.Engine(prog, draft="ngram", draft_tokens=8).max_guesses == 8


@pytest.mark.parametrize("draft", ["ngram", "itself", "small"])
def test_greedy_with_a_draft_equals_transformers_at_batch_1_and_4(draft: str) -> None:
    exported = L.batched("llama", "reference")
    paths = [exported.path] + ([exported.path] if draft == "itself" else [L.draft("llama")] if draft == "small"
                               else [])
    prompts, wanted = L.PROMPTS + [ECHO], want("llama")
    with opened(*paths) as progs:
        guess: Any = progs[1] if len(progs) > 1 else draft
        alone = pyrt.generate(progs[0], ECHO, max_new_tokens=NEW, eos_ids=[], draft=guess, draft_tokens=4)
        many = pyrt.generate(progs[0], prompts, max_new_tokens=NEW, eos_ids=[], draft=guess, draft_tokens=4)
    assert alone.tokens == wanted[-1] and [r.tokens for r in many] == wanted
    assert alone.drafted > 0 and sum(r.drafted for r in many) > 0
    if draft == "itself":
        assert alone.accepted == alone.drafted and alone.tokens_per_pass == 3.0  # 12 tokens: 1, 5, 5, 1
    if draft == "small":  # the target's first layer: its guesses are right at times, wrong at others
        assert 0 < sum(r.accepted for r in many) < sum(r.drafted for r in many)


def test_joining_leaving_eos_and_stop_inside_accepted_runs() -> None:
    exported = L.batched("llama", "reference")
    wanted = want("llama")
    full = wanted[2]
    eos, pair = full[6], full[3:5]
    with opened(exported.path, exported.path) as (prog, draft):
        engine = pyrt.llm.Engine(prog, draft=draft, draft_tokens=4)  # the target as its own draft: all accepted
        with engine.paused():
            first = [engine.submit(p, max_new_tokens=NEW, eos_ids=[]) for p in L.PROMPTS[:2]]
            engine.step()
            engine.step()
            ended = engine.submit(L.PROMPTS[2], max_new_tokens=NEW, eos_ids=[eos])
            stopped = engine.submit(L.PROMPTS[2], max_new_tokens=NEW, eos_ids=[], stop=[pair])
            engine.cancel(first[1])
        while engine.pending:
            engine.step()
        stats = engine.stats()
    assert first[0].result is not None and first[0].result.tokens == wanted[0]
    cut = first[1].result.tokens if first[1].result else None
    assert cut is not None and cut == wanted[1][:len(cut)]
    assert ended.result is not None and ended.result.tokens == full[:full.index(eos) + 1]
    at = next(i for i in range(len(full)) if full[i:i + 2] == pair) + 2
    assert stopped.result is not None and stopped.result.tokens == full[:at]
    assert stats["accepted"] == stats["drafted"] > 0 and stats["tokens_per_pass"] > 2


def test_an_older_file_checks_guesses_in_its_spare_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file whose rows are bounded by its slots (as written before): 3 guesses beside one sequence, none beside 4."""
    from pyrt.export import decoder_to_pte
    from pyrt.export._graph import slot_decoder

    real, real_wrap = slot_decoder.export, slot_decoder.wrap
    monkeypatch.setattr(slot_decoder, "export", lambda module, tokens, seq: real(module, tokens, seq,
                                                                                 max_rows=module.max_batch_size))
    monkeypatch.setattr(slot_decoder, "wrap", lambda model, seq, slots: real_wrap(model, seq, slots, tree=False))
    path = tmp_path / "old.pte"
    decoder_to_pte(archs.causal_lm("gpt2"), path, max_seq_len=L.MAX_SEQ_LEN, builder="portable",
                   max_batch_size=L.SLOTS, max_tokens_per_step=16, progress=False)
    wanted = want("gpt2")
    with pyrt.Program(path) as prog, pyrt.Program(path) as draft:
        assert pyrt.llm.read_convention(prog).max_rows == L.SLOTS and not pyrt.llm.read_convention(prog).tree
        with pytest.raises(TreeUnsupportedError, match=f"draft_tree=True: {path} cannot verify a tree"):
            pyrt.llm.Engine(prog, draft=draft, draft_tree=True)
        engine = pyrt.llm.Engine(prog, draft=draft, draft_tokens=8)
        assert engine.max_guesses == L.SLOTS - 1
        alone = pyrt.generate(prog, ECHO, max_new_tokens=NEW, eos_ids=[], draft=draft, draft_tokens=8)
        full = pyrt.generate(prog, L.PROMPTS[:4], max_new_tokens=NEW, eos_ids=[], draft=draft, draft_tokens=8)
    assert alone.tokens == wanted[-1] and alone.drafted > 0 and alone.tokens_per_pass > 2
    assert [r.tokens for r in full] == wanted[:4]


def test_executorchs_runtime_returns_more_rows_than_slots() -> None:
    from executorch.runtime import Runtime

    exported = L.batched("gpt2", "portable")
    steps = [([5, 6, 7, 8, 9], [0, 0, 0, 1, 1], [0, 1, 2, 0, 1], [0, 1, 2, 3, 4], range(3)),
             ([10, 11, 12, 13, 14, 15], [0, 0, 0, 1, 1, 1], [3, 4, 5, 2, 3, 4], [0, 1, 2, 3, 4, 5], range(6))]
    method = Runtime.get().load_program(str(exported.path)).load_method("forward")
    with pyrt.Program(exported.path) as prog:
        for step in steps:
            inputs = as_tree(step)
            ours = np.asarray(prog.run(*inputs))
            theirs = method.execute([torch.from_numpy(a) for a in inputs])[0].numpy()
            np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
            assert ours.shape == (len(step[3]), archs.VOCAB) and len(step[3]) > L.SLOTS


def test_one_sequence_files_verify_when_their_logits_cover_every_position(tmp_path: Path) -> None:
    exported = L.exported("llama", "reference")
    wanted = archs.greedy(exported.model, ECHO, NEW)
    with opened(exported.path) as (prog,):
        assert pyrt.llm.read_convention(prog).max_rows == L.MAX_SEQ_LEN
        out = pyrt.generate(prog, ECHO, max_new_tokens=NEW, eos_ids=[], draft="ngram", draft_tokens=4)
    assert out.tokens == wanted and out.drafted > 0
    path = last_position_file(tmp_path)
    with pyrt.Program(path) as prog:
        assert pyrt.llm.read_convention(prog).max_rows == 1
        engine = pyrt.llm.Engine(prog, draft="ngram")
        assert engine.max_guesses == 0
        stream = engine.submit(ECHO, max_new_tokens=NEW, eos_ids=[])
        stream.wait()
    assert stream.result is not None and stream.result.tokens == wanted and engine.stats()["drafted"] == 0


def last_position_file(tmp_path: Path) -> Path:
    """Llama exported as ExecuTorch's llama export writes it without full logits: ``[1, vocab]``."""
    from executorch.exir import to_edge

    from pyrt.export._graph import hf_decoder
    from pyrt.export.decoder import constant_methods

    model = archs.causal_lm("llama")
    inner = hf_decoder.wrap("pyrt", model, L.MAX_SEQ_LEN, 1)

    class LastPosition(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
            return self.inner(tokens, input_pos)[:, -1]

    seq = torch.export.Dim("seq", min=1, max=L.MAX_SEQ_LEN - 1)
    with torch.no_grad():
        program = torch.export.export(LastPosition(), (torch.tensor([[1, 2]]), torch.tensor([0, 1])),
                                      dynamic_shapes=({1: seq}, {0: seq}), strict=False)
    path = tmp_path / "last.pte"
    path.write_bytes(to_edge(program, constant_methods=constant_methods(model, L.MAX_SEQ_LEN, True))
                     .to_executorch().buffer)
    return path


@pytest.mark.parametrize("builder", ["reference", "portable"])
def test_greedy_with_a_tree_draft_equals_transformers_on_files_written_now(builder: str) -> None:
    """Files written now verify trees: a tree of 12 guesses from the one-layer draft, alone and as a batch."""
    exported = L.batched("llama", builder)
    prompts, wanted = L.PROMPTS + [ECHO], want("llama")
    with opened(exported.path, L.draft("llama")) as (prog, draft):
        assert pyrt.llm.read_convention(prog).tree
        alone = pyrt.generate(prog, ECHO, max_new_tokens=NEW, eos_ids=[], draft=draft, draft_tokens=12,
                              draft_tree=True)
        many = pyrt.generate(prog, prompts, max_new_tokens=NEW, eos_ids=[], draft=draft, draft_tokens=12,
                             draft_tree=True)
    assert alone.tokens == wanted[-1] and [r.tokens for r in many] == wanted
    assert 0 < sum(r.accepted for r in many) < sum(r.drafted for r in many)


def test_seeded_sampling_with_a_draft_file_is_the_same_run_to_run() -> None:
    exported = L.batched("llama", "reference")
    with opened(exported.path, L.draft("llama")) as (prog, draft):
        # without prefix caching: the second run's prompts would be cached, and a step's guesses depend on the
        # prompt tokens it still feeds (sampled tokens with a draft follow the schedule, their distribution does not)
        runs = [pyrt.generate(prog, L.PROMPTS[:3], max_new_tokens=NEW, do_sample=True, temperature=1.3, top_k=30,
                              seed=[1, 2, 3], eos_ids=[], draft=draft, prefix_caching=False) for _ in range(2)]
    assert [r.tokens for r in runs[0]] == [r.tokens for r in runs[1]]
    assert sum(r.drafted for r in runs[0]) > 0 and len({tuple(r.tokens) for r in runs[0]}) == 3


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(archs.LLM_FAMILIES))
def test_every_family_decodes_greedy_with_a_draft(name: str) -> None:
    exported = L.batched(name, "reference")
    prompts, wanted = L.PROMPTS + [ECHO], want(name)
    with opened(exported.path, exported.path) as (prog, itself):
        for draft in ("ngram", itself):
            out = pyrt.generate(prog, prompts, max_new_tokens=NEW, eos_ids=[], draft=draft, draft_tokens=4)
            assert [r.tokens for r in out] == wanted, draft
