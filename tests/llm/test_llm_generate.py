"""pyrt.generate: greedy, seeded sampling (reproducible, distributed as the softmax), streaming,
stop reasons, and typed errors raised before any forward run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import pyrt
import pyrt.llm
from pyrt.errors import InputError
from pyrt.llm.params import SamplingParams
from pyrt.llm.sampling import probabilities, sample
from pyrt.testing import archs
from tests.fixtures import llm_models as L


@pytest.fixture(scope="module")
def llama() -> L.Exported:
    return L.exported("llama", "portable", route="pyrt")


@pytest.fixture
def prog(llama: L.Exported) -> Any:
    with pyrt.Program(llama.path) as p:
        yield p


@pytest.mark.export
def test_stream_yields_the_greedy_tokens_one_by_one(prog: Any, llama: L.Exported) -> None:
    stream = pyrt.generate(prog, L.PROMPT, max_new_tokens=L.NEW_TOKENS, eos_ids=[], stream=True)
    first = next(stream)
    assert stream.result is None  # nothing past the first token has run yet
    rest = list(stream)
    assert [first, *rest] == llama.want and stream.result.tokens == llama.want
    assert stream.result.finish_reason == "length" and stream.result.timings.new_tokens == L.NEW_TOKENS


@pytest.mark.export
def test_an_eos_id_stops_generation_and_is_kept(prog: Any, llama: L.Exported) -> None:
    eos = llama.want[3]
    out = pyrt.generate(prog, L.PROMPT, max_new_tokens=L.NEW_TOKENS, eos_ids=[eos])
    assert out.tokens == llama.want[:llama.want.index(eos) + 1] and out.finish_reason == "stop"


@pytest.mark.export
def test_a_prompt_that_fills_the_cache_stops_with_cache_full(prog: Any, llama: L.Exported) -> None:
    """The last free position yields one token from its logits, then generation stops (eager agrees)."""
    for length, new in ((L.MAX_SEQ_LEN, 1), (L.MAX_SEQ_LEN - 2, 3)):
        prompt = [int(t) for t in np.random.default_rng(length).integers(3, archs.VOCAB, length)]
        out = pyrt.generate(prog, prompt, max_new_tokens=None, eos_ids=[])
        assert out.finish_reason == "cache_full" and len(out.tokens) == new
        assert out.tokens == archs.greedy(llama.model, prompt, new)


@pytest.mark.export
def test_seeded_sampling_is_reproducible(prog: Any) -> None:
    def run(seed: int) -> list[int]:
        kw = {"do_sample": True, "temperature": 1.5, "top_k": 20, "top_p": 0.95, "seed": seed, "eos_ids": []}
        return list(pyrt.generate(prog, L.PROMPT, max_new_tokens=16, **kw).tokens)

    assert run(7) == run(7)
    assert len({tuple(run(seed)) for seed in range(4)}) > 1


@pytest.mark.export
def test_sampled_first_tokens_follow_the_softmax(prog: Any) -> None:
    """Over many seeds, the first sampled token is distributed as probabilities(prefill logits)."""
    scipy_stats = pytest.importorskip("scipy.stats")
    logits = prog(torch.tensor([L.PROMPT]), torch.arange(len(L.PROMPT)))[0, -1].numpy()
    params = {"temperature": 0.05, "top_k": 6}
    probs = probabilities(logits, **params)
    draws = [pyrt.generate(prog, L.PROMPT, max_new_tokens=1, do_sample=True, seed=s, **params).tokens[0]
             for s in range(400)]
    kept = np.flatnonzero(probs)
    assert (probs >= 0.05).sum() >= 3, probs[kept]  # a distribution worth testing, not one sure token
    assert set(draws) <= set(kept.tolist())
    counts = np.array([draws.count(int(k)) for k in kept])
    assert scipy_stats.chisquare(counts, probs[kept] * len(draws)).pvalue > 1e-4


@pytest.mark.parametrize("params", [
    SamplingParams(do_sample=True, temperature=1.0), SamplingParams(do_sample=True, temperature=0.7, top_k=5),
    SamplingParams(do_sample=True, temperature=1.3, top_p=0.8),
    SamplingParams(do_sample=True, temperature=0.9, top_k=12, top_p=0.6),
])
def test_sampled_draws_follow_probabilities(params: SamplingParams) -> None:
    """Chi-square over 20,000 draws against the filtered softmax; filtered-out ids never come."""
    scipy_stats = pytest.importorskip("scipy.stats")
    logits = np.random.default_rng(0).normal(0, 2, 40)
    probs = probabilities(logits, params.temperature, params.top_k, params.top_p)
    rng = np.random.default_rng(1)
    draws = np.array([sample(logits, params, rng) for _ in range(20000)])
    counts = np.bincount(draws, minlength=logits.size)
    assert counts[probs == 0].sum() == 0
    kept = probs > 0
    if params.top_k is not None:
        assert kept.sum() <= params.top_k
    assert scipy_stats.chisquare(counts[kept], probs[kept] * draws.size).pvalue > 1e-4


def test_probabilities_follow_transformers_warpers() -> None:
    """Temperature, top-k and top-p as transformers' logits processors compute them."""
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    logits = np.random.default_rng(3).normal(0, 2, 50)
    scores = torch.tensor(logits[None], dtype=torch.float64)
    for warper in (TemperatureLogitsWarper(0.7), TopKLogitsWarper(9), TopPLogitsWarper(0.8)):
        scores = warper(None, scores)
    want = torch.softmax(scores, -1)[0].numpy()
    np.testing.assert_allclose(probabilities(logits, 0.7, 9, 0.8), want, atol=1e-12)


@pytest.mark.export
@pytest.mark.parametrize(("kwargs", "match"), [
    ({"prompt_ids": list(range(3, 52))}, "has 49 tokens, more than the cache's 48 positions"),
    ({"prompt_ids": [5, 100]}, r"prompt_ids\[1\]=100 is outside the vocabulary \[0, 100\)"),
    ({"prompt_ids": [5, -1]}, r"prompt_ids\[1\]=-1 is outside the vocabulary"),
    ({"prompt_ids": [5, 2.0]}, r"prompt_ids\[1\]=2.0 is not an int token id"),
    ({"prompt_ids": []}, "prompt_ids is empty"),
    ({"prompt_ids": "hello"}, "must be a sequence of token ids"),
    ({"max_new_tokens": 45}, "max_new_tokens=45 goes past the cache: a 5-token prompt leaves room for 44"),
    ({"max_new_tokens": 0}, "max_new_tokens=0 must be an int >= 1"),
    ({"temperature": -0.5, "do_sample": True}, r"temperature=-0.5 must be a finite number >= 0 \(0: greedy\)"),
    ({"top_k": 0}, "top_k=0 must be an int >= 1"),
    ({"top_p": 1.5}, r"top_p=1.5 must be a number in \(0, 1\]"),
    ({"seed": -(2**63) - 1}, "seed=-9223372036854775809 must be an int >= -9223372036854775808"),
    ({"eos_ids": [500]}, r"eos_ids\[0\]=500 is outside the vocabulary"),
    ({"do_sample": "yes"}, "do_sample='yes' must be a bool"),
    ({"stream": 1}, "stream=1 must be a bool"),
])
def test_bad_requests_are_typed_errors_before_any_forward_run(prog: Any, monkeypatch: pytest.MonkeyPatch,
                                                              kwargs: dict[str, Any], match: str) -> None:
    runs: list[str] = []
    real = prog.run
    monkeypatch.setattr(prog, "run", lambda *a, method="forward", **k: runs.append(method) or real(*a, method=method))
    call = {"prompt_ids": L.PROMPT, "max_new_tokens": 4, **kwargs}
    with pytest.raises(InputError, match=match):
        pyrt.generate(prog, call.pop("prompt_ids"), **call)
    assert "forward" not in runs


def test_a_program_outside_the_convention_is_refused(tmp_path: Path) -> None:
    from executorch.exir import to_edge

    path = tmp_path / "linear.pte"
    path.write_bytes(to_edge(torch.export.export(torch.nn.Linear(4, 2), (torch.randn(1, 4),))).to_executorch().buffer)
    with pyrt.Program(path) as prog:
        assert not pyrt.llm.follows_convention(prog)
        with pytest.raises(InputError, match="takes 1 input.*forward\\(tokens \\[batch, seq\\] int64"):
            pyrt.generate(prog, [1, 2], max_new_tokens=2)
    with pytest.raises(InputError, match="program must be a pyrt.Program, got str"):
        pyrt.generate(str(path), [1, 2], max_new_tokens=2)


@pytest.mark.export
def test_one_token_per_call_files_prefill_token_by_token(tmp_path: Path, llama: L.Exported) -> None:
    """dynamic_prefill=False: forward takes [1, 1]; the prompt goes in one token per call, same tokens."""
    from pyrt.export import decoder_to_pte

    path = tmp_path / "static.pte"
    summary = decoder_to_pte(llama.model, path, max_seq_len=L.MAX_SEQ_LEN, builder="portable", route="pyrt",
                             dynamic_prefill=False, progress=False)
    assert summary.constant_methods["enable_dynamic_shape"] is False
    with pyrt.Program(path) as prog:
        conv = pyrt.llm.read_convention(prog)
        assert (conv.dynamic, conv.max_prefill) == (False, 1)
        assert pyrt.generate(prog, L.PROMPT, max_new_tokens=L.NEW_TOKENS, eos_ids=[]).tokens == llama.want


@pytest.mark.export
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_half_precision_files_generate_what_the_model_in_that_dtype_does(tmp_path: Path, name: str,
                                                                         dtype: torch.dtype) -> None:
    """``dtype=``: greedy tokens equal ``model.to(dtype).generate`` on torch and on numpy kernels.

    bfloat16 logits have no numpy dtype: on torch kernels the loop runs on torch tensors, on numpy
    kernels (ml_dtypes' bfloat16) it widens the row it samples from; both are exact in float32.
    """
    from pyrt.export import decoder_to_pte

    path = tmp_path / f"{name}.pte"
    decoder_to_pte(archs.causal_lm(name), path, max_seq_len=L.MAX_SEQ_LEN, builder="portable", dtype=dtype,
                   progress=False)
    want = archs.greedy(archs.causal_lm(name).to(dtype), L.PROMPT, L.NEW_TOKENS)
    kernels = ["torch", "numpy"] if dtype is torch.float16 or _has_ml_dtypes() else ["torch"]
    for k in kernels:
        with pyrt.Program(path, kernels=k) as prog:
            assert pyrt.generate(prog, L.PROMPT, max_new_tokens=L.NEW_TOKENS, eos_ids=[]).tokens == want, k


def _has_ml_dtypes() -> bool:
    try:
        import ml_dtypes  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.export
def test_a_script_that_never_closes_its_program_exits(llama: L.Exported) -> None:
    """A Program left to the interpreter's shutdown: its engine core stops without starting a thread (a thread
    started while the interpreter finalizes never runs, and waiting for it hung the exit)."""
    import os
    import subprocess
    import sys

    script = (f"import pyrt, pyrt.llm\nprog = pyrt.Program({str(llama.path)!r})\n"
              "pyrt.generate(prog, [[1, 2, 3]], max_new_tokens=3, eos_ids=[])\n"
              "engine = pyrt.llm.Engine(prog)\nengine.submit([4, 5], max_new_tokens=2, eos_ids=[]).wait()\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", script], env=env, timeout=120, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
