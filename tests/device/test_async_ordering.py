"""Ordering on an asynchronous GPU, through the simulated driver that delays and reorders work.

The fake driver runs queued work only when something waits for it, so each
test here fails if pyrt leaves out one event between streams, one
synchronisation before the host reads a device result, or one keep-alive of a
host buffer that an asynchronous copy still reads (tests/device/test_ordering_mutants.py
removes each such statement in turn and expects a failure from this module).
Programs come from tests/fixtures/gpu_programs.py; every test runs them several times
with fresh inputs and requires the driver to have seen no hazard.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from pyrt.cuda import DeviceAllocation
from pyrt.format.dtypes import ScalarType
from pyrt.kernels.prim_kernels import _copy_device
from pyrt.memory.tensors import DeviceTensor
from pyrt.runtime.device_context import DeviceContext
from pyrt.runtime.program import Program
from pyrt.sim import simulated_gpus
from tests.fixtures import gpu_programs

W = gpu_programs.HANDMADE_W


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return gpu_programs.programs_for(tmp_path_factory)


@pytest.fixture
def sim() -> Iterator[Any]:
    with simulated_gpus(2) as s:
        yield s
        assert s.driver.hazards == [], "the simulated GPU saw a hazard"


def _inputs(seed: int, runs: int = 3, shape: tuple[int, ...] = (2, 3)) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(runs)]


def _want(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0) ** 2 + W


def _device_tensor(sim: Any, x: np.ndarray, device: int = 0, stream: Any = None) -> DeviceTensor:
    buf = sim.cuda.alloc(x.nbytes, device)
    sim.cuda.memcpy_htod(buf, x, stream=stream)
    t = DeviceTensor(buf, 0, ScalarType.FLOAT, x.shape, x.size, keepalive=x)
    t.stream = None if stream is None else stream.handle  # a producer still at work: consumers wait
    return t


def _host(sim: Any, t: DeviceTensor) -> np.ndarray:
    out = np.empty(t.shape, np.float32)
    sim.cuda.memcpy_dtoh(out, t.allocation, src_offset=t.offset)  # synchronous, on the legacy stream
    return out


# -- the fake itself ------------------------------------------------------------------------------
def test_the_fake_delays_work_until_something_waits(sim: Any) -> None:
    cuda = sim.cuda
    x = np.arange(16, dtype=np.uint8)
    with cuda.alloc(16, 0) as buf, cuda.stream(0) as s:
        cuda.memcpy_htod(buf, x, stream=s)
        out = np.zeros(16, np.uint8)
        cuda.memcpy_dtoh(out, buf)  # synchronous copy: does not wait for a non-blocking stream
        assert not np.array_equal(out, x) and sim.driver.pending() == 1
        s.synchronize()
        cuda.memcpy_dtoh(out, buf)
        np.testing.assert_array_equal(out, x)


def test_the_fake_poisons_a_host_buffer_freed_before_its_copy_ran(sim: Any) -> None:
    cuda = sim.cuda
    with cuda.alloc(16, 0) as buf, cuda.stream(0) as s:
        cuda.memcpy_htod(buf, np.arange(16, dtype=np.uint8) + 1, stream=s)  # a temporary: gone at once
        s.synchronize()
        out = np.zeros(16, np.uint8)
        cuda.memcpy_dtoh(out, buf)
    assert set(out.tolist()) == {0xCD} and "freed before the copy ran" in sim.driver.hazards.pop()


def test_events_order_work_across_streams(sim: Any) -> None:
    cuda = sim.cuda
    x = np.arange(32, dtype=np.uint8)
    with cuda.alloc(32, 0) as a, cuda.alloc(32, 1) as b, cuda.stream(0) as s0, cuda.stream(1) as s1, \
            cuda.event(0) as ev:
        cuda.memcpy_htod(a, x, stream=s0)
        ev.record(s0)
        s1.wait(ev)
        cuda.memcpy_peer(b, a, 32, stream=s1)
        s1.synchronize()  # runs s0's copy first, through the event
        out = np.zeros(32, np.uint8)
        cuda.memcpy_dtoh(out, b)
        np.testing.assert_array_equal(out, x)


# -- pyrt's ordering -------------------------------------------------------------------------------
def test_engine_feeds_an_engine_on_another_device(sim: Any, programs: dict[str, Path]) -> None:
    """cuda:0 engine -> cuda:0 arena -> peer copy (after an event) -> cuda:1 engine -> host (after a sync)."""
    with Program(programs["two_engines"]) as prog:
        for x in _inputs(1):
            (out,) = prog(x)
            np.testing.assert_allclose(out, _want(x), rtol=1e-6)


def test_engine_output_crosses_devices(sim: Any, programs: dict[str, Path]) -> None:
    """cuda:1 engine -> peer copy out (after an event) -> cuda:0 arena -> cuda:0 engine."""
    with Program(programs["engines_swapped"]) as prog:
        for x in _inputs(2):
            (out,) = prog(x)
            np.testing.assert_allclose(out, _want(x), rtol=1e-6)


def test_device_output_for_a_host_caller(sim: Any, programs: dict[str, Path]) -> None:
    with Program(programs["device_out"]) as prog:
        for x in _inputs(3):
            (out,) = prog(x)
            assert isinstance(out, np.ndarray)
            np.testing.assert_allclose(out, _want(x), rtol=1e-6)


def test_device_output_is_ready_on_the_legacy_stream(sim: Any, programs: dict[str, Path]) -> None:
    """A device caller that gave no stream may read the result with a synchronous copy."""
    with Program(programs["device_out"]) as prog:
        for x in _inputs(4):
            (out,) = prog(_device_tensor(sim, x))
            assert isinstance(out, DeviceTensor)
            np.testing.assert_allclose(_host(sim, out), _want(x), rtol=1e-6)


def test_back_to_back_runs_on_a_caller_stream(sim: Any, programs: dict[str, Path]) -> None:
    """On the caller's stream nothing synchronises between runs: buffers a run's queued copies read
    stay alive until those copies have run, though the next run has begun."""
    with Program(programs["device_out"]) as prog, sim.cuda.stream(1) as stream:
        outs = []
        for x in _inputs(8):
            (out,) = prog.run(_device_tensor(sim, x), stream=stream)
            outs.append((x, out))
        stream.synchronize()
        for x, out in outs:
            np.testing.assert_allclose(_host(sim, out), _want(x), rtol=1e-6)


def test_back_to_back_runs_on_one_device_and_a_caller_stream(sim: Any, programs: dict[str, Path]) -> None:
    """Everything on the caller's stream: a run's host -> device copies are still queued when the next
    run begins, so the private buffers they read must outlive them."""
    with Program(programs["device_out"], device_map={"cuda:1": "cuda:0"}) as prog, sim.cuda.stream(0) as stream:
        outs = []
        for x in _inputs(9, runs=4):
            (out,) = prog.run(_device_tensor(sim, x), stream=stream)
            outs.append((x, out))
        stream.synchronize()
        for x, out in outs:
            np.testing.assert_allclose(_host(sim, out), _want(x), rtol=1e-6)


def test_a_dropped_device_output_is_freed_on_the_callers_stream_without_a_sync(sim: Any,
                                                                            programs: dict[str, Path]) -> None:
    """Device outputs come from the stream-ordered allocator: dropping one queues its free behind the
    caller's own work on that stream (cuMemFreeAsync), the host waits for nothing."""
    with Program(programs["device_out"]) as prog, sim.cuda.stream(1) as stream:
        x = _inputs(10, runs=1)[0]
        (out,) = prog.run(_device_tensor(sim, x), stream=stream)
        got = np.empty(x.shape, np.float32)
        sim.cuda.memcpy_dtoh(got, out.allocation, src_offset=out.offset, stream=stream)  # the caller's use
        free, queued, alloc = sim.cuda.mem_info(out.device)[0], sim.driver.pending(stream.handle), out.allocation
        del out
        assert alloc.freed and sim.driver.pending(stream.handle) == queued + 1
        assert sim.cuda.mem_info(alloc.device)[0] == free  # not yet: the stream has not reached the free
        stream.synchronize()
        np.testing.assert_allclose(got, _want(x), rtol=1e-6)
        assert sim.cuda.mem_info(alloc.device)[0] == free + alloc.nbytes


def test_without_a_stream_the_legacy_streams_work_comes_first(sim: Any, programs: dict[str, Path]) -> None:
    """A device caller that names no stream may still be producing its input on the legacy default stream
    (the input says nothing of it): pyrt's own stream is ordered after the legacy stream's work."""
    with Program(programs["device_in"]) as prog:
        x = _inputs(13, runs=1)[0]
        x_dev = _device_tensor(sim, x, stream=sim.cuda.borrowed_stream(0, 0))  # queued on the legacy stream
        x_dev.stream = None  # the caller names no stream
        (y,) = prog(x_dev)  # host results: pyrt's streams run (and read the input) before the call returns
        np.testing.assert_allclose(y, _want(x), rtol=1e-6)


def test_without_a_stream_a_device_output_is_freed_on_the_legacy_stream(sim: Any, programs: dict[str, Path]) -> None:
    with Program(programs["device_out"]) as prog:
        x = _inputs(11, runs=1)[0]
        (out,) = prog(_device_tensor(sim, x))
        np.testing.assert_allclose(_host(sim, out), _want(x), rtol=1e-6)
        free, alloc = sim.cuda.mem_info(out.device)[0], out.allocation
        del out
        assert sim.cuda.mem_info(alloc.device)[0] == free  # queued on the legacy stream: the host did not wait
        sim.cuda.borrowed_stream(0, alloc.device).synchronize()
        assert sim.cuda.mem_info(alloc.device)[0] == free + alloc.nbytes  # the legacy stream reached the free


def test_without_the_stream_ordered_allocator_device_outputs_are_plain_allocations(
        sim: Any, programs: dict[str, Path]) -> None:
    sim.driver.memory_pools = False
    with Program(programs["device_out"]) as prog, sim.cuda.stream(1) as stream:
        x = _inputs(12, runs=1)[0]
        (out,) = prog.run(_device_tensor(sim, x), stream=stream)
        assert type(out.allocation) is DeviceAllocation  # cuMemAlloc; dropping it is cuMemFree
        stream.synchronize()
        np.testing.assert_allclose(_host(sim, out), _want(x), rtol=1e-6)


def test_host_input_into_a_device_arena_is_kept_until_copied(sim: Any, programs: dict[str, Path]) -> None:
    """A non-contiguous input is copied to a temporary that an asynchronous copy reads later."""
    with Program(programs["device_in"]) as prog:
        for x in _inputs(5, shape=(3, 2)):
            (out,) = prog(x.T)
            np.testing.assert_allclose(out, _want(x.T), rtol=1e-6)


def test_device_input_waits_for_its_producer_stream(sim: Any, programs: dict[str, Path]) -> None:
    """A CAI/DeviceTensor input whose producer stream is still at work, into a device arena."""
    with Program(programs["device_in"]) as prog, sim.cuda.stream(0) as producer:
        for x in _inputs(6):
            (out,) = prog(_device_tensor(sim, x, stream=producer))
            np.testing.assert_allclose(out, _want(x), rtol=1e-6)


def test_device_input_to_a_host_arena(sim: Any, programs: dict[str, Path]) -> None:
    """Device data for a host input: copied back after its producer, synchronised before use."""
    data = np.load(programs["trt_only"].with_suffix(".npz"))
    with Program(programs["trt_only"]) as prog, sim.cuda.stream(0) as producer:
        for _ in range(3):
            out = prog(_device_tensor(sim, data["x"], stream=producer))
            np.testing.assert_allclose(out, data["y"], rtol=1e-5, atol=1e-6)


def test_host_kernels_between_engines_reuse_no_queued_memory(sim: Any, programs: dict[str, Path]) -> None:
    """Memory planning reuses a host arena once its value was copied to the device; the copy may still be
    queued when a host kernel writes there, so pyrt copies from a private buffer."""
    data = np.load(programs["host_kernels"].with_suffix(".npz"))
    with Program(programs["host_kernels"]) as prog:
        for i in range(3):
            np.testing.assert_allclose(prog(data[f"x{i}"], data["idx"]), data[f"y{i}"], rtol=1e-5, atol=1e-6)


def test_et_copy_ops_across_two_devices(sim: Any, programs: dict[str, Path]) -> None:
    """The exported graph break: h2d/d2h copies around a host kernel, engines on two devices."""
    data = np.load(programs["graph_break"].with_suffix(".npz"))
    with Program(programs["graph_break"]) as prog:
        for b in (*gpu_programs.BATCHES, 3):
            np.testing.assert_allclose(prog(data[f"x{b}"]), data[f"y{b}"], rtol=1e-5, atol=1e-6)


def test_devices_passed_explicitly_change_nothing_process_wide(programs: dict[str, Path]) -> None:
    """Program(devices=...) runs on what it was given; the process default is never consulted."""
    import pyrt.cuda
    from pyrt.sim import simulated_devices

    sim = simulated_devices(2)
    default = pyrt.cuda.current()
    with Program(programs["two_engines"], devices=sim) as prog:
        with simulated_gpus(2) as other:  # a different default installed mid-life: not used by prog
            for x in _inputs(7):
                (out,) = prog(x)
                np.testing.assert_allclose(out, _want(x), rtol=1e-6)
            assert other.driver.live_allocations() == 0 and other.tensorrt.calls["deserialize_cuda_engine"] == 0
        assert sim.driver.live_allocations() > 0
    assert sim.driver.live_allocations() == 0 and sim.driver.hazards == [] and pyrt.cuda.current() is default


def test_a_host_only_method_waits_for_the_device_before_reading_a_device_input(sim: Any) -> None:
    """A method with no device work copies a device input to the host synchronously, after all of the
    device's work: here the producer's copy is still queued on a stream the input does not name."""
    from tests.fixtures.pte import relu_program

    with Program(relu_program(), kernels="numpy") as prog, sim.cuda.stream(0) as producer:
        x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
        x_dev = _device_tensor(sim, x, stream=producer)  # queued, not run
        x_dev.stream = None  # the caller names no stream
        np.testing.assert_array_equal(prog(x_dev)[0], np.maximum(x, 0))


def test_a_device_copy_to_another_gpu_waits_for_the_sources_writer(sim: Any) -> None:
    """aten::copy_ from a cuda:0 tensor into a cuda:1 tensor (a device-resident buffer's write-back):
    the source is still being written on cuda:0's stream, so the peer copy on cuda:1's stream waits for it."""
    devices = DeviceContext(sim.cuda, {0, 1})
    table = SimpleNamespace(devices=devices)  # the method's value table, as the kernel sees it
    try:
        with sim.cuda.alloc(64, 0) as a, sim.cuda.alloc(64, 1) as b:
            src, dst = (DeviceTensor(m, 16, ScalarType.FLOAT, (2, 3), 6) for m in (a, b))
            for x in _inputs(14):
                sim.cuda.memcpy_htod(a, x, dst_offset=16, stream=devices.stream(0))  # the writer: queued on cuda:0
                _copy_device(dst, src, table, "aten::copy_")
                devices.stream(1).synchronize()  # runs cuda:1's queue; cuda:0's only through an event
                np.testing.assert_array_equal(_host(sim, dst), x)
    finally:
        devices.close()


class _PooledExport:
    """A DLPack producer that exports a private copy of its data from a memory pool: the capsule owns the
    copy, and releasing the capsule hands the block to the pool's next allocation, which writes it at once
    on the legacy stream (as torch's or CuPy's caching allocators do)."""

    def __init__(self, sim: Any, x: np.ndarray, fill: Callable[[Any], None]) -> None:
        self.sim, self.x, self.fill = sim, x, fill
        self._keep: list[Any] = []  # the exports' blocks and ctypes objects

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 0)  # kDLCUDA, cuda:0

    def __dlpack__(self, stream: Any = None) -> Any:
        block = self.sim.cuda.alloc(self.x.nbytes, 0)
        self.sim.cuda.memcpy_htod(block, self.x)  # synchronous: ready for any consumer stream
        shape = (ctypes.c_int64 * self.x.ndim)(*self.x.shape)
        managed = _DLManaged()
        managed.t.data, managed.t.device.device_type, managed.t.ndim = block.ptr, 2, self.x.ndim
        managed.t.dtype.code, managed.t.dtype.bits, managed.t.dtype.lanes, managed.t.shape = 2, 32, 1, shape

        def release(_capsule: int) -> None:  # the capsule's destructor: the block goes back to the pool
            self.fill(block)

        destructor = _CAPSULE_DESTRUCTOR(release)
        self._keep.append((block, shape, managed, destructor))
        new = ctypes.pythonapi.PyCapsule_New
        new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, _CAPSULE_DESTRUCTOR]
        return new(ctypes.addressof(managed), _DLTENSOR, destructor)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensorC(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32), ("dtype", _DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _DLManaged(ctypes.Structure):
    _fields_ = [("t", _DLTensorC), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_DLTENSOR = b"dltensor"


def test_a_dlpack_input_is_kept_until_its_copy_into_a_device_arena_ran(sim: Any, programs: dict[str, Path]) -> None:
    """The capsule pyrt reads a DLPack input through owns the memory; it is kept for the run, so the copy
    into the device arena (queued on pyrt's stream) reads the data before the producer reuses the block."""
    def reuse(block: Any) -> None:
        sim.cuda.memcpy_htod(block, np.full(block.nbytes, 0xAB, np.uint8))  # the pool's next user

    with Program(programs["device_in"]) as prog:
        for x in _inputs(15):
            (out,) = prog(_PooledExport(sim, x, reuse))
            np.testing.assert_allclose(out, _want(x), rtol=1e-6)
