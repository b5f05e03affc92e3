"""Copies of a method's state rows (:mod:`pyrt.runtime.state_rows`) on the adversarially asynchronous fake GPU.

The fake driver runs queued work only when something waits for it, so these tests fail if the copy is not
queued after the last run's work (it would copy rows that run has not written yet) or if what comes after it
does not wait for it (it would find the rows not copied). A run queues its work on the pyrt stream the copy
uses, even for a caller that passes a stream of its own, so that stream already orders the copy after the run:
``tests/device/test_ordering_mutants.py`` exempts the copy's wait for the last run and expects a failure here
without the event that orders the next run after the copy. The program: two engines on
cuda:0, ``y = relu(x) * 2`` each, every value in one cuda:0 arena; the value between them is its state.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pyrt.format.dtypes import ScalarType
from pyrt.memory.tensors import DeviceTensor, OwnedDeviceTensor
from pyrt.runtime.program import Program
from pyrt.runtime.state_rows import state_tensors
from pyrt.sim import simulated_gpus
from tests.fixtures import gpu_programs

ROWS = 4  # the chain's values are float32 [4]: one float per row


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("executorch")
    return gpu_programs.chain_program(tmp_path_factory.mktemp("state_rows") / "chain.pte", 2, device_io=True)


@pytest.fixture
def sim() -> Iterator[Any]:
    with simulated_gpus(1) as s:
        yield s
        assert s.driver.hazards == [], "the simulated GPU saw a hazard"


def _device(sim: Any, x: np.ndarray) -> OwnedDeviceTensor:
    alloc = sim.cuda.alloc(x.nbytes, 0)
    sim.cuda.memcpy_htod(alloc, np.array(x))
    return OwnedDeviceTensor(alloc, 0, ScalarType.FLOAT, x.shape, x.size)


def _state_after_the_copies(sim: Any, prog: Program) -> np.ndarray:
    """The state tensor once the events the method's next run waits for have completed, the copies' first (the
    fake runs queued work as it is waited for: a copy not itself ordered after the run it copies from runs
    before it)."""
    runner = prog._runners["forward"]
    (index,) = state_tensors(runner.plan)
    for event in reversed(runner.devices.last_run):
        event.synchronize()
    t: DeviceTensor = runner.plan.table.vals[index]
    out = np.empty(t.shape, np.float32)
    sim.cuda.memcpy_dtoh(out, t.allocation, src_offset=t.offset)  # synchronous: waits for no stream of pyrt's
    return out


@pytest.mark.parametrize("callers_stream", [False, True], ids=["pyrts-stream", "callers-stream"])
def test_a_copy_after_a_run_still_queued_copies_the_rows_that_run_writes(sim: Any, chain: Path,
                                                                         callers_stream: bool) -> None:
    """The run is still queued when the copy is asked for (its caller passing no stream, or a stream of its own)."""
    x = np.array([1.0, -2.0, 3.0, 4.0], np.float32)
    with Program(str(chain)) as prog:
        assert prog.state_sizes() == (ROWS,)
        stream = sim.cuda.stream(0) if callers_stream else None
        prog(_device(sim, x), stream=stream)  # queued: nothing waits for it yet
        assert stream is None or sim.driver.pending(stream.handle) > 0
        assert prog.copy_state_rows("forward", ROWS, [(0, 2, 2)]) == 1
        mid = np.maximum(x, 0) * 2
        assert _state_after_the_copies(sim, prog).tolist() == [*mid[:2], *mid[:2]]


def test_the_run_after_a_copy_reads_the_copied_rows(sim: Any, chain: Path) -> None:
    """Rows copied between two runs of which the second overwrites them: the copy must land in between."""
    xs = [np.array([1.0, -2.0, 3.0, 4.0], np.float32), np.array([5.0, 6.0, -7.0, 8.0], np.float32)]
    with Program(str(chain)) as prog:
        prog(_device(sim, xs[0]))
        prog.copy_state_rows("forward", ROWS, [(1, 3, 1)])
        (y,) = prog(_device(sim, xs[1]))  # writes the whole state again: the copy must not land after it
        out = np.empty(4, np.float32)
        sim.cuda.memcpy_dtoh(out, y.allocation, src_offset=y.offset)  # a caller without a stream: ready
        assert out.tolist() == gpu_programs.chain_expected(xs[1], 2).tolist()
        assert _state_after_the_copies(sim, prog).tolist() == (np.maximum(xs[1], 0) * 2).tolist()
