"""decoder_to_pte: Hugging Face causal LMs with a static KV cache, in ExecuTorch's LLM convention.

Greedy pyrt.generate must equal ``model.generate(do_sample=False)`` token for token for 32 new
tokens (reference engines on a simulated GPU, and ExecuTorch's portable kernels).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import pyrt
import pyrt.llm
from pyrt.errors import ExportError
from pyrt.export import decoder_to_pte
from pyrt.sim import simulated_gpus
from pyrt.testing import archs
from tests.fixtures import llm_models as L

pytestmark = [pytest.mark.export]


@pytest.fixture(scope="module")
def llama_ref() -> L.Exported:
    return L.exported("llama", "reference", weight_streaming=True)


@pytest.fixture(scope="module")
def gpt2_portable() -> L.Exported:
    return L.exported("gpt2", "portable", route="pyrt")


def _generate(path: Path, **kw: Any) -> Any:
    with simulated_gpus(1), pyrt.Program(path) as prog:
        return pyrt.generate(prog, L.PROMPT, max_new_tokens=L.NEW_TOKENS, eos_ids=[], **kw)


def test_llama_reference_engines_decode_as_eager(llama_ref: L.Exported) -> None:
    s = llama_ref.summary
    assert llama_ref.model.generation_config.cache_implementation is None  # the caller's model is left as it was
    assert len(s.engines) == 1 and s.fallback_ops == {} and s.route in ("upstream", "pyrt"), str(s)
    out = _generate(llama_ref.path)
    assert len(out.tokens) == L.NEW_TOKENS and out.tokens == llama_ref.want and out.finish_reason == "length"
    assert out.timings.prompt_tokens == len(L.PROMPT) and out.timings.new_tokens == L.NEW_TOKENS


def test_gpt2_portable_decodes_as_eager_in_pyrt_and_executorch(gpt2_portable: L.Exported) -> None:
    s = gpt2_portable.summary
    assert s.engines == () and s.builder == "portable" and s.route == "pyrt", str(s)
    assert _generate(gpt2_portable.path).tokens == gpt2_portable.want
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(gpt2_portable.path)
    forward = program.load_method("forward")
    prompt = torch.tensor([L.PROMPT])
    logits = forward.execute([prompt, torch.arange(len(L.PROMPT))])[0]
    got = []
    for i in range(L.NEW_TOKENS):
        got.append(int(logits[0, -1].argmax()))
        logits = forward.execute([torch.tensor([[got[-1]]]), torch.tensor([len(L.PROMPT) + i])])[0]
    assert got == gpt2_portable.want


def test_constant_methods_follow_executorch_llama_export(gpt2_portable: L.Exported, llama_ref: L.Exported) -> None:
    """The metadata ExecuTorch's llama export writes, read by ExecuTorch's runtime and by pyrt."""
    from executorch.runtime import Runtime

    want = {"get_max_seq_len": L.MAX_SEQ_LEN, "get_max_context_len": L.MAX_SEQ_LEN, "get_vocab_size": archs.VOCAB,
            "get_n_layers": 2, "use_kv_cache": True, "enable_dynamic_shape": True, "get_bos_id": 1,
            "get_eos_ids": [2]}
    program = Runtime.get().load_program(gpt2_portable.path)
    assert set(want) | {"forward"} <= set(program.method_names)
    for name, value in want.items():
        got = program.load_method(name).execute([])
        assert (list(got) if name == "get_eos_ids" else got[0]) == value, name
    with simulated_gpus(1), pyrt.Program(llama_ref.path) as prog:
        conv = pyrt.llm.read_convention(prog)
        assert {k: prog.run(method=k) for k in want} == want
    assert (conv.max_context_len, conv.vocab_size, conv.eos_ids, conv.bos_id, conv.dynamic) == \
        (L.MAX_SEQ_LEN, archs.VOCAB, (2,), 1, True)
    assert llama_ref.summary.constant_methods["get_eos_ids"] == [2]


def test_the_cache_stays_in_device_memory(llama_ref: L.Exported) -> None:
    """The engine updates the KV buffers in CUDA memory: only tokens, positions and logits cross."""
    ops = [i.get("op") for i in pyrt.inspect(llama_ref.path)["methods"][0]["instructions"] if i.get("op")]
    assert ops.count("et_copy::_h2d_copy.out") == 2 and ops.count("et_copy::_d2h_copy.out") == 1
    from pyrt.pte_reader import DeviceType, PteFile

    with PteFile.open(llama_ref.path) as pte:
        plan = pte.program.method("forward")
        caches = [v.value for v in plan.values if v.kind == "Tensor" and v.value.data_buffer_idx > 0
                  and v.value.allocation_info is not None and len(v.value.sizes) == 4]
        devices = {plan.buffer_device(t.allocation_info.memory_id) for t in caches}
    assert len(caches) == 4 and devices == {(DeviceType.CUDA, 0)}  # 2 layers x (keys, values)


def test_opt_falls_back_to_pyrts_wrapper(tmp_path: Path) -> None:
    """OPT's upstream program has an unbounded size: route "auto" says so and takes pyrt's wrapper."""
    opt = L.Exported("opt", tmp_path / "opt.pte", "reference")
    assert opt.summary.route == "pyrt" and "upstream route failed" in opt.summary.route_reason
    assert "decoder route: pyrt (upstream route failed" in str(opt.summary)
    assert _generate(opt.path).tokens == opt.want


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(archs.LLM_FAMILIES))
def test_every_family_decodes_as_eager(name: str, tmp_path: Path) -> None:
    exported = L.Exported(name, tmp_path / f"{name}.pte", "reference")
    assert _generate(exported.path).tokens == exported.want, exported.summary


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_portable_files_decode_as_eager(name: str, tmp_path: Path) -> None:
    exported = L.Exported(name, tmp_path / f"{name}.pte", "portable")
    assert _generate(exported.path).tokens == exported.want


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"max_seq_len": 1}, "max_seq_len=1 must be an int >= 2"),
    ({"max_seq_len": 65}, "exceeds the model's 64 position embeddings"),
    ({"max_seq_len": 16, "builder": "onnx"}, "builder='onnx' is not one of"),
    ({"max_seq_len": 16, "route": "hf"}, "route='hf' is not one of"),
    ({"max_seq_len": 16, "dtype": "int8"}, "dtype='int8' is not one of"),
    ({"max_seq_len": 16, "batch_size": 0}, "batch_size=0 must be an int >= 1"),
    ({"max_seq_len": 16, "eos_ids": [100]}, r"eos_ids: 100 is not a token id in \[0, 100\)"),
    ({"max_seq_len": 16, "device": "cpu"}, "device='cpu' is not a CUDA device"),
])
def test_bad_options_are_typed_errors_before_any_work(tmp_path: Path, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ExportError, match=match):
        decoder_to_pte(archs.causal_lm("llama"), tmp_path / "x.pte", **kwargs)
    assert not list(tmp_path.iterdir())


def test_models_that_are_not_causal_lms_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="no .config"):
        decoder_to_pte(torch.nn.Linear(2, 2), tmp_path / "x.pte", max_seq_len=8)
    with pytest.raises(ExportError, match="must be a transformers causal LM"):
        decoder_to_pte("llama", tmp_path / "x.pte", max_seq_len=8)
    import transformers as tf

    mistral = tf.MistralForCausalLM(tf.MistralConfig(**archs.decoder_config(num_key_value_heads=2, sliding_window=8)))
    with pytest.raises(ExportError, match="sliding window"):
        decoder_to_pte(mistral, tmp_path / "x.pte", max_seq_len=16)
