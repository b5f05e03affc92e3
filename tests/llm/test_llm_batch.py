"""Many sequences, one weight pass: files of several KV-cache slots, pyrt.generate over many prompts,
and pyrt.llm.Engine's continuous batching. Every result equals that prompt's solo run (greedy:
transformers' ``generate`` token for token; sampling: the same seed alone).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import pyrt
import pyrt.llm
from pyrt.errors import BusyError, InputError
from pyrt.sim import simulated_gpus
from pyrt.testing import archs
from tests.fixtures import llm_models as L
from tests.fixtures.eager_slots import as_tree

pytestmark = [pytest.mark.export]


def free_slots(prog: Any) -> int:
    """The program's KV-cache slots that no generation holds."""
    return pyrt.llm.core_loop(prog).published.free_slots

NEW = 12
# (family, builder): reference engines on the simulated GPU, and ExecuTorch's portable kernels on the CPU.
CASES = [("llama", "reference"), ("gpt2", "portable"), ("opt", "reference")]


@contextlib.contextmanager
def opened(exported: L.Exported) -> Iterator[Any]:
    with simulated_gpus(1), pyrt.Program(exported.path) as prog:
        yield prog


@pytest.fixture(scope="module")
def llama4() -> L.Exported:
    return L.batched("llama", "reference")


@pytest.mark.parametrize(("name", "builder"), CASES)
def test_many_prompts_in_one_call_equal_their_solo_runs(name: str, builder: str) -> None:
    exported = L.batched(name, builder)
    want = [list(w) for w in L.solo_greedy(name, NEW)]
    with opened(exported) as prog:
        results = pyrt.generate(prog, L.PROMPTS, max_new_tokens=NEW, eos_ids=[])  # 7 prompts, 4 slots
        assert [r.tokens for r in results] == want
        assert [r.prompt for r in results] == L.PROMPTS and {r.finish_reason for r in results} == {"length"}
        alone = pyrt.generate(prog, L.PROMPTS[2], max_new_tokens=NEW, eos_ids=[])  # one prompt: today's API
        assert alone.tokens == want[2]


def test_the_file_says_its_slots_and_token_budget(llama4: L.Exported) -> None:
    assert llama4.summary.constant_methods["get_max_batch_size"] == L.SLOTS
    assert llama4.summary.constant_methods["get_max_tokens_per_step"] == 16
    assert "slot layout" in llama4.summary.route_reason
    with opened(llama4) as prog:
        conv = pyrt.llm.read_convention(prog)
        assert (conv.layout, conv.slots, conv.tokens_per_step) == ("slots", L.SLOTS, 16)


def test_sampling_draws_per_prompt(llama4: L.Exported) -> None:
    prompts = L.PROMPTS[:5]
    with opened(llama4) as prog:
        together = pyrt.generate(prog, prompts, max_new_tokens=NEW, do_sample=True, temperature=1.5, top_k=20,
                                 seed=[3, 1, 4, 1, 5], eos_ids=[])
        alone = [pyrt.generate(prog, p, max_new_tokens=NEW, do_sample=True, temperature=1.5, top_k=20, seed=s,
                               eos_ids=[]) for p, s in zip(prompts, [3, 1, 4, 1, 5], strict=True)]
        same_seed = pyrt.generate(prog, prompts[:2], max_new_tokens=NEW, do_sample=True, seed=7, eos_ids=[])
        second = pyrt.generate(prog, prompts[1], max_new_tokens=NEW, do_sample=True, seed=7, eos_ids=[])
    assert [r.tokens for r in together] == [r.tokens for r in alone]
    assert len({tuple(r.tokens) for r in together}) > 1  # the draws really differ between prompts
    assert same_seed[1].tokens == second.tokens  # an int seed: every prompt draws as it would alone


def test_sequences_join_and_leave_between_steps_and_cancel_keeps_their_tokens(llama4: L.Exported) -> None:
    want = [list(w) for w in L.solo_greedy("llama", NEW)]
    with opened(llama4) as prog:
        engine = pyrt.llm.Engine(prog)
        with engine.paused():  # the core steps when asked: join and leave at known steps
            first = [engine.submit(p, max_new_tokens=NEW, eos_ids=[]) for p in L.PROMPTS[:3]]
            assert engine.pending == 3 and engine.step() == 3 and engine.running == 3
            for _ in range(3):
                engine.step()
            late = [engine.submit(p, max_new_tokens=NEW, eos_ids=[]) for p in L.PROMPTS[3:]]  # join mid-run
            assert engine.queued == 4  # one slot is free: the next step admits one
            engine.cancel(first[1])
            engine.step()
            assert first[1].result is not None and first[1].result.finish_reason == "cancelled"
            kept = first[1].result.tokens
            assert 0 < len(kept) < NEW and kept == want[1][:len(kept)]
        while engine.pending:
            engine.step()
        done = [s.result for s in first + late]
        assert all(r is not None for r in done)
        assert [r.tokens for i, r in enumerate(done) if i != 1] == [w for i, w in enumerate(want) if i != 1]
        assert free_slots(prog) == L.SLOTS  # every slot given back
        stats = engine.stats()
        assert stats["tokens_generated"] == 6 * NEW + len(kept) and max(map(int, stats["occupancy"])) == L.SLOTS


def test_a_prompt_longer_than_the_token_budget_is_prefilled_in_chunks_beside_decoding(llama4: L.Exported) -> None:
    want = [list(w) for w in L.solo_greedy("llama", NEW)]
    with opened(llama4) as prog:
        engine = pyrt.llm.Engine(prog)
        with engine.paused():
            short = engine.submit(L.PROMPTS[0], max_new_tokens=NEW, eos_ids=[])
            engine.step()
            long = engine.submit(L.PROMPTS[2], max_new_tokens=NEW, eos_ids=[])  # 20 tokens, budget 16 per step
            assert engine.step() == 2 and short.tokens == want[0][:2] and long.tokens == []
            assert engine.step() == 2 and long.tokens == want[2][:1]  # the rest of its prompt, then its first token
        for stream in (short, long):
            stream.wait()
        assert short.result is not None and long.result is not None
        assert (short.result.tokens, long.result.tokens) == (want[0], want[2])


def test_stop_sequences_eos_and_a_full_cache_end_a_generation(llama4: L.Exported) -> None:
    want = list(L.solo_greedy("llama", NEW)[2])
    pair = want[2:4]
    at = next(i for i in range(len(want) - 1) if want[i:i + 2] == pair) + 2  # where the pair first ends
    eos = want[3]
    with opened(llama4) as prog:
        engine = pyrt.llm.Engine(prog)
        stopped = engine.submit(L.PROMPTS[2], max_new_tokens=NEW, eos_ids=[], stop=[[99, 98, 97], pair])
        ended = engine.submit(L.PROMPTS[2], max_new_tokens=NEW, eos_ids=[eos])
        room = L.MAX_SEQ_LEN - len(L.PROMPTS[2])
        full = engine.submit(L.PROMPTS[2], eos_ids=[])  # no cap: until the cache is full
        for stream in (stopped, ended, full):
            stream.wait()
    assert stopped.result is not None and (stopped.result.tokens, stopped.result.finish_reason) == (want[:at], "stop")
    assert ended.result is not None and ended.result.finish_reason == "stop"
    assert ended.result.tokens == want[:want.index(eos) + 1]  # the EOS itself kept, as transformers does
    assert full.result is not None and full.result.finish_reason == "cache_full"
    assert len(full.result.tokens) == room + 1  # the last token's logits need no cache position


def test_a_bad_submission_is_an_input_error_and_disturbs_nobody(llama4: L.Exported) -> None:
    want = list(L.solo_greedy("llama", NEW)[0])
    with opened(llama4) as prog:
        engine = pyrt.llm.Engine(prog, max_queued=1)
        with engine.paused():  # no slot frees while the bound is tried
            running = engine.submit(L.PROMPTS[0], max_new_tokens=NEW, eos_ids=[])
            engine.step()
            for bad, match in (({"top_p": 2.0}, r"top_p=2.0 must be a number in \(0, 1\]"),
                               ({"stop": [[]]}, r"stop\[0\] is empty"), ({"stop": "x"}, "must be a list"),
                               ({"max_new_tokens": 0}, "max_new_tokens=0 must be an int >= 1")):
                with pytest.raises(InputError, match=match):
                    engine.submit([1, 2], **bad)
            with pytest.raises(InputError, match=r"prompt_ids\[1\]=1000 is outside the vocabulary"):
                engine.submit([1, 1000])
            holders = [engine.submit([7 + i], max_new_tokens=2) for i in range(L.SLOTS - 1)]  # the free slots' takers
            waiting = engine.submit([7], max_new_tokens=2)  # the queue's one place: it waits for a slot
            with pytest.raises(BusyError, match="max_queued=1"):
                engine.submit([7], max_new_tokens=2)
        for stream in (running, *holders, waiting):
            stream.wait()
    assert running.result is not None and running.result.tokens == want
    assert waiting.result is not None and len(waiting.result.tokens) == 2


def test_a_dropped_stream_is_cancelled_and_gives_its_slot_back(llama4: L.Exported) -> None:
    with opened(llama4) as prog:
        engine = pyrt.llm.Engine(prog)
        with engine.paused():
            kept = engine.submit(L.PROMPTS[0], max_new_tokens=NEW, eos_ids=[])
            dropped = engine.submit(L.PROMPTS[1], max_new_tokens=NEW, eos_ids=[])
            engine.step()
            assert engine.running == 2 and free_slots(prog) == L.SLOTS - 2
            del dropped  # e.g. a client that went away: nobody can read its tokens any more
            engine.step()  # the cancellation its drop posted is applied first
            assert engine.running == 1 and free_slots(prog) == L.SLOTS - 1
        kept.wait()
        assert free_slots(prog) == L.SLOTS


def test_a_failed_run_ends_the_generations_it_carried_and_the_engine_goes_on(llama4: L.Exported) -> None:
    want = list(L.solo_greedy("llama", NEW)[1])
    with simulated_gpus(1) as sim, pyrt.Program(llama4.path) as prog:
        engine = pyrt.llm.Engine(prog)
        with engine.paused():
            doomed = engine.submit(L.PROMPTS[0], max_new_tokens=NEW, eos_ids=[])
            engine.step()
            sim.tensorrt.inject_failure("execute_async_v3")
            assert engine.step() == 1
            with pytest.raises(pyrt.PyrtError, match="execute_async_v3"):
                list(doomed)
        fine = engine.submit(L.PROMPTS[1], max_new_tokens=NEW, eos_ids=[])
        assert list(fine) == want and free_slots(prog) == L.SLOTS


@pytest.mark.parametrize("kernels", ["numpy", "torch"])
def test_portable_slot_files_run_in_executorchs_own_runtime(kernels: str) -> None:
    """Two steps, the second reading what the first wrote: the cache updates in place (index_put_) on both."""
    from executorch.runtime import Runtime

    exported = L.batched("gpt2", "portable")
    steps = [([5, 6, 7], [0, 0, 0], [0, 1, 2], [2], range(3)), ([8, 9, 10, 11], [0, 2, 2, 2], [3, 0, 1, 2], [0, 3],
                                                                range(8))]  # a window past the positions: masked
    method = Runtime.get().load_program(str(exported.path)).load_method("forward")
    import torch

    with pyrt.Program(exported.path, kernels=kernels) as prog:
        for step in steps:
            inputs = as_tree(step)  # files written now verify trees: each token's row and visible rows too
            ours = np.asarray(prog.run(*inputs))
            theirs = method.execute([torch.from_numpy(a) for a in inputs])[0].numpy()
            np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
            assert ours.shape == (len(step[3]), archs.VOCAB)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(archs.LLM_FAMILIES))
def test_every_family_batches_as_its_solo_runs(name: str) -> None:
    exported = L.batched(name, "reference")
    with opened(exported) as prog:
        results = pyrt.generate(prog, L.PROMPTS, max_new_tokens=NEW, eos_ids=[])
    assert [r.tokens for r in results] == [list(w) for w in L.solo_greedy(name, NEW)]


def test_inspect_shows_the_constant_methods_values(llama4: L.Exported) -> None:
    import json
    import subprocess
    import sys

    info = pyrt.inspect(llama4.path)
    answers = {m["name"]: m["output_specs"] for m in info["methods"] if not m["inputs"]}
    assert answers["get_max_batch_size"] == [{"kind": "Int", "value": L.SLOTS}]
    assert answers["get_max_tokens_per_step"] == [{"kind": "Int", "value": 16}]
    assert answers["get_max_seq_len"] == [{"kind": "Int", "value": L.MAX_SEQ_LEN}]
    assert answers["use_kv_cache"] == [{"kind": "Bool", "value": True}]
    text = subprocess.run([sys.executable, "-m", "pyrt", "inspect", str(llama4.path)], capture_output=True,
                          text=True, timeout=120, check=True).stdout
    assert "[0] Int = 4" in text and f"get_max_batch_size = {L.SLOTS}; get_max_tokens_per_step = 16" in text
    as_json = json.loads(subprocess.run([sys.executable, "-m", "pyrt", "inspect", "--json", str(llama4.path)],
                                        capture_output=True, text=True, timeout=120, check=True).stdout)
    assert {m["name"]: m["output_specs"] for m in as_json["methods"]}["get_eos_ids"] == [{"kind": "Int", "value": 2}]


def test_tensorrt_rtx_builds_a_slot_file_as_one_engine_with_a_dynamic_token_count(tmp_path: Any) -> None:
    """It builds here without a GPU (TensorRT-RTX builds ahead of time); no GPU lent to us can run it."""
    pytest.importorskip("tensorrt_rtx")
    from pyrt.export import decoder_to_pte

    summary = decoder_to_pte(archs.causal_lm("llama"), tmp_path / "m.pte", max_seq_len=24, max_batch_size=2,
                             max_tokens_per_step=8, builder="tensorrt_rtx", progress=False)
    assert len(summary.engines) == 1 and summary.fallback_ops == {}, summary
    info = pyrt.inspect(tmp_path / "m.pte")
    forward = next(m for m in info["methods"] if m["name"] == "forward")
    assert forward["instruction_counts"]["DelegateCall"] == 1
    assert [s["shape"] for s in forward["input_specs"]] == [[8], [8], [8], [8], [8], [24], [8, 24]]  # tokens, slots,
    # positions, writes, rows (up to the token budget), window, visible
    bindings = forward["delegates"][0]["tensorrt"]
    shapes = {tuple(i.shape) for i in summary.engines[0].inputs}
    assert bindings["inputs"][0] == "input_0" and {(-1,), (-1, -1)} <= shapes  # tokens: dynamic; visible [T, W]
