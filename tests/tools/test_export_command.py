"""``pyrt export``: a sharded Hugging Face checkpoint directory (or a .pt2) -> a .pte that generates like
transformers, its tokenizer kept beside it for ``pyrt generate`` and ``pyrt serve``; bad inputs refused
before any long work, naming the file.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("executorch")

from pyrt.format.companions import find_tokenizer, tokenizer_dir  # noqa: E402
from pyrt.testing import archs, tokenizers  # noqa: E402
from pyrt.tools.cli import main  # noqa: E402

PROMPT = [5, 6, 7, 8, 9]
NEW = 12
SEQ = 48


def run(capsys: pytest.CaptureFixture[str], *args: Any) -> tuple[int, str, str]:
    status = main([str(a) for a in args])
    out = capsys.readouterr()
    return status, out.out, out.err


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``llm`` Llama in several safetensors shards, with a byte-level BPE tokenizer of its 100 ids."""
    path = tmp_path_factory.mktemp("hf") / "llama"
    archs.causal_lm("llama").save_pretrained(path, max_shard_size="40KB")
    tokenizers.byte_level_bpe(path, tokenizers.words(300), vocab_size=archs.VOCAB)
    assert len(list(path.glob("*.safetensors"))) >= 3
    return path


@pytest.fixture(scope="module")
def exported(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkpoint exported once by the command line (reference engines, the simulated GPU runs them)."""
    out = tmp_path_factory.mktemp("out") / "llama.pte"
    status = main(["export", str(checkpoint), "-o", str(out), "--builder", "reference", "--max-seq-len", str(SEQ),
                   "--no-progress"])
    assert status == 0
    return out


@pytest.fixture()
def one_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYRT_SIMULATED_GPUS", "1")


@pytest.mark.export
def test_the_export_generates_token_for_token_like_transformers(exported: Path, one_gpu: None, capsys: Any) -> None:
    path = exported
    status, out, err = run(capsys, "generate", path, "--prompt-ids", ",".join(map(str, PROMPT)),
                           "--max-new-tokens", NEW, "--eos-ids", "", "--json")
    assert status == 0, err
    assert json.loads(out)["tokens"] == archs.greedy(archs.causal_lm("llama"), PROMPT, NEW)


@pytest.mark.export
def test_generate_finds_the_tokenizer_kept_beside_the_file(exported: Path, checkpoint: Path, one_gpu: None,
                                                           capsys: Any) -> None:
    from transformers import AutoTokenizer

    path = exported
    assert find_tokenizer(path) == str(tokenizer_dir(path))
    kept = sorted(p.name for p in tokenizer_dir(path).iterdir())
    assert {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"} <= set(kept)
    assert not any(name.endswith(".safetensors") for name in kept)
    tok = AutoTokenizer.from_pretrained(str(checkpoint), local_files_only=True)
    prompt = "bana kesto lurimo"
    want = archs.greedy(archs.causal_lm("llama"), tok(prompt)["input_ids"], NEW)
    status, out, err = run(capsys, "generate", path, "--prompt", prompt, "--max-new-tokens", NEW, "--eos-ids", "")
    assert status == 0, err
    assert out.rstrip("\n") == tok.decode(want, skip_special_tokens=True)


@pytest.mark.export
def test_the_summary_has_each_stage_with_its_memory(checkpoint: Path, tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "m.pte"
    status, text, err = run(capsys, "export", checkpoint, "-o", out, "--builder", "reference", "--max-seq-len", 16,
                            "--max-batch-size", 2, "--no-progress", "--json")
    assert status == 0, err
    summary = json.loads(text)
    assert [s["name"] for s in summary["stages"]] == ["load", "export", "build", "write"]
    assert all(s["seconds"] > 0 and s["peak_bytes"] >= s["rss_bytes"] > 0 for s in summary["stages"])
    assert summary["constant_methods"]["get_max_batch_size"] == 2 and summary["tokenizer"] == str(tokenizer_dir(out))


@pytest.mark.export
def test_the_route_line_says_why_without_claiming_it_was_asked_for(checkpoint: Path, tmp_path: Path,
                                                                    capsys: Any) -> None:
    status, text, err = run(capsys, "export", checkpoint, "-o", tmp_path / "m.pte", "--builder", "reference",
                            "--max-seq-len", 16, "--no-progress")
    assert status == 0, err
    assert "decoder route: pyrt (pyrt export of a checkpoint directory takes pyrt's wrapper)" in text, text
    assert "asked for" not in text


@pytest.mark.export
def test_other_libraries_chatter_is_kept_out_of_sight_without_verbose(checkpoint: Path, tmp_path: Path) -> None:
    """A fresh process, as a user's: torch, torchao, transformers and ExecuTorch are imported and called by the
    export (torchao's extensions that fail to load, torch's pytree notes, deprecations were printed, some as
    ``pyrt: warning:``)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    env.pop("PYRT_LOG", None)
    done = subprocess.run([sys.executable, "-m", "pyrt", "export", str(checkpoint), "-o", str(tmp_path / "m.pte"),
                           "--builder", "reference", "--max-seq-len", "16", "--no-progress"], capture_output=True,
                          text=True, env=env, timeout=600)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert "decoder route" in done.stdout


@pytest.mark.export
def test_a_quantized_export_generates_what_its_dequantized_model_does(checkpoint: Path, tmp_path: Path,
                                                                     one_gpu: None, capsys: Any) -> None:
    from tests.fixtures import quant as Q

    out = tmp_path / "q.pte"
    status, _, err = run(capsys, "export", checkpoint, "-o", out, "--builder", "reference", "--max-seq-len", SEQ,
                         "--quantize", "int4", "--group-size", 16, "--no-progress")
    assert status == 0, err
    status, text, err = run(capsys, "generate", out, "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens",
                            NEW, "--eos-ids", "", "--json")
    assert status == 0, err
    reference = Q.dequantized(archs.causal_lm("llama"), "int4", 16)
    assert json.loads(text)["tokens"] == archs.greedy(reference, PROMPT, NEW)


@pytest.mark.export
def test_the_parser_reads_the_shards_mapped_pages(checkpoint: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """TensorRT-RTX's ONNX parser gets the checkpoint's own pages for every weight: no copy on the way."""
    pytest.importorskip("tensorrt_rtx")
    from pyrt.export import trt_builder
    from pyrt.export.checkpoint import checkpoint_to_pte

    if not Path("/proc/self/maps").exists():
        pytest.skip("no /proc/self/maps here")
    shards = {str(p.resolve()) for p in checkpoint.glob("*.safetensors")}
    inside: dict[str, int] = {}
    outside: dict[str, int] = {}
    real = trt_builder.parse_over_module_weights

    def spy(session: Any, parser: Any, network: Any, path: Any, weights: Any) -> None:
        maps = Path("/proc/self/maps").read_text().splitlines()  # while the shards are mapped
        spans = [[int(x, 16) for x in line.split()[0].split("-")] for line in maps if line.split(" ")[-1] in shards]
        for name, w in weights.items():
            mapped = any(lo <= w.data_ptr() < hi for lo, hi in spans)
            (inside if mapped else outside)[name] = w.nbytes
        real(session, parser, network, path, weights)

    monkeypatch.setattr(trt_builder, "parse_over_module_weights", spy)
    checkpoint_to_pte(checkpoint, tmp_path / "m.pte", max_seq_len=16, builder="tensorrt_rtx", progress=False)
    weights = sum(p.nbytes for p in archs.causal_lm("llama").parameters())
    # every weight, less the norms' identical all-ones vectors that ONNX's optimizer keeps once (4 x 128 bytes)
    assert sum(inside.values()) >= weights - 512, f"{weights - sum(inside.values())} weight bytes did not reach " \
                                                  "the parser from the shards"
    assert max(outside.values()) <= 128, f"copies reached the parser: {outside}"  # shape constants, inv_freq


@pytest.mark.export
def test_a_pt2_program_exports_and_runs_like_eager(tmp_path: Path, one_gpu: None, capsys: Any) -> None:
    import numpy as np

    import pyrt
    from pyrt.sim import simulated_gpus

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
    x = torch.randn(3, 8)
    torch.export.save(torch.export.export(model, (x,)), tmp_path / "prog.pt2")
    tok = tokenizers.byte_level_bpe(tmp_path / "tok", tokenizers.words(300), vocab_size=archs.VOCAB)
    status, out, err = run(capsys, "export", tmp_path / "prog.pt2", "-o", tmp_path / "prog.pte", "--builder",
                           "reference", "--tokenizer", tok, "--no-progress")
    assert status == 0, err
    assert find_tokenizer(tmp_path / "prog.pte") == str(tmp_path / "prog.tokenizer")
    with simulated_gpus(1), pyrt.Program(tmp_path / "prog.pte") as prog:
        got = prog(x.numpy())
    np.testing.assert_allclose(np.asarray(got), model(x).detach().numpy(), rtol=1e-5, atol=1e-6)


def _refuses_before_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any bad input must fail before the decoder is wrapped and exported (the long work)."""
    from pyrt.export import decoder

    def long_work(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the export started before the bad input was found")

    monkeypatch.setattr(decoder, "write_decoder", long_work)


def _edit_config(path: Path, **changes: Any) -> Path:
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **changes}))
    return path / "config.json"


def _holding(path: Path, tensor: str) -> Path:
    return path / json.loads((path / "model.safetensors.index.json").read_text())["weight_map"][tensor]


def _truncate(path: Path) -> Path:
    shard = sorted(path.glob("*.safetensors"))[-1]
    shard.write_bytes(shard.read_bytes()[:-10])
    return shard


@pytest.mark.parametrize(("damage", "message"), [
    (lambda p: (p / "config.json").unlink() or p / "config.json", "missing: the model's configuration"),
    (lambda p: _edit_config(p, model_type="bert", architectures=["BertForMaskedLM"]), "name no causal LM"),
    (_truncate, "truncated"),
    (lambda p: _edit_config(p, hidden_size=48, head_dim=24) and _holding(p, "model.embed_tokens.weight"),
     "but config.json makes it [100, 48]"),
])
def test_bad_checkpoints_fail_before_any_work_naming_the_file(checkpoint: Path, tmp_path: Path, capsys: Any,
                                                              monkeypatch: pytest.MonkeyPatch, damage: Any,
                                                              message: str) -> None:
    _refuses_before_work(monkeypatch)
    copy = Path(shutil.copytree(checkpoint, tmp_path / "ckpt"))
    at_fault = damage(copy)
    out = tmp_path / "m.pte"
    status, text, err = run(capsys, "export", copy, "-o", out, "--builder", "reference", "--no-progress")
    assert status == 1 and text == ""
    assert err.startswith(f"pyrt: error: {at_fault}: ") and message in err, err
    assert not out.exists() and not tokenizer_dir(out).exists() and sorted(tmp_path.iterdir()) == [copy]


@pytest.mark.parametrize(("args", "message"), [
    (["--max-seq-len", "100"], "exceeds the model's 64 position embeddings"),
    (["--max-batch-size", "2", "--max-tokens-per-step", "1"], "max_tokens_per_step=1 must be an int in"),
    (["--tokenizer", "{ckpt}/config.json"], "not a directory: --tokenizer takes"),
    (["--weight-streaming", "--budget", "1GiB", "--device", "cpu"], "device='cpu' is not a CUDA device"),
    (["--quantize", "int4", "--group-size", "48"], "group_size=48"),
])
def test_bad_options_fail_before_any_work(checkpoint: Path, tmp_path: Path, capsys: Any,
                                          monkeypatch: pytest.MonkeyPatch, args: list[str], message: str) -> None:
    _refuses_before_work(monkeypatch)
    out = tmp_path / "m.pte"
    args = [a.format(ckpt=checkpoint) for a in args]
    status, _, err = run(capsys, "export", checkpoint, "-o", out, "--builder", "reference", "--no-progress", *args)
    assert status == 1 and message in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("make", "message"), [
    (lambda p: p / "absent.pt2", "not a file"),
    (lambda p: (p / "junk.pt2").write_bytes(b"not a zip") and p / "junk.pt2", "not a zip archive"),
])
def test_a_bad_pt2_is_refused_naming_it(tmp_path: Path, capsys: Any, make: Any, message: str) -> None:
    source = make(tmp_path)
    status, _, err = run(capsys, "export", source, "-o", tmp_path / "m.pte", "--builder", "reference")
    assert status == 1 and err.startswith(f"pyrt: error: {source}: {message}"), err


def test_checkpoint_options_are_refused_for_a_program_file(tmp_path: Path, capsys: Any) -> None:
    status, _, err = run(capsys, "export", tmp_path / "p.pt2", "-o", tmp_path / "m.pte", "--max-seq-len", 64)
    assert status == 1 and "--max-seq-len: for checkpoint directories" in err


def test_a_share_is_no_export_budget(capsys: Any, tmp_path: Path) -> None:
    status, _, err = run(capsys, "export", tmp_path, "-o", tmp_path / "m.pte", "--budget", "50%")
    assert status == 2 and "export bakes a byte count per engine" in err


@pytest.mark.export
@pytest.mark.ray
def test_serve_finds_the_tokenizer_kept_beside_the_file(exported: Path, checkpoint: Path, tmp_path: Path) -> None:
    """``pyrt serve m.pte`` without --tokenizer serves text (OpenAI's /v1) with the tokenizer pyrt export kept."""
    requests = pytest.importorskip("requests")
    pytest.importorskip("ray.serve")
    from transformers import AutoTokenizer

    from tests.fixtures.serve_process import Server

    tok = AutoTokenizer.from_pretrained(str(checkpoint), local_files_only=True)
    prompt = "bana kesto lurimo"
    want = tok.decode(archs.greedy(archs.causal_lm("llama"), tok(prompt)["input_ids"], NEW), skip_special_tokens=True)
    server = Server(exported, tmp_path / "serve.log", "--cpus-per-replica", "0.5")
    try:
        server.wait_ready()
        assert f"OpenAI API at {server.base}/v1" in server.output()
        reply = requests.post(f"{server.base}/v1/completions", timeout=120, json={
            "model": "llama", "prompt": prompt, "max_tokens": NEW, "temperature": 0, "ignore_eos": True})
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["text"] == want
    finally:
        server.stop()


@pytest.mark.export
@pytest.mark.slow
@pytest.mark.parametrize("family", archs.LLM_FAMILIES)
def test_every_family_exports_from_its_checkpoint_and_generates_like_transformers(family: str, tmp_path: Path) -> None:
    import pyrt
    from pyrt.export.checkpoint import checkpoint_to_pte
    from pyrt.sim import simulated_gpus

    model = archs.causal_lm(family)
    model.save_pretrained(tmp_path / "ckpt", max_shard_size="40KB")
    checkpoint_to_pte(tmp_path / "ckpt", tmp_path / "m.pte", max_seq_len=SEQ, builder="reference", progress=False)
    with simulated_gpus(1), pyrt.Program(tmp_path / "m.pte") as prog:
        got = pyrt.generate(prog, PROMPT, max_new_tokens=NEW, eos_ids=[]).tokens
    assert got == archs.greedy(model, PROMPT, NEW)
