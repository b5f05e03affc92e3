"""End-to-end export through the reference builder, checked against ExecuTorch's own tools."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.export import Dim

import pyrt
from pyrt.errors import ExportError
from pyrt.export import to_pte
from pyrt.export._engines.engine_graph import stage_engines
from pyrt.export._files.engine_store import EngineStore
from pyrt.format.trt_blob import parse_blob
from pyrt.sim.refengine import RefEngine
from tests.export.test_export_helpers import affine_engine, delegates, standin, torchtrt_program
from tests.export.test_export_traps import Branchy, TwoLinears, _options

BREAKS = ["aten.sigmoid.default", "aten.sub.Tensor"]


@pytest.fixture(scope="module")
def branchy_pte(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    path = tmp_path_factory.mktemp("pipeline") / "branchy.pte"
    torch.manual_seed(0)
    summary = to_pte(Branchy().eval(), path, (torch.randn(5, 8),), builder="reference", torch_executed_ops=BREAKS,
                     device={0: "cuda:0", 1: "cuda:1"}, progress=False)
    return path, summary


def test_summary_describes_the_file(branchy_pte: tuple[Path, object]) -> None:
    path, summary = branchy_pte
    assert summary.path == str(path.resolve()) and summary.file_size == path.stat().st_size
    assert [(e.name, e.device, e.flavour) for e in summary.engines] == [
        ("engine_0", "cuda:0", "reference"), ("engine_1", "cuda:1", "reference")]
    assert summary.fallback_ops == {"aten::sigmoid": 1, "aten::sub": 1}
    blobs = [parse_blob(d["blob"]) for d in delegates(path)]
    assert [b.engine.nbytes for b in blobs] == [e.size for e in summary.engines]
    assert "engine_1" in str(summary) and "aten::sigmoid x1" in str(summary)


def test_pyrt_inspect_agrees_with_executorch_deserializer(branchy_pte: tuple[Path, object]) -> None:
    path, _ = branchy_pte
    ours = pyrt.inspect(path)["methods"][0]["delegates"]
    theirs = delegates(path)
    assert len(ours) == len(theirs) == 2
    for mine, other in zip(ours, theirs, strict=True):
        assert mine["id"] == other["id"] == "TensorRTBackend"
        assert mine["compile_specs"] == {k: v.decode("ascii") for k, v in other["compile_specs"].items()}
        assert mine["size"] == len(other["blob"])
        blob = parse_blob(other["blob"])
        assert mine["tensorrt"]["io_bindings"] == [b.to_json() for b in blob.io_bindings]
        assert mine["tensorrt"]["device_id"] == blob.device_id
        assert mine["tensorrt"]["engine_size"] == blob.engine.nbytes
        assert mine["tensorrt"]["engine_head"] == bytes(blob.engine[:16]).hex()


def test_executorch_runtime_loads_the_program(branchy_pte: tuple[Path, object]) -> None:
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(str(branchy_pte[0]))
    assert set(program.method_names) == {"forward"}


def test_device_copies_and_arenas_are_present(branchy_pte: tuple[Path, object]) -> None:
    method = pyrt.inspect(branchy_pte[0])["methods"][0]
    ops = [i.get("op") for i in method["instructions"]]
    assert "et_copy::_h2d_copy.out" in ops and "et_copy::_d2h_copy.out" in ops
    devices = {(d["device_type"], d["device_index"]) for d in method["non_const_buffer_device"]}
    assert devices == {("CUDA", 0), ("CUDA", 1)}


def test_blobs_hold_runnable_reference_engines(branchy_pte: tuple[Path, object]) -> None:
    for d in delegates(branchy_pte[0]):
        blob = parse_blob(d["blob"])
        engine = RefEngine.from_bytes(blob.engine)
        assert [t.name for t in engine.inputs] == [b.name for b in blob.inputs]
        assert [t.name for t in engine.outputs] == [b.name for b in blob.outputs]
        feed = {b.name: np.ones(b.shape, np.float32) for b in blob.inputs}
        out = engine.run(feed)
        assert [tuple(out[b.name].shape) for b in blob.outputs] == [b.shape for b in blob.outputs]


@pytest.mark.export
def test_pyrt_writer_is_byte_identical_to_executorch_writer(tmp_path: Path) -> None:
    torch.manual_seed(1)
    model, x = Branchy().eval(), torch.randn(5, 8)
    for writer in ("pyrt", "executorch"):
        to_pte(model, tmp_path / f"{writer}.pte", (x,), builder="reference", torch_executed_ops=BREAKS,
               writer=writer, progress=False)
    assert (tmp_path / "pyrt.pte").read_bytes() == (tmp_path / "executorch.pte").read_bytes()


@pytest.mark.export
def test_identical_engines_share_one_segment_like_executorch(tmp_path: Path) -> None:
    same = standin(affine_engine(3.0, 1.0))
    program = torchtrt_program([(same, "obj_a", "a"), (same, "obj_b", "b")])
    for writer in ("pyrt", "executorch"):
        to_pte(program, tmp_path / f"{writer}.pte", builder="reference", writer=writer, progress=False)
    data = (tmp_path / "pyrt.pte").read_bytes()
    assert data == (tmp_path / "executorch.pte").read_bytes()
    found = pyrt.inspect(tmp_path / "pyrt.pte")
    indices = [d["index"] for d in found["methods"][0]["delegates"]]
    assert len(indices) == 2 and indices[0] == indices[1]  # one segment serves both delegates
    assert len(found["file"]["segments"]) == 2  # ExecuTorch's constant segment + that one blob


@pytest.mark.export
def test_dynamic_shapes(tmp_path: Path) -> None:
    class Dyn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.l = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            z = torch.relu(self.l(torch.cat([x, y], 0)))
            return torch.sigmoid(z) * 2, z.reshape(-1, 4)

    model = Dyn().eval()
    shapes = ({0: Dim("b", min=2, max=64)}, {0: Dim("c", min=1, max=32)})
    args = (torch.randn(4, 8), torch.randn(3, 8))
    options = _options(torch_executed_ops=["aten.sigmoid.default"], dynamic_shapes=shapes)
    with EngineStore(tmp_path) as store:
        gm, *_ = stage_engines(model, args, options, store)
        for a, b in ((4, 3), (64, 32), (2, 1)):
            xs = (torch.randn(a, 8), torch.randn(b, 8))
            with torch.no_grad():
                assert all(torch.equal(g, w) for g, w in zip(gm(*xs), model(*xs), strict=True))
    to_pte(model, tmp_path / "d.pte", args, builder="reference", dynamic_shapes=shapes,
           torch_executed_ops=["aten.sigmoid.default"], progress=False)
    method = pyrt.inspect(tmp_path / "d.pte")["methods"][0]
    assert [s["shape"] for s in method["input_specs"]] == [[64, 8], [32, 8]]
    assert {s["dynamism"] for s in method["input_specs"]} == {"DYNAMIC_BOUND"}
    first = parse_blob(delegates(tmp_path / "d.pte")[0]["blob"])
    assert [b.shape for b in first.inputs] == [(-1, 8), (-1, 8)]
    ref = RefEngine.from_bytes(first.engine)
    assert [t.profile() for t in ref.inputs] == [((2, 8), (64, 8)), ((1, 8), (32, 8))]


@pytest.mark.export
def test_min_block_size_and_unbuildable_ops_fall_back(tmp_path: Path) -> None:
    class Masked(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu(x) * 2 + 1
            return torch.clamp(y.double(), float("-inf"), 2.0).float() + 1  # TensorRT has no float64

    model, x = Masked(), torch.randn(3, 4)
    summary = to_pte(model, tmp_path / "a.pte", (x,), builder="reference", progress=False)
    assert summary.fallback_ops["aten::clamp"] == 1 and len(summary.engines) == 2
    assert summary.fallback_reasons["aten::clamp"].startswith("float64 result")
    none = to_pte(model, tmp_path / "b.pte", (x,), builder="reference", min_block_size=4, progress=False)
    assert none.engines == () and sum(none.fallback_ops.values()) >= 5
    assert pyrt.inspect(tmp_path / "b.pte")["methods"][0]["delegates"] == []


def test_progress_is_logged_without_a_tty(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model = TwoLinears()
    assert model.training
    with caplog.at_level(logging.INFO, logger="pyrt.export"):
        to_pte(model, tmp_path / "m.pte", (torch.randn(3, 4),), builder="reference")
    assert model.training  # exported in eval mode, the caller's flag restored
    messages = [r.getMessage() for r in caplog.records if r.name == "pyrt.export"]
    assert any(m.startswith("building reference engine") for m in messages)
    assert any(re.fullmatch(r"writing m\.pte: done in [0-9.]+ s", m) for m in messages)


def test_importing_pyrt_export_does_not_import_torch() -> None:
    code = "import sys, pyrt, pyrt.export; print('torch' in sys.modules, 'executorch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_runs_end_to_end_on_simulated_gpus(branchy_pte: tuple[Path, object]) -> None:
    """export -> pyrt.Program on the CPU (fake CUDA + fake TensorRT), equal to eager."""
    program_cls = pytest.importorskip("pyrt.runtime.program").Program
    from pyrt.sim import simulated_gpus

    path, _ = branchy_pte
    torch.manual_seed(0)
    model, x = Branchy().eval(), torch.randn(5, 8)
    with simulated_gpus(2), program_cls(path) as prog:
        got = prog(x)
    with torch.no_grad():
        want = model(x)
    assert [np.abs(np.asarray(g) - w.numpy()).max() for g, w in zip(got, want, strict=True)] == [0.0, 0.0]


def test_model_argument_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="nn.Module or an ExportedProgram"):
        to_pte(object(), tmp_path / "m.pte", (), builder="reference")
    with pytest.raises(ExportError, match="example_inputs are required"):
        to_pte(TwoLinears(), tmp_path / "m.pte", None, builder="reference")
