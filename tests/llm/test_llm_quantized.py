"""decoder_to_pte(quantize=...): quantized LLM files are their dequantized models, smaller, and run unchanged.

Each file's logits (prefill and decode, one-sequence and slot files, reference engines and ExecuTorch's
portable kernels in pyrt and in ExecuTorch's runtime) are compared with transformers running the same
model whose linear weights were replaced by their dequantized values (tests/fixtures/quant.py); against
the unquantized model the error and top-1 agreement are recorded, not asserted. Greedy generation and
continuous batching run on the quantized files as on any other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("executorch")

import pyrt  # noqa: E402
from pyrt.errors import ExportError  # noqa: E402
from pyrt.export import decoder_to_pte  # noqa: E402
from pyrt.format.trt_blob import parse_blob  # noqa: E402
from pyrt.pte_reader import PteFile, iter_delegate_blobs  # noqa: E402
from pyrt.sim import simulated_gpus  # noqa: E402
from pyrt.sim.refengine import Ref, RefEngine  # noqa: E402
from pyrt.testing import archs  # noqa: E402
from tests.fixtures import quant as Q  # noqa: E402

TOKENS = [5, 6, 7, 8, 9, 11, 12, 13]  # a prompt of 5, then 3 tokens fed one at a time
PROMPTS = [[5, 6, 7, 8, 9], [11, 12], [30, 31, 32]]
NEW = 10


def _export(tmp_path: Path, name: str, scheme: str | None, **kw: Any) -> tuple[Any, Any]:
    model = archs.causal_lm(name)
    summary = decoder_to_pte(model, tmp_path / f"{name}-{scheme}.pte", max_seq_len=32, quantize=scheme,
                             progress=False, **{"builder": "reference", "group_size": 16, **kw})
    return model, summary


def _against_float(record: Any, got: Any, model: Any, tokens: list[list[int]]) -> None:
    base = np.stack([Q.eager_logits(model, t) for t in tokens])
    record("rel_err_vs_unquantized", Q.rel_err(got, base))
    record("top1_vs_unquantized", Q.top1(got, base))


@pytest.mark.export
def test_a_one_sequence_file_is_its_dequantized_model(tmp_path: Path, record_property: Any) -> None:
    model, s = _export(tmp_path, "llama", "int4", weight_streaming=True)
    assert len(s.engines) == 1 and s.fallback_ops == {} and len(s.quantization.layers) == 15, str(s)  # 2 x 7 + head
    ref = Q.dequantized(model, "int4", 16)
    prefixes = [TOKENS[:k] for k in range(5, len(TOKENS) + 1)]
    with simulated_gpus(1), pyrt.Program(s.path) as prog:
        got = np.stack(Q.sequence_logits(prog, TOKENS, 5))
        tokens = pyrt.generate(prog, PROMPTS[0], max_new_tokens=NEW, eos_ids=[]).tokens
    assert Q.rel_err(got, np.stack([Q.eager_logits(ref, p) for p in prefixes])) <= Q.TOLERANCE["int4"]
    assert tokens == archs.greedy(ref, PROMPTS[0], NEW)
    _against_float(record_property, got, model, prefixes)


@pytest.mark.export
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(archs.LLM_FAMILIES))
def test_every_family_is_its_dequantized_model(tmp_path: Path, name: str) -> None:
    scheme = "int4" if sorted(archs.LLM_FAMILIES).index(name) % 2 else "int8"
    model, s = _export(tmp_path, name, scheme)
    ref = Q.dequantized(model, scheme, 16)
    prefixes = [TOKENS[:k] for k in range(5, len(TOKENS) + 1)]
    with simulated_gpus(1), pyrt.Program(s.path) as prog:
        got = np.stack(Q.sequence_logits(prog, TOKENS, 5))
    assert Q.rel_err(got, np.stack([Q.eager_logits(ref, p) for p in prefixes])) <= Q.TOLERANCE[scheme], str(s)


@pytest.mark.export
@pytest.mark.parametrize(("name", "scheme"), [("qwen2", "int8"), ("gpt2", "int4")])
def test_slot_files_are_their_dequantized_models_and_batch(tmp_path: Path, name: str, scheme: str,
                                                            record_property: Any) -> None:
    """GPT-2: Conv1D weights ([in, out]) and an LM head tied to the embedding (which stays float)."""
    model, s = _export(tmp_path, name, scheme, max_batch_size=3, max_tokens_per_step=16)
    ref = Q.dequantized(model, scheme, 16)
    step = [21, 22, 23]
    with simulated_gpus(1), pyrt.Program(s.path) as prog:
        first, decode = Q.slot_logits(prog, PROMPTS, step)
        results = pyrt.generate(prog, PROMPTS, max_new_tokens=NEW, eos_ids=[])  # pyrt.llm.Engine's batching
    want_first = np.stack([Q.eager_logits(ref, p) for p in PROMPTS])
    want_decode = np.stack([Q.eager_logits(ref, p + [t]) for p, t in zip(PROMPTS, step, strict=True)])
    assert Q.rel_err(first, want_first) <= Q.TOLERANCE[scheme] and Q.rel_err(decode, want_decode) <= Q.TOLERANCE[scheme]
    assert [r.tokens for r in results] == [archs.greedy(ref, p, NEW) for p in PROMPTS]
    _against_float(record_property, first, model, PROMPTS)


@pytest.fixture(scope="module")
def portable_llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    return _export(tmp_path_factory.mktemp("portable"), "llama", "int4", builder="portable")


@pytest.mark.export
@pytest.mark.parametrize("kernels", ["numpy", "torch", "executorch"])
def test_a_portable_file_is_its_dequantized_model_in_pyrt_and_executorch(portable_llama: tuple[Any, Any],
                                                                          kernels: str) -> None:
    model, s = portable_llama
    assert s.fallback_ops.get("quantized_decomposed::embedding_4bit") == 15 and "int4 g16" in str(s), str(s)
    ref = Q.dequantized(model, "int4", 16)
    want = np.stack([Q.eager_logits(ref, TOKENS[:k]) for k in range(5, len(TOKENS) + 1)])
    if kernels == "executorch":
        import executorch.kernels.quantized  # noqa: F401  (ExecuTorch's quantized kernels in its runtime)
        from executorch.runtime import Runtime

        forward = Runtime.get().load_program(s.path).load_method("forward")
        got = [forward.execute([torch.tensor([TOKENS[:5]]), torch.arange(5)])[0][0, -1].numpy()]
        for pos in range(5, len(TOKENS)):
            got.append(forward.execute([torch.tensor([[TOKENS[pos]]]), torch.tensor([pos])])[0][0, -1].numpy())
    else:
        with pyrt.Program(s.path, kernels=kernels) as prog:
            got = Q.sequence_logits(prog, TOKENS, 5)
    assert Q.rel_err(np.stack(got), want) <= Q.TOLERANCE["int4"]


def _linear_bytes(path: str) -> int:
    """Bytes of the engine weights that linear layers read: quantized values and scales, or float weights."""
    total = 0
    with PteFile.open(path) as pte:
        for _, _, _, blob in iter_delegate_blobs(pte):
            eng = RefEngine.from_bytes(parse_blob(blob).engine)
            names = set()
            for n in eng.nodes:
                if n.target == "pyrt::dequantize_weight":
                    names |= {n.args[0].name, n.args[1].name}
                pos = {"aten::linear.default": 1, "aten::addmm.default": 2, "aten::mm.default": 1}.get(n.target)
                if pos is not None and isinstance(n.args[pos], Ref) and n.args[pos].name in eng.weights:
                    names.add(n.args[pos].name)
            total += sum(eng.weights[k].nbytes for k in names)
    return total


@pytest.mark.export
def test_weight_bytes_measured_from_the_files_and_the_budget_counts_them(tmp_path: Path) -> None:
    """Linear layers of a float16 Llama: int8 <= 0.55x, int4 <= 0.30x (values + scales, default group size)."""
    sizes, streamable = {}, {}
    for scheme in (None, "int8", "int4"):
        _, s = _export(tmp_path, "llama", scheme, dtype=torch.float16, group_size=128, weight_streaming=True)
        sizes[scheme] = _linear_bytes(s.path)
        streamable[scheme] = pyrt.inspect(s.path)["methods"][0]["delegates"][0]["weights"]["streamable_bytes"]
    assert sizes["int8"] <= 0.55 * sizes[None] and sizes["int4"] <= 0.30 * sizes[None], sizes
    assert streamable["int4"] < streamable["int8"] < streamable[None], streamable
    half = streamable["int4"] // 2
    with simulated_gpus(1), pyrt.Program(tmp_path / "llama-int4.pte", budget=half) as prog:
        (engine,) = prog.weight_streaming
        assert (engine.streamable_bytes, engine.budget) == (streamable["int4"], half)
        assert len(pyrt.generate(prog, PROMPTS[0], max_new_tokens=4, eos_ids=[]).tokens) == 4


def test_bad_quantization_options_are_typed_errors_before_any_work(tmp_path: Path) -> None:
    model = archs.causal_lm("llama")
    for kwargs, match in (({"quantize": "int3"}, "quantize='int3'"), ({"quantize": "int4", "group_size": 64 + 1},
                                                                      "group_size=65"),
                          ({"quantize": "int8", "builder": "portable", "dtype": "bfloat16"},
                           "builder='portable' needs a float32 or float16 model")):
        with pytest.raises(ExportError, match=match):
            decoder_to_pte(model, tmp_path / "x.pte", max_seq_len=16, **kwargs)
    assert not list(tmp_path.iterdir())


@pytest.mark.export
def test_tensorrt_rtx_builds_a_quantized_slot_file_as_one_streaming_engine(tmp_path: Path) -> None:
    """Built on this CPU: one strongly typed engine, nothing left to ExecuTorch, weight streaming on."""
    pytest.importorskip("tensorrt_rtx")
    _, s = _export(tmp_path, "llama", "int4", builder="tensorrt_rtx", dtype=torch.float16, weight_streaming=True,
                   max_batch_size=2, max_tokens_per_step=8)
    (engine,) = s.engines
    assert s.fallback_ops == {} and engine.streamable_weights and engine.flavour == "tensorrt_rtx", str(s)
    assert engine.quantization is not None and len(engine.quantization.layers) == 15
    weights = pyrt.inspect(s.path)["methods"][0]["delegates"][0]["weights"]
    assert (weights["dtype"], weights["group_size"], weights["layers"]) == ("int4", 16, 15)
    assert weights["quantized_bytes"] == engine.quantization.weight_bytes and weights["streamable_bytes"] is None
