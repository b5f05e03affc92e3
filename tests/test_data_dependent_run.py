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
from pyrt.testing import datadep_models as dm
from pyrt.testing import simulated_gpus


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


RESIZE = "targets[k] = _out_target(outs[k], engine.reported_shape(name), table)"


def test_a_mutant_without_the_resize_fails(tmp_path: Path) -> None:
    """Remove the resize to TensorRT's reported shape from a copy of pyrt: the eager comparison fails."""
    from tests.test_ordering_mutants import _copy_tree, _mutate

    tree = _copy_tree(tmp_path)
    _mutate(tree, "pyrt/runtime/delegates.py", RESIZE)
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "--rootdir",
         str(tree), str(tree / "tests" / "test_data_dependent_run.py"), "-k", "test_runs_equal_eager and where_mlp"],
        cwd=tree, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 1 and "1 failed" in result.stdout, result.stdout[-2000:]
