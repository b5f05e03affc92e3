"""to_pte(quantize="int8" | "int4", group_size=...): weight-only quantized engines, exact to their definition.

Reference engines run on the simulated GPU and must compute what the model computes with every
linear weight replaced by its dequantized value (tests/fixtures/quant.py, built from the shared
scheme alone); TensorRT-RTX builds one strongly typed engine from INT8 / INT4 constants behind block
``DequantizeLinear`` nodes, whose ONNX graph ONNX's own reference evaluator runs to the same result.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("executorch")

import pyrt  # noqa: E402
from pyrt.errors import ExportError  # noqa: E402
from pyrt.export import to_pte  # noqa: E402
from pyrt.format.weight_quant import SPEC_KEY  # noqa: E402
from pyrt.sim import simulated_gpus  # noqa: E402
from pyrt.testing import archs  # noqa: E402
from tests.fixtures import quant as Q  # noqa: E402


def _mlp() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.GELU(), torch.nn.Linear(48, 10)).eval(), \
        torch.randn(3, 64)


def _run(path: Path, *inputs: Any) -> np.ndarray:
    with simulated_gpus(1), pyrt.Program(path) as prog:
        return np.asarray(prog(*(np.asarray(x) for x in inputs)))


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"quantize": "int3"}, "quantize='int3' is not one of None, 'int8', 'int4'"),
    ({"quantize": "INT4"}, "quantize='INT4' is not one of"),
    ({"quantize": "int4", "group_size": 0}, "group_size=0 must be a power of two >= 16"),
    ({"quantize": "int4", "group_size": 48}, "group_size=48 must be a power of two"),
    ({"quantize": "int8", "group_size": 8}, "group_size=8 must be a power of two >= 16"),
    ({"quantize": "int8", "group_size": True}, "group_size=True"),
    ({"quantize": "int8", "compile_specs": {SPEC_KEY: b"{}"}}, "pass quantize= and group_size= instead"),
])
def test_bad_quantization_options_are_typed_errors_before_any_work(tmp_path: Path, kwargs: dict[str, Any],
                                                                    match: str) -> None:
    model, x = _mlp()
    with pytest.raises(ExportError, match=match):
        to_pte(model, tmp_path / "m.pte", (x,), builder="reference", **kwargs)
    assert not list(tmp_path.iterdir())


@pytest.mark.export
@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_reference_engine_is_the_dequantized_model(tmp_path: Path, scheme: str) -> None:
    model, x = _mlp()
    s = to_pte(model, tmp_path / "m.pte", (x,), builder="reference", quantize=scheme, group_size=16,
               weight_streaming=True)
    (engine,) = s.engines
    q = engine.quantization
    assert q is not None and [(x.rows, x.cols, x.group) for x in q.layers] == [(48, 64, 16), (10, 48, 16)]
    assert q.per_row == [] and q.skipped == [] and s.quantization is not None and f"{scheme} g16" in str(s)
    got = _run(s.path, x)
    want = Q.dequantized(model, scheme, 16)(x).detach().numpy()
    assert Q.rel_err(got, want) < 1e-6  # the same dequantized weights: only float order differs
    assert Q.rel_err(got, model(x).detach().numpy()) > 1e-5  # and they are not the float weights
    w = pyrt.inspect(s.path)["methods"][0]["delegates"][0]["weights"]
    packed = (48 * 64 + 10 * 48) * (1 if scheme == "int8" else 0.5) + (48 * 4 + 10 * 3) * 4
    assert (w["dtype"], w["group_size"], w["layers"], w["quantized_bytes"]) == (scheme, 16, 2, packed)
    assert w["streamable_bytes"] == w["weight_bytes"] == packed + (48 + 10) * 4  # biases stay float32


@pytest.mark.export
@pytest.mark.parametrize(("name", "scheme"), [("gpt2", "int4"), ("llama", "int8"), ("bert", "int4"),
                                              ("vit", "int8")])
def test_real_architectures_compute_their_dequantized_models(tmp_path: Path, name: str, scheme: str) -> None:
    model, x = archs.build(name)
    s = to_pte(model, tmp_path / f"{name}.pte", (x,), builder="reference", quantize=scheme, group_size=16)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D"]
    assert s.quantization is not None and len(s.quantization.layers) == len(linears), str(s)
    want = Q.dequantized(model, scheme, 16)(x).detach().numpy()
    got = _run(s.path, x)
    assert Q.rel_err(got, want) <= Q.TOLERANCE[scheme], str(s)


@pytest.mark.export
def test_layers_the_group_does_not_divide_get_one_scale_per_row(tmp_path: Path) -> None:
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(96, 40), torch.nn.ReLU(), torch.nn.Linear(40, 8)).eval()
    x = torch.randn(2, 96)
    s = to_pte(model, tmp_path / "m.pte", (x,), builder="reference", quantize="int4", group_size=32)
    q = s.quantization
    assert q is not None and [x.group for x in q.layers] == [32, 40] and q.per_row == [q.layers[1].name]
    assert "one scale per row (input size not a multiple of 32)" in str(s)
    assert Q.rel_err(_run(s.path, x), Q.dequantized(model, "int4", 32)(x).detach().numpy()) < 1e-6


@pytest.mark.export
def test_tensorrt_graph_dequantizes_as_the_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ONNX model TensorRT-RTX parses (INT8 / INT4 initializers, block DequantizeLinear), run by ONNX's
    reference evaluator, computes the dequantized model; the engine is built, one, strongly typed, streaming."""
    onnx = pytest.importorskip("onnx")
    from onnx.reference import ReferenceEvaluator

    from pyrt.export._engines import builders, onnx_quant

    kept: list[Path] = []
    attach = onnx_quant.attach_dequantize

    def keep(path: Path, lifted: Any) -> None:
        attach(path, lifted)
        kept.append(Path(shutil.copytree(path.parent, tmp_path / f"onnx{len(kept)}")) / path.name)

    monkeypatch.setattr(builders.onnx_quant, "attach_dequantize", keep)
    written = builders.export_partition  # the float weights written beside the model (not only referenced for the
    monkeypatch.setattr(builders, "export_partition",  # parser to take from memory): ONNX's evaluator reads files
                        lambda *a, **k: written(*a[:4], in_memory=False))
    model, x = archs.build("gpt2")  # Conv1D weights ([in, out]) and a tied head: both layouts
    for scheme in ("int8", "int4"):
        s = to_pte(model, tmp_path / f"{scheme}.pte", (x,), builder="tensorrt_rtx", quantize=scheme, group_size=16,
                   weight_streaming=True)
        assert len(s.engines) == 1 and s.fallback_ops == {} and s.engines[0].streamable_weights, str(s)
        graph = onnx.load(str(kept[-1]))
        dq = [n for n in graph.graph.node if n.op_type == "DequantizeLinear"]
        kinds = {i.data_type for i in graph.graph.initializer if i.name.endswith("_values")}
        assert len(dq) == len(s.quantization.layers) and kinds == {3 if scheme == "int8" else 22}
        got = ReferenceEvaluator(graph).run(None, {"input_0": x.numpy()})[0]
        want = Q.dequantized(model, scheme, 16)(x).detach().numpy()
        assert Q.rel_err(got, want) < 1e-5, scheme
        spec = pyrt.inspect(s.path)["methods"][0]["delegates"][0]["weights"]
        assert spec["dtype"] == scheme and spec["streamable_bytes"] is None  # known only when TensorRT loads it


def test_a_torch_tensorrt_programs_engines_are_not_requantized(tmp_path: Path) -> None:
    from tests.export.test_export_helpers import torchtrt_split_module

    with pytest.raises(ExportError, match="quantize='int8': a Torch-TensorRT program's engines are kept"):
        to_pte(torchtrt_split_module(), tmp_path / "m.pte", (torch.randn(2, 3),), builder="reference",
               quantize="int8")
    assert not list(tmp_path.glob("*.pte"))
