"""``pyrt generate`` and ``pyrt bench --generate --sweep`` (in process, on a simulated GPU)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import pyrt
from pyrt.sim import simulated_gpus
from pyrt.tools.cli import main
from tests.fixtures import llm_models as L

pytestmark = [pytest.mark.export]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def llama() -> L.Exported:
    return L.exported("llama", "reference", weight_streaming=True)


@pytest.fixture(autouse=True)
def one_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYRT_SIMULATED_GPUS", "1")


def run(capsys: pytest.CaptureFixture[str], *args: Any) -> tuple[int, str, str]:
    status = main([str(a) for a in args])
    out = capsys.readouterr()
    return status, out.out, out.err


def test_generate_prints_the_greedy_tokens_then_the_timings(llama: L.Exported, capsys: Any) -> None:
    status, out, err = run(capsys, "generate", llama.path, "--prompt-ids", ",".join(map(str, L.PROMPT)),
                           "--max-new-tokens", L.NEW_TOKENS, "--eos-ids", "")
    assert status == 0, err
    assert [int(t) for t in out.split()] == llama.want
    assert "finish: length" in err and "decode" in err and "tokens/s" in err


def test_generate_with_sample_and_temperature_0_is_greedy(llama: L.Exported, capsys: Any) -> None:
    status, out, err = run(capsys, "generate", llama.path, "--prompt-ids", ",".join(map(str, L.PROMPT)),
                           "--max-new-tokens", L.NEW_TOKENS, "--eos-ids", "", "--sample", "--temperature", "0")
    assert status == 0 and "warning" not in err, err
    assert [int(t) for t in out.split()] == llama.want


def test_generate_json_with_sampling_matches_the_api(llama: L.Exported, capsys: Any) -> None:
    args = ["--sample", "--temperature", "1.5", "--top-k", "20", "--top-p", "0.9", "--seed", "4"]
    status, out, err = run(capsys, "generate", llama.path, "--prompt-ids", "5,6,7", "--max-new-tokens", 8,
                           "--budget", "50%", "--json", *args)
    assert status == 0, err
    data = json.loads(out)
    with simulated_gpus(1), pyrt.Program(llama.path) as prog:
        want = pyrt.generate(prog, [5, 6, 7], max_new_tokens=8, do_sample=True, temperature=1.5, top_k=20,
                             top_p=0.9, seed=4)
    assert data["tokens"] == want.tokens and data["finish_reason"] == want.finish_reason
    assert set(data["timings"]) >= {"prefill_ms", "ttft_ms", "decode_tokens_per_s"}


def test_generate_text_with_a_local_tokenizer(llama: L.Exported, capsys: Any, tmp_path: Path) -> None:
    directory = L.word_tokenizer(tmp_path / "tok")
    prompt = " ".join(f"w{i}" for i in L.PROMPT)
    status, out, err = run(capsys, "generate", llama.path, "--prompt", prompt, "--tokenizer", directory,
                           "--max-new-tokens", L.NEW_TOKENS, "--eos-ids", "")
    assert status == 0, err
    assert out.split() == [f"w{i}" for i in llama.want]


@pytest.mark.parametrize(("args", "status", "message"), [
    (["--prompt", "w1 w2"], 1, "--prompt needs --tokenizer"),
    (["--prompt-ids", "1,100"], 1, "prompt_ids[1]=100 is outside the vocabulary"),
    (["--prompt-ids", "1,2", "--max-new-tokens", "60"], 1, "max_new_tokens=60 goes past the cache"),
    (["--prompt-ids", "1,x"], 2, ""),
    (["--prompt-ids", "1,2", "--max-new-tokens", "0"], 2, "expected a whole number >= 1, got '0'"),
    (["--prompt-ids", "1,2", "--max-new-tokens", "-1"], 2, "expected a whole number >= 1, got '-1'"),
    ([], 2, ""),
])
def test_generate_errors(llama: L.Exported, capsys: Any, args: list[str], status: int, message: str) -> None:
    got, _, err = run(capsys, "generate", llama.path, *args)
    assert got == status and message in err and "Traceback" not in err


def test_bench_generate_sweeps_budgets(llama: L.Exported, capsys: Any, tmp_path: Path) -> None:
    png = tmp_path / "tps.png"
    status, out, err = run(capsys, "bench", llama.path, "--generate", "--sweep", "20%..100%:40%", "--new-tokens", 4,
                           "--prompt-len", 6, "--iters", 1, "--json", "--plot", png)
    assert status == 0, err
    rows = json.loads(out)["rows"]
    assert [r["budget"] for r in rows] == ["20%", "60%", "100%"]
    applied = [r["applied_bytes"] for r in rows]
    assert applied == sorted(applied) and applied[-1] == rows[-1]["streamable_bytes"] > 0 and applied[0] > 0
    assert all(r["new_tokens"] == 4 and r["prompt_tokens"] == 6 and r["decode_tokens_per_s"] > 0 for r in rows)
    assert png.read_bytes()[:8] == PNG_MAGIC
    bound = [r["link_bound_tokens_per_s"] for r in rows]  # B * BW / S: S shrinks as the budget grows
    assert bound[0] < bound[1] and bound[2] is None  # a full budget streams nothing: no bound
    status, out, err = run(capsys, "bench", llama.path, "--generate", "--new-tokens", 3, "--iters", 1)
    assert status == 0 and "decode tok/s" in out and "as loaded" in out, err


def test_bench_generate_sweeps_batch_sizes_against_the_links_bound(capsys: Any) -> None:
    slots = L.batched("llama", "reference")
    status, out, err = run(capsys, "bench", slots.path, "--generate", "--batch", "1,4", "--new-tokens", 6,
                           "--prompt-len", 4, "--iters", 1, "--bandwidth", "50", "--json")
    assert status == 0, err
    info = json.loads(out)
    rows = info["rows"]
    assert info["bandwidth"] == 50e9 and [r["batch"] for r in rows] == [1, 4]
    assert all(r["aggregate_tokens_per_s"] > 0 for r in rows)
    assert rows[0]["link_bound_tokens_per_s"] is None  # nothing streams in this file
    assert run(capsys, "bench", slots.path, "--generate", "--batch", "0")[0] == 2


def test_bench_without_generate_is_the_plain_bench(llama: L.Exported, capsys: Any) -> None:
    status, out, err = run(capsys, "bench", llama.path, "--iters", 2, "--warmup", 0, "--shape", "0=1,4",
                           "--shape", "1=4", "--json")
    assert status == 0, err
    assert json.loads(out)["rows"][0]["iterations"] == 2
