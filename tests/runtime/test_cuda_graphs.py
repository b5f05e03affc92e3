"""CUDA graphs (Program(cuda_graphs=True)) on the simulated GPU, which implements stream capture.

The chain program runs N engines on cuda:0; the middle ones read and write device
memory only, so they form one capturable segment between the host copies of the
first and last engine. Run 1 is eager, run 2 captures (nothing runs during the
capture: the simulated driver records it) and launches, later runs launch.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pyrt.runtime.program import Program
from pyrt.sim.fake_cuda import CUresult
from tests.fixtures import gpu_programs

N = 6


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("executorch")
    return gpu_programs.chain_program(tmp_path_factory.mktemp("graphs") / "chain.pte", N)


def _want(x: np.ndarray) -> np.ndarray:
    return gpu_programs.chain_expected(x, N)


_inputs = gpu_programs.chain_inputs


def test_device_only_steps_replay_as_one_graph(sim: Any, chain: Path) -> None:
    with Program(chain, cuda_graphs=True) as prog:
        runner = prog._runners["forward"]
        assert [len(s.steps) for s in runner._segments] == [N - 2]  # first and last engines copy to/from host
        for i, x in enumerate(_inputs(5)):
            np.testing.assert_allclose(prog(x)[0], _want(x), rtol=1e-6)  # new inputs each run: a replay reads them
            assert runner._segments[0].state == ("warm" if i == 0 else "graph")
        assert sim.driver.graph_launches == 4


def test_graphs_off_by_default_and_same_results(sim: Any, chain: Path) -> None:
    with Program(chain) as eager, Program(chain, cuda_graphs=True) as graphs:
        for x in _inputs(3):
            np.testing.assert_allclose(graphs(x)[0], eager(x)[0], rtol=0)
        assert eager._runners["forward"]._segments == []


def test_set_budget_captures_again(sim: Any, chain: Path) -> None:
    with Program(chain, cuda_graphs=True) as prog:
        xs = _inputs(6)
        for x in xs[:3]:
            prog(x)
        launches = sim.driver.graph_launches
        prog.set_budget("50%")  # contexts are recreated: the old graph must not be replayed
        assert prog._runners["forward"]._segments[0].state == "eager"
        for x in xs[3:]:
            np.testing.assert_allclose(prog(x)[0], _want(x), rtol=1e-6)
        assert sim.driver.graph_launches == launches + 2  # eager, then capture + launch, then launch


def test_a_refused_capture_runs_eagerly(sim: Any, chain: Path, caplog: pytest.LogCaptureFixture) -> None:
    sim.driver.cuStreamBeginCapture = lambda stream, mode: (CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,)
    with caplog.at_level(logging.WARNING, "pyrt.runtime.cuda_graphs"), Program(chain, cuda_graphs=True) as prog:
        for x in _inputs(4):
            np.testing.assert_allclose(prog(x)[0], _want(x), rtol=1e-6)
        assert prog._runners["forward"]._segments[0].state == "refused"
    assert sim.driver.graph_launches == 0 and "running them eagerly" in caplog.text


def test_a_capture_broken_by_a_synchronising_step_is_void(sim: Any, chain: Path) -> None:
    """A step that synchronises inside the capture invalidates it: nothing ran, the segment runs eagerly."""
    with Program(chain, cuda_graphs=True) as prog:
        segment = prog._runners["forward"]._segments[0]
        cuda = sim.cuda
        segment.steps.insert(1, lambda: cuda.synchronize(0))
        for x in _inputs(3):
            np.testing.assert_allclose(prog(x)[0], _want(x), rtol=1e-6)
        assert segment.state == "refused" and sim.driver.graph_launches == 0
