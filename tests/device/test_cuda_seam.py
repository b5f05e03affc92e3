"""The CUDA seam (pyrt.cuda): contract tests on the fake driver always, on a real GPU when present."""

from __future__ import annotations

import inspect
import re
import types
from collections.abc import Iterator

import numpy as np
import pytest

import pyrt.cuda
from pyrt.cuda import Cuda
from pyrt.errors import DeviceError, InputError
from pyrt.sim import simulated_gpus
from pyrt.sim.fake_cuda import CUdevice_attribute, CUresult, FakeDriver

MiB = 1 << 20


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.gpu)])
def cuda(request: pytest.FixtureRequest) -> Iterator[Cuda]:
    """A CUDA seam with at least one device: two simulated GPUs, or the real driver."""
    if request.param == "fake":
        with simulated_gpus(2, memory=[64 * MiB, 32 * MiB]) as sim:
            yield sim.cuda
        return
    real = Cuda()
    if real.device_count() == 0:
        pytest.skip(f"needs a CUDA device: {real.describe_devices()}")
    yield real


def _pattern(n: int, seed: int) -> np.ndarray:
    return ((np.arange(n) * 7 + seed) % 251).astype(np.uint8)


# -- devices -----------------------------------------------------------------------------
def test_devices_report_name_capability_and_memory(cuda: Cuda) -> None:
    devices = cuda.devices()
    assert len(devices) == cuda.device_count() >= 1
    for i, d in enumerate(devices):
        assert d.index == i and d.name and "\0" not in d.name
        assert d.compute_capability[0] >= 3 and d.total_memory > 0
    free, total = cuda.mem_info(0)
    assert 0 <= free <= total == devices[0].total_memory


def test_missing_device_lists_present_devices(cuda: Cuda) -> None:
    count = cuda.device_count()
    with pytest.raises(DeviceError, match=rf"CUDA device {count} does not exist .*present devices: 0: ") as info:
        cuda.require_device(count, purpose="a test")
    assert cuda.devices()[0].name in str(info.value) and "a test" in str(info.value)
    with pytest.raises(DeviceError, match="must be an int"):
        cuda.require_device("0")  # type: ignore[arg-type]
    with pytest.raises(DeviceError, match="does not exist"):
        cuda.alloc(16, device=count)


def test_failed_driver_call_names_the_call_and_the_error(cuda: Cuda) -> None:
    cuda.device_count()  # initializes the driver
    with pytest.raises(DeviceError, match="cuDeviceGet failed with CUDA_ERROR_INVALID_DEVICE"):
        cuda.call("cuDeviceGet", 1000)


def test_no_gpu_means_zero_devices_not_an_exception() -> None:
    with simulated_gpus(0) as sim:
        assert pyrt.cuda.device_count() == 0 and pyrt.cuda.devices() == []
        with pytest.raises(DeviceError, match="no CUDA devices are present .*CUDA_ERROR_NO_DEVICE"):
            pyrt.cuda.require_device(0)
        with pytest.raises(DeviceError, match="does not exist"):
            sim.cuda.alloc(1, 0)


def test_missing_driver_library_means_zero_devices() -> None:
    broken = types.SimpleNamespace(cuInit=_raise_missing_library, CUresult=CUresult)
    cuda = Cuda(broken)
    assert cuda.device_count() == 0
    with pytest.raises(DeviceError, match="cuInit failed: OSError: libcuda.so.1"):
        cuda.require_device(0)


def _raise_missing_library(flags: int) -> None:
    raise OSError("libcuda.so.1: cannot open shared object file")


def test_real_driver_on_a_machine_without_gpu_reports_zero() -> None:
    real = Cuda()
    if real.device_count() > 0:
        pytest.skip("this machine has a GPU; the no-GPU path is covered by the fake")
    assert real.devices() == []
    with pytest.raises(DeviceError, match="no CUDA devices are present"):
        real.require_device(0)


def test_use_driver_swaps_and_restores() -> None:
    before = pyrt.cuda.current()
    fake = FakeDriver(gpus=3)
    with pyrt.cuda.use_driver(fake) as cuda:
        assert pyrt.cuda.current() is cuda and pyrt.cuda.device_count() == 3
    assert pyrt.cuda.current() is before
    assert pyrt.cuda.resolve(cuda) is cuda and pyrt.cuda.resolve(None) is before


# -- memory ------------------------------------------------------------------------------
def test_round_trip_with_offsets_keeps_neighbouring_bytes(cuda: Cuda) -> None:
    with cuda.alloc(300, device=0) as buf:
        cuda.memcpy_htod(buf, _pattern(300, 1))
        cuda.memcpy_htod(buf, _pattern(50, 99), dst_offset=100)
        out = np.empty(300, np.uint8)
        cuda.memcpy_dtoh(out, buf)
        expected = _pattern(300, 1)
        expected[100:150] = _pattern(50, 99)
        np.testing.assert_array_equal(out, expected)
        part = bytearray(20)
        cuda.memcpy_dtoh(part, buf, src_offset=95)
        assert bytes(part) == expected[95:115].tobytes()


def test_typed_host_buffers_and_read_only_sources(cuda: Cuda) -> None:
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    with cuda.alloc(x.nbytes, 0) as buf:
        cuda.memcpy_htod(buf, x.tobytes())  # bytes: read-only is fine for a source
        out = np.zeros_like(x)
        cuda.memcpy_dtoh(out, buf)
    np.testing.assert_array_equal(out, x)


def test_bounds_and_buffer_errors(cuda: Cuda) -> None:
    with cuda.alloc(64, 0) as buf:
        with pytest.raises(InputError, match=r"destination range \[60, 68\) overflows the 64-byte"):
            cuda.memcpy_htod(buf, bytes(8), dst_offset=60)
        with pytest.raises(InputError, match="source range"):
            cuda.memcpy_dtoh(bytearray(65), buf)
        with pytest.raises(InputError, match="read-only"):
            cuda.memcpy_dtoh(b"\0" * 8, buf)
        with pytest.raises(InputError, match="C-contiguous"):
            cuda.memcpy_htod(buf, np.zeros((4, 4), np.uint8)[:, ::2])
        with pytest.raises(InputError, match="buffer protocol"):
            cuda.memcpy_htod(buf, 12345)
        with pytest.raises(InputError, match="offset must be a non-negative int"):
            cuda.memcpy_htod(buf, bytes(1), dst_offset=-1)
    with pytest.raises(InputError, match="non-negative int"):
        cuda.alloc(-1, 0)


def test_free_is_idempotent_and_freed_memory_is_refused(cuda: Cuda) -> None:
    buf = cuda.alloc(32, 0)
    buf.free()
    buf.free()
    assert "freed" in repr(buf)
    with pytest.raises(DeviceError, match="was freed"):
        cuda.memcpy_htod(buf, bytes(4))


def test_out_of_memory_names_the_call(cuda: Cuda) -> None:
    with pytest.raises(DeviceError, match="cuMemAlloc failed with CUDA_ERROR_OUT_OF_MEMORY"):
        cuda.alloc(1 << 60, 0)


def test_device_to_device_and_async_copies(cuda: Cuda) -> None:
    with cuda.alloc(128, 0) as a, cuda.alloc(128, 0) as b, cuda.stream(0) as s:
        src = _pattern(128, 3)  # an asynchronous copy reads it when it runs: keep it until the sync
        cuda.memcpy_htod(a, src, stream=s)
        cuda.memcpy_dtod(b, a, 64, dst_offset=64, stream=s)
        s.synchronize()  # a synchronous copy does not wait for a non-blocking stream
        cuda.memcpy_dtod(b, a, 64)
        out = np.empty(128, np.uint8)
        cuda.memcpy_dtoh(out, b, stream=s)
        s.synchronize()
        np.testing.assert_array_equal(out, np.concatenate([_pattern(128, 3)[:64]] * 2))


def test_stream_ordered_memory_is_used_and_freed_in_stream_order(cuda: Cuda) -> None:
    with cuda.stream(0) as s, cuda.stream(0) as other, cuda.event(0) as ready:
        buf = cuda.alloc_async(64, s)
        assert (buf.nbytes, buf.device) == (64, 0)
        src = _pattern(64, 9)
        cuda.memcpy_htod(buf, src, stream=s)  # after the allocation on its stream
        ready.record(s)
        other.wait(ready)  # another stream uses it once ordered after the allocation
        out = np.empty(64, np.uint8)
        cuda.memcpy_dtoh(out, buf, stream=other)
        ready.record(other)
        s.wait(ready)  # ... and before the free, which goes on ``s``
        buf.free()
        buf.free()  # idempotent
        s.synchronize()
        np.testing.assert_array_equal(out, _pattern(64, 9))
        with pytest.raises(DeviceError, match="was freed"):
            cuda.memcpy_htod(buf, bytes(4), stream=s)


def test_stream_ordered_memory_refuses_bad_sizes_closed_streams_and_too_much(cuda: Cuda) -> None:
    s = cuda.stream(0)
    with pytest.raises(InputError, match="non-negative int"):
        cuda.alloc_async(-1, s)
    with pytest.raises(DeviceError, match="cuMemAllocAsync failed with CUDA_ERROR_OUT_OF_MEMORY"):
        cuda.alloc_async(1 << 60, s)
    s.close()
    with pytest.raises(DeviceError, match="closed"):
        cuda.alloc_async(16, s)


def test_peer_copies_between_devices(cuda: Cuda) -> None:
    if cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    with cuda.alloc(96, 0) as a, cuda.alloc(96, 1) as b, cuda.stream(1) as s:
        cuda.memcpy_htod(a, _pattern(96, 5))
        with pytest.raises(DeviceError, match="use memcpy_peer"):
            cuda.memcpy_dtod(b, a, 96)
        cuda.memcpy_peer(b, a, 48)
        cuda.memcpy_peer(b, a, 48, dst_offset=48, src_offset=48, stream=s)
        s.synchronize()
        out = np.empty(96, np.uint8)
        cuda.memcpy_dtoh(out, b)
        np.testing.assert_array_equal(out, _pattern(96, 5))


def test_streams_and_events(cuda: Cuda) -> None:
    with cuda.stream(0) as s1, cuda.stream(0) as s2, cuda.event(0) as ev, cuda.alloc(16, 0) as buf:
        assert s1.handle != s2.handle and s1.handle != 0
        cuda.memcpy_htod(buf, bytes(range(16)), stream=s1)
        ev.record(s1)
        s2.wait(ev)
        out = bytearray(16)
        cuda.memcpy_dtoh(out, buf, stream=s2)
        s2.synchronize()
        ev.synchronize()
        assert bytes(out) == bytes(range(16))
    with pytest.raises(DeviceError, match="closed"):
        s1.synchronize()
    cuda.synchronize(0)


def test_stream_of_another_device_is_refused(cuda: Cuda) -> None:
    if cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    with cuda.alloc(8, 0) as buf, cuda.stream(1) as s:
        with pytest.raises(DeviceError, match="stream of device 1 used for memory on device 0"):
            cuda.memcpy_htod(buf, bytes(8), stream=s)


def test_borrowed_memory_is_not_freed(cuda: Cuda) -> None:
    with cuda.alloc(16, 0) as owner:
        view = cuda.borrow(owner.ptr, 8, 0)
        cuda.memcpy_htod(view, b"ABCDEFGH")
        view.free()
        out = bytearray(8)
        cuda.memcpy_dtoh(out, owner)  # still allocated
        assert bytes(out) == b"ABCDEFGH"


# -- the fake itself: honest to the real binding --------------------------------------------------
def test_allocations_land_on_the_requested_device() -> None:
    with simulated_gpus(2) as sim:
        a, b = sim.cuda.alloc(100, 0), sim.cuda.alloc(200, 1)
        assert sim.driver.owner(a.ptr) == 0 and sim.driver.owner(b.ptr) == 1
        assert (sim.driver.memory_used(0), sim.driver.memory_used(1)) == (100, 200)
        a.free(), b.free()
        assert sim.driver.live_allocations() == 0


def test_fake_driver_catches_misuse_real_cuda_would_punish() -> None:
    drv = FakeDriver(gpus=2, memory=MiB)
    assert drv.cuMemAlloc(16)[0] == CUresult.CUDA_ERROR_NOT_INITIALIZED
    drv.cuInit(0)
    assert drv.cuMemAlloc(16)[0] == CUresult.CUDA_ERROR_INVALID_CONTEXT
    ctx0 = drv.cuDevicePrimaryCtxRetain(drv.cuDeviceGet(0)[1])[1]
    ctx1 = drv.cuDevicePrimaryCtxRetain(drv.cuDeviceGet(1)[1])[1]
    drv.cuCtxSetCurrent(ctx1)
    err, ptr1 = drv.cuMemAlloc(16)
    drv.cuCtxSetCurrent(ctx0)
    host = np.zeros(16, np.uint8)
    assert drv.cuMemcpyHtoD(ptr1, host, 16)[0] == CUresult.CUDA_ERROR_INVALID_VALUE  # device 1 memory, device 0 current
    assert drv.cuMemcpyHtoD(host.ctypes.data, host, 16)[0] == CUresult.CUDA_ERROR_INVALID_VALUE  # a host pointer
    assert drv.cuMemcpyPeer(ptr1, ctx0, ptr1, ctx1, 16)[0] == CUresult.CUDA_ERROR_INVALID_VALUE  # wrong dst context
    assert drv.cuMemAlloc(2 * MiB)[0] == CUresult.CUDA_ERROR_OUT_OF_MEMORY
    assert drv.cuMemFree(12345)[0] == CUresult.CUDA_ERROR_INVALID_VALUE
    assert drv.cuStreamSynchronize(777)[0] == CUresult.CUDA_ERROR_INVALID_HANDLE


def test_fake_matches_the_real_binding_surface() -> None:
    """Same error codes, attribute values and parameter names as cuda-python's driver."""
    driver = pytest.importorskip("cuda.bindings.driver")
    for code in CUresult:
        assert int(getattr(driver.CUresult, code.name)) == int(code)
    for attr in CUdevice_attribute:
        assert int(getattr(driver.CUdevice_attribute, attr.name)) == int(attr)
    fake_calls = [n for n in dir(FakeDriver) if re.match(r"cu[A-Z]", n)]
    assert len(fake_calls) > 20
    for name in fake_calls:
        real_sig = getattr(driver, name).__doc__.splitlines()[0]
        real_params = [p.split(":")[0].split()[-1]
                       for p in re.findall(r"\((.*)\)", real_sig)[0].split(",") if p.strip()]
        fake_params = list(inspect.signature(getattr(FakeDriver, name)).parameters)[1:]
        assert fake_params == real_params, name
