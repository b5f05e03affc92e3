"""Data-dependent output shapes at run time (issue 24): one engine, TensorRT's output allocator.

Each model of ``pyrt.testing.datadep_models`` (nonzero, masked_select, boolean-mask indexing,
one-argument where; alone and between Linear layers) is exported as one reference engine and
run on the simulated GPU, whose fake TensorRT reports -1 for the data-dependent dim, asks the
installed ``IOutputAllocator`` for memory and reports the real shape through ``notify_shape``.
Results must equal eager PyTorch for inputs giving an empty, a partial and a full result.

The resize to the reported shape is guarded by ``test_runs_equal_eager``: without it the output
keeps its planned (upper-bound) shape, which differs from eager's for "empty" and "partial";
``test_a_later_executorch_op_reads_the_resized_output`` guards that it happens before the next
instruction reads the tensor.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from pyrt.errors import ExecutionError
from pyrt.export import to_pte
from pyrt.runtime.program import Program
from pyrt.sim import simulated_gpus
from pyrt.testing import datadep_models as dm


class _Programs(dict):
    """name -> the model exported as one reference engine, on first use."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    def __missing__(self, name: str) -> Path:
        model, x = dm.build(name)
        path = self[name] = self.root / f"{name}.pte"
        summary = to_pte(model, path, (x,), builder="reference", progress=False)
        assert len(summary.engines) == 1 and not summary.fallback_ops
        return path


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _Programs(tmp_path_factory.mktemp("ddrun"))


@pytest.mark.export
@pytest.mark.parametrize("name", dm.NAMES)
def test_runs_equal_eager(name: str, programs: dict[str, Path]) -> None:
    model, _ = dm.build(name)
    with simulated_gpus(1) as sim, Program(programs[name]) as prog:
        for case in dm.CASES * 2:  # each case twice: the planned buffer is reused across runs
            x = dm.example(name, case)
            got, want = prog(x), model(x)
            assert tuple(got.shape) == tuple(want.shape), (case, got.shape, want.shape)
            assert torch.allclose(torch.as_tensor(got), want, atol=1e-6), case
        assert sim.tensorrt.calls["execute_async_v3"] == 6
    assert not sim.driver.hazards


def test_numpy_inputs_and_outputs(programs: dict[str, Path]) -> None:
    model, _ = dm.build("nonzero")
    x = dm.example("nonzero", "partial")
    with simulated_gpus(1), Program(programs["nonzero"]) as prog:
        got = prog(x.numpy())
    assert isinstance(got, np.ndarray) and np.array_equal(got, model(x).numpy())


def test_the_planned_buffer_is_handed_to_tensorrt(programs: dict[str, Path]) -> None:
    """Zero copy: TensorRT writes into the program's planned buffer, no allocation per run."""
    with simulated_gpus(1) as sim, Program(programs["masked_select_mlp"]) as prog:
        prog(dm.example("masked_select_mlp", "full"))
        before = sim.driver.live_allocations()
        prog(dm.example("masked_select_mlp", "partial"))
        assert sim.driver.live_allocations() == before
        asked = sim.tensorrt.allocations_asked
    assert asked and all(name == "output_0" for name, _ in asked)
    assert asked[-1][1] == 16 * 4 * 4  # 16 selected elements x 4 features x float32


def test_more_than_the_bound_is_a_typed_error(programs: dict[str, Path]) -> None:
    with simulated_gpus(1) as sim, Program(programs["nonzero_mlp"]) as prog:
        sim.tensorrt.ask_extra_bytes = 4096
        with pytest.raises(ExecutionError, match=r"output 'output_0' needs \d+ bytes, more than the 512 bytes"):
            prog(dm.example("nonzero_mlp", "partial"))
        sim.tensorrt.ask_extra_bytes = 0
        model, _ = dm.build("nonzero_mlp")
        x = dm.example("nonzero_mlp", "full")
        assert torch.allclose(torch.as_tensor(prog(x)), model(x))  # the program still runs afterwards


def test_a_later_executorch_op_reads_the_resized_output(tmp_path: Path) -> None:
    """The engine's output feeds an op that runs in ExecuTorch: it must see the reported shape."""
    model, x = dm.build("masked_select_mlp")
    path = tmp_path / "m.pte"
    summary = to_pte(model, path, (x,), builder="reference", progress=False,
                     torch_executed_ops=["aten.linear.default"])
    assert summary.engines and "aten::linear" in "".join(summary.fallback_reasons)
    with simulated_gpus(1), Program(path) as prog:
        for case in dm.CASES:
            xi = dm.example("masked_select_mlp", case)
            got, want = prog(xi), model(xi)
            assert tuple(got.shape) == tuple(want.shape) and torch.allclose(torch.as_tensor(got), want, atol=1e-6)


def test_cuda_graphs_refuse_data_dependent_engines_with_a_reason(programs: dict[str, Path],
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    model, _ = dm.build("where_mlp")
    with caplog.at_level(logging.INFO), simulated_gpus(1) as sim, \
            Program(programs["where_mlp"], cuda_graphs=True) as prog:
        for case in dm.CASES:
            x = dm.example("where_mlp", case)
            assert torch.allclose(torch.as_tensor(prog(x)), model(x))
        assert sim.driver.graph_launches == 0
    assert any("data-dependent" in r.getMessage() and "CUDA graph" in r.getMessage() for r in caplog.records)


def test_a_dynamic_batch_bounds_the_output_by_its_maximum(tmp_path: Path) -> None:
    """nonzero of a (batch <= 16, 8) input: at most 128 rows, whatever the batch of a run."""
    from torch.export import Dim

    model, x = dm.build("nonzero_mlp")
    path = tmp_path / "dyn.pte"
    summary = to_pte(model, path, (x,), builder="reference", progress=False,
                     dynamic_shapes=({0: Dim("batch", min=1, max=16)},))
    assert summary.engines[0].bounded_outputs == (("output_0", (128, 4)),)
    with simulated_gpus(1), Program(path) as prog:
        for batch in (1, 3, 16):
            for case in dm.CASES:
                xi = dm.example("nonzero_mlp", case).repeat(4, 1)[:batch]
                got, want = prog(xi), model(xi)
                assert tuple(got.shape) == tuple(want.shape) and torch.allclose(torch.as_tensor(got), want)


RESIZE = "targets[k] = _out_target(outs[k], engine.reported_shape(name), table)"


def test_a_mutant_without_the_resize_fails(tmp_path: Path) -> None:
    """Remove the resize to TensorRT's reported shape from a copy of pyrt: the eager comparison fails."""
    from tests.device.test_ordering_mutants import _copy_tree, _mutate

    tree = _copy_tree(tmp_path)
    _mutate(tree, "pyrt/runtime/delegate_steps.py", RESIZE)
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "--rootdir",
         str(tree), str(tree / "tests" / "runtime" / "test_data_dependent_run.py"), "-k",
         "test_runs_equal_eager and where_mlp"],
        cwd=tree, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 1 and "1 failed" in result.stdout, result.stdout[-2000:]


@pytest.mark.parametrize("flavour", ["fake", "tensorrt_rtx"])
def test_the_allocator_subclasses_the_flavours_base(flavour: str) -> None:
    """The same class works over the real binding's IOutputAllocator (and its Dims) and the fake's."""
    from pyrt.device.output_allocator import PlannedOutput, allocator_class
    from pyrt.sim.fake_tensorrt import Dims as FakeDims
    from pyrt.sim.fake_tensorrt import IOutputAllocator as FakeBase

    if flavour == "fake":
        base, dims = FakeBase, FakeDims
    else:
        trt = pytest.importorskip("tensorrt_rtx")
        base, dims = trt.IOutputAllocator, trt.Dims
    planned = PlannedOutput("engine_0", "output_0")
    allocator = allocator_class(base)(planned)
    assert isinstance(allocator, base)
    planned.plan(address=0x1000, capacity=64)
    assert allocator.reallocate_output_async("output_0", 0x1000, 48, 256, 0) == 0x1000
    allocator.notify_shape("output_0", dims([3, 4]))
    assert planned.result() == (3, 4)
    planned.plan(address=0x1000, capacity=64)
    assert allocator.reallocate_output_async("output_0", 0x1000, 65, 256, 0) == 0
    with pytest.raises(ExecutionError, match="needs 65 bytes, more than the 64 bytes"):
        planned.result()


def test_an_engine_reports_the_shape_and_refuses_capture_with_a_reason() -> None:
    """Engine level: -1 before running, the reported shape after, and a typed refusal inside a capture
    (a caller capturing its own stream, e.g. torch.cuda.graph around a device-tensor run)."""
    from pyrt.engine import TensorRTEngine
    from pyrt.errors import EngineError
    from pyrt.format.trt_blob import IOBinding
    from pyrt.sim.refengine import Ref, RefEngine, RefNode, RefTensor

    ref = RefEngine([RefTensor("x", "float32", (8,))], [RefTensor("y", "int64", (-1, 1))],
                    nodes=[RefNode("aten::gt.Scalar", [Ref("x"), 0.0], {}, ["m"]),
                           RefNode("aten::nonzero.default", [Ref("m")], {}, ["y"])])
    bindings = [IOBinding("x", "float32", (8,), True), IOBinding("y", "int64", (-1, 1), False)]
    values = np.array([1, -1, 2, -2, 3, -3, 4, -4], np.float32)
    with simulated_gpus(1) as sim, TensorRTEngine.load(memoryview(ref.to_bytes()), device=0,
                                                       io_bindings=bindings) as engine:
        engine.configure(None, "automatic")
        assert engine.infer_output_shapes([(8,)]) == [(-1, 1)] and engine.data_dependent == ("y",)
        x, y = sim.cuda.alloc(32, 0), sim.cuda.alloc(64, 0)
        sim.cuda.memcpy_htod(x, values)
        with sim.cuda.stream(0) as s:
            engine.execute([x.ptr], [y.ptr], s.handle, [64])
            assert engine.reported_shape("y") == (4, 1)
            s.synchronize()
            out = np.empty((4, 1), np.int64)
            sim.cuda.memcpy_dtoh(out, y)
            assert out[:, 0].tolist() == [0, 2, 4, 6]
            sim.cuda.call("cuStreamBeginCapture", s.raw, 1)
            with pytest.raises(EngineError, match="cannot be captured in a CUDA graph"):
                engine.execute([x.ptr], [y.ptr], s.handle, [64])
            sim.cuda.call("cuGraphDestroy", sim.cuda.call("cuStreamEndCapture", s.raw))
