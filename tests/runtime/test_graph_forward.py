"""Whole-method CUDA graphs for device callers (pyrt.runtime.graph_forward) on the asynchronous simulated GPU.

The chain program plans its input, output and every value between its N engines
in cuda:0 memory, so with ``cuda_graphs=True`` a forward called with device
tensors is: input copy, one graph launch, output. The fake driver runs queued
work only when something waits for it, so a missing event shows as a wrong
answer here, as it can on a GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pyrt.errors import InputError, ProgramClosedError
from pyrt.format.dtypes import ScalarType
from pyrt.memory.tensors import DeviceTensor, OwnedDeviceTensor
from pyrt.runtime.program import Program
from tests.fixtures import gpu_programs

N = 6


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("executorch")
    return gpu_programs.chain_program(tmp_path_factory.mktemp("graph_forward") / "chain.pte", N, device_io=True)


def _want(x: np.ndarray) -> np.ndarray:
    return gpu_programs.chain_expected(x, N)


_inputs = gpu_programs.chain_inputs


def _device(sim: Any, x: np.ndarray, stream: Any = None) -> OwnedDeviceTensor:
    """``x`` in cuda:0 memory (copied on ``stream`` when given: queued, not run yet)."""
    alloc = sim.cuda.alloc(x.nbytes, 0)
    private = np.array(x)
    sim.cuda.memcpy_htod(alloc, private, stream=stream)
    t = OwnedDeviceTensor(alloc, 0, ScalarType.FLOAT, x.shape, x.size)
    t.keepalive = private  # read when the queued copy runs
    if stream is not None:
        t.stream = stream.handle
    return t


def _read(sim: Any, t: DeviceTensor) -> np.ndarray:
    """A synchronous copy to the host: it does not wait for pyrt's (non-blocking) streams."""
    out = np.empty(t.shape, np.float32)
    sim.cuda.memcpy_dtoh(out, t.allocation, src_offset=t.offset)
    return out


class _Counter:
    """Counts the runs that take the general path."""

    def __init__(self, runner: Any) -> None:
        self.general = 0
        self._call = runner._call
        runner._call = self

    def __call__(self, inputs: Any, stream: Any) -> Any:
        self.general += 1
        return self._call(inputs, stream)


def test_a_device_forward_is_copies_and_one_graph_launch(sim: Any, chain: Path) -> None:
    with Program(chain, cuda_graphs=True) as prog:
        runner = prog._runners["forward"]
        assert runner._graph_forward is not None and [len(s.steps) for s in runner._segments] == [N]
        counter = _Counter(runner)
        kept = []  # freeing device memory synchronises the device: nothing is freed until the end
        for x in _inputs(6):
            x_dev = _device(sim, x)
            (y,) = prog(x_dev)
            kept += [x_dev, y]
            assert isinstance(y, OwnedDeviceTensor)
            np.testing.assert_allclose(_read(sim, y), _want(x), rtol=1e-6)  # ready on the legacy stream
        assert counter.general == 2  # eager, then capture; the other four replay
        assert sim.driver.graph_launches == 5


def test_outputs_are_fresh_buffers_the_next_replay_leaves_alone(sim: Any, chain: Path) -> None:
    with Program(chain, cuda_graphs=True) as prog:
        xs = _inputs(6)
        for x in xs[:2]:
            prog(_device(sim, x))
        stream = sim.cuda.stream(0)
        inputs = [_device(sim, x) for x in xs[2:]]  # kept: freeing device memory synchronises
        ys = [prog(x, stream=stream)[0] for x in inputs]  # all queued, none run yet
        assert sim.driver.pending(stream.handle) > 0
        assert len({y.ptr for y in ys}) == len(ys)
        stream.synchronize()
        for x, y in zip(xs[2:], ys, strict=True):
            np.testing.assert_allclose(_read(sim, y), _want(x), rtol=1e-6)


def test_static_outputs_are_views_the_next_replay_overwrites(sim: Any, chain: Path) -> None:
    with Program(chain, cuda_graphs=True, graph_outputs="static") as prog:
        xs = _inputs(5)
        for x in xs[:2]:
            prog(_device(sim, x))
        (y3,) = prog(_device(sim, xs[2]))
        np.testing.assert_allclose(_read(sim, y3), _want(xs[2]), rtol=1e-6)
        (y4,) = prog(_device(sim, xs[3]))
        assert y4 is y3  # the planned output buffer, as torch's CUDA graphs hand out
        np.testing.assert_allclose(_read(sim, y3), _want(xs[3]), rtol=1e-6)


def test_bad_graph_outputs_is_an_input_error(sim: Any, chain: Path) -> None:
    with pytest.raises(InputError, match="graph_outputs='views'"):
        Program(chain, cuda_graphs=True, graph_outputs="views")


def test_the_callers_stream_carries_the_work(sim: Any, chain: Path) -> None:
    with Program(chain, cuda_graphs=True) as prog:
        xs = _inputs(4)
        stream = sim.cuda.stream(0)
        for x in xs[:2]:
            prog(_device(sim, x), stream=stream)
        stream.synchronize()
        own = prog._contexts[0].own_stream(0)
        x = _device(sim, xs[2])
        (y,) = prog(x, stream=stream)
        assert sim.driver.pending(stream.handle) > 0 and sim.driver.pending(own.handle) == 0
        assert y.__cuda_array_interface__["stream"] == stream.handle  # consumers order after it
        _read(sim, y)  # unordered: the caller's stream has not even reached the output's allocation yet
        assert [h for h in sim.driver.hazards if "before its stream reached cuMemAllocAsync" in h]
        sim.driver.hazards.clear()
        stream.synchronize()
        np.testing.assert_allclose(_read(sim, y), _want(xs[2]), rtol=1e-6)


def test_a_producers_stream_is_waited_for(sim: Any, chain: Path) -> None:
    """An input whose data is still queued on another stream (its CAI "stream") is read after it."""
    with Program(chain, cuda_graphs=True) as prog:
        xs = _inputs(4)
        for x in xs[:2]:
            prog(_device(sim, x))
        producer, stream = sim.cuda.stream(0), sim.cuda.stream(0)
        x = _device(sim, xs[2], stream=producer)  # the copy is queued on ``producer``, not run
        (y,) = prog(x, stream=stream)
        stream.synchronize()  # runs the producer's copy first: the replay's stream waits for it
        assert sim.driver.pending(producer.handle) == 0
        np.testing.assert_allclose(_read(sim, y), _want(xs[2]), rtol=1e-6)


def test_without_a_stream_the_legacy_streams_work_comes_first(sim: Any, chain: Path) -> None:
    """A device caller that names no stream may still be producing its input on the legacy default stream
    (the input says nothing of it): the replay on pyrt's own stream is ordered after the legacy stream's work."""
    with Program(chain, cuda_graphs=True) as prog:
        xs = _inputs(4)
        for x in xs[:2]:
            prog(_device(sim, x))
        x_next, other = _device(sim, xs[3]), sim.cuda.stream(0)
        x = _device(sim, xs[2], stream=sim.cuda.borrowed_stream(0, 0))  # queued on the legacy stream, not run
        x.stream = None  # the caller names no stream
        (y,) = prog(x)
        prog(x_next, stream=other)  # waits for the first replay's end on pyrt's stream, not for the legacy stream
        other.synchronize()  # runs pyrt's stream: its input copy must come after the legacy stream's copy
        np.testing.assert_allclose(_read(sim, y), _want(xs[2]), rtol=1e-6)


def test_a_run_on_another_stream_waits_for_the_last_one(sim: Any, chain: Path) -> None:
    """Both runs write the same planned buffers: the second stream's work starts after the first's."""
    with Program(chain, cuda_graphs=True) as prog:
        xs = _inputs(4)
        for x in xs[:2]:
            prog(_device(sim, x))
        s1, s2 = sim.cuda.stream(0), sim.cuda.stream(0)
        x1, x2 = _device(sim, xs[2]), _device(sim, xs[3])
        (y1,) = prog(x1, stream=s1)
        (y2,) = prog(x2, stream=s2)
        assert sim.driver.pending(s1.handle) > 0
        s2.synchronize()
        assert sim.driver.pending(s1.handle) == 0
        np.testing.assert_allclose(_read(sim, y1), _want(xs[2]), rtol=1e-6)
        np.testing.assert_allclose(_read(sim, y2), _want(xs[3]), rtol=1e-6)


def test_general_runs_and_replays_mix(sim: Any, chain: Path) -> None:
    """Host inputs, another shape or dtype take the general path (its results, its typed errors)."""
    with Program(chain, cuda_graphs=True) as prog:
        counter = _Counter(prog._runners["forward"])
        xs = _inputs(6)
        for x in xs[:3]:
            prog(_device(sim, x))
        assert counter.general == 2
        y = prog(xs[3])[0]  # numpy in: numpy out, through the general path (which replays the graph)
        np.testing.assert_allclose(y, _want(xs[3]), rtol=1e-6)
        assert counter.general == 3
        (y,) = prog(_device(sim, xs[4]))
        np.testing.assert_allclose(_read(sim, y), _want(xs[4]), rtol=1e-6)
        assert counter.general == 3
        with pytest.raises(InputError, match="shape"):
            prog(_device(sim, np.zeros(5, np.float32)))
        wrong = _device(sim, xs[5])
        wrong.scalar_type = ScalarType.INT
        with pytest.raises(InputError, match="float32|Float"):
            prog(wrong)


def test_a_cuda_array_interface_input(sim: Any, chain: Path) -> None:
    class Cai:
        def __init__(self, t: DeviceTensor) -> None:
            self.t = t
            self.__cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (t.ptr, False),
                                             "version": 3, "strides": None}

    with Program(chain, cuda_graphs=True) as prog:
        counter = _Counter(prog._runners["forward"])
        for x in _inputs(4):
            (y,) = prog(Cai(_device(sim, x)))
            np.testing.assert_allclose(_read(sim, y), _want(x), rtol=1e-6)
        assert counter.general == 2


def test_set_budget_captures_again(sim: Any, chain: Path) -> None:
    with Program(chain, cuda_graphs=True) as prog:
        counter = _Counter(prog._runners["forward"])
        xs = _inputs(7)
        for x in xs[:3]:
            prog(_device(sim, x))
        launches = sim.driver.graph_launches
        prog.set_budget("50%")  # contexts are recreated: the old graph must not be replayed
        for x in xs[3:]:
            (y,) = prog(_device(sim, x))
            np.testing.assert_allclose(_read(sim, y), _want(x), rtol=1e-6)
        assert counter.general == 4  # eager and capture again, then replays
        assert sim.driver.graph_launches == launches + 3


def test_a_profiled_method_runs_step_by_step(sim: Any, chain: Path) -> None:
    with Program(chain, cuda_graphs=True) as prog:
        xs = _inputs(5)
        for x in xs[:3]:
            prog(_device(sim, x))
        launches = sim.driver.graph_launches
        with prog.profile(device_time=False):
            (y,) = prog(_device(sim, xs[3]))
        np.testing.assert_allclose(_read(sim, y), _want(xs[3]), rtol=1e-6)
        assert sim.driver.graph_launches == launches  # observed: instruction by instruction, no replay
        prog(_device(sim, xs[4]))
        assert sim.driver.graph_launches == launches + 1


def test_a_closed_program_refuses_replays(sim: Any, chain: Path) -> None:
    prog = Program(chain, cuda_graphs=True)
    x = _device(sim, _inputs(1)[0])
    for _ in range(3):
        prog(x)
    prog.close()
    with pytest.raises(ProgramClosedError):
        prog(x)


def test_a_dropped_output_is_freed_on_its_stream_without_a_sync(sim: Any, chain: Path) -> None:
    """cuMemFreeAsync on the output's stream: work the caller queued there first still reads it; nothing waits."""
    with Program(chain, cuda_graphs=True) as prog:
        xs = _inputs(3)
        x_devs = [_device(sim, x) for x in xs]  # kept: only the output is dropped
        for x in x_devs[:2]:
            prog(x)
        stream = sim.cuda.stream(0)
        (y,) = prog(x_devs[2], stream=stream)
        assert isinstance(y, OwnedDeviceTensor) and not y.allocation.freed
        assert y.__cuda_array_interface__["stream"] == stream.handle
        out = np.empty(4, np.float32)
        sim.cuda.memcpy_dtoh(out, y.allocation, stream=stream)  # the caller's own use, on the output's stream
        sim.cuda.borrowed_stream(0, 0).synchronize()  # the earlier runs' dropped outputs, freed on the legacy stream
        free, queued, alloc = sim.cuda.mem_info(0)[0], sim.driver.pending(stream.handle), y.allocation
        del y
        assert alloc.freed and sim.driver.pending(stream.handle) == queued + 1  # the free is queued behind it
        assert sim.cuda.mem_info(0)[0] == free  # nothing ran: the host did not wait, the memory is still held
        stream.synchronize()
        np.testing.assert_allclose(out, _want(xs[2]), rtol=1e-6)  # read before the stream reached the free
        assert sim.cuda.mem_info(0)[0] == free + alloc.nbytes


def test_without_a_stream_an_output_is_freed_on_the_legacy_stream(sim: Any, chain: Path) -> None:
    """pyrt's own stream made the legacy stream wait for the outputs: the caller uses them, and frees them, there."""
    with Program(chain, cuda_graphs=True) as prog:
        xs = _inputs(3)
        x_devs = [_device(sim, x) for x in xs]
        for x in x_devs[:2]:
            prog(x)
        (y,) = prog(x_devs[2])
        np.testing.assert_allclose(_read(sim, y), _want(xs[2]), rtol=1e-6)  # the legacy stream: ready
        own = prog._contexts[0].own_stream(0)
        free, alloc = sim.cuda.mem_info(0)[0], y.allocation
        del y
        assert sim.driver.pending(own.handle) == 0  # nothing queued on pyrt's stream: the legacy stream frees it
        assert sim.driver.pending(0) == 1 and sim.cuda.mem_info(0)[0] == free  # queued there, not waited for
        sim.cuda.borrowed_stream(0, 0).synchronize()
        assert sim.cuda.mem_info(0)[0] == free + alloc.nbytes


def test_an_output_outliving_its_stream_is_still_freed(sim: Any, chain: Path) -> None:
    with Program(chain, cuda_graphs=True) as prog:
        xs = _inputs(3)
        x_devs = [_device(sim, x) for x in xs]
        for x in x_devs[:2]:
            prog(x)
        stream = sim.cuda.stream(0)
        (y,) = prog(x_devs[2], stream=stream)
        stream.close()  # its work completes; the output's free falls back to cuMemFree
        np.testing.assert_allclose(_read(sim, y), _want(xs[2]), rtol=1e-6)
        free, alloc = sim.cuda.mem_info(0)[0], y.allocation
        del y
        assert alloc.freed and sim.cuda.mem_info(0)[0] == free + alloc.nbytes


def test_without_the_stream_ordered_allocator_outputs_are_plain_allocations(sim: Any, chain: Path) -> None:
    """A device without memory pools: each output from cuMemAlloc, freed by cuMemFree (a device sync) on drop."""
    sim.driver.memory_pools = False
    with Program(chain, cuda_graphs=True) as prog:
        xs = _inputs(4)
        x_devs = [_device(sim, x) for x in xs]
        for x in x_devs[:2]:
            prog(x)
        stream = sim.cuda.stream(0)
        ys = [prog(x, stream=stream)[0] for x in x_devs[2:]]
        assert sim.driver.graph_launches == 3 and len({y.ptr for y in ys}) == 2
        stream.synchronize()
        for x, y in zip(xs[2:], ys, strict=True):
            np.testing.assert_allclose(_read(sim, y), _want(x), rtol=1e-6)
        free, alloc = sim.cuda.mem_info(0)[0], ys[0].allocation
        del ys[0]
        assert alloc.freed and sim.cuda.mem_info(0)[0] == free + alloc.nbytes
