"""Owned device memory on the simulated GPU: owning what cuMemAlloc returned, freeing it, typed errors."""

from __future__ import annotations

import gc

import pytest

from pyrt.cuda import DeviceAllocation
from pyrt.errors import DeviceError
from pyrt.format.dtypes import ScalarType
from pyrt.memory.tensors import OutputTensor, OwnedDeviceTensor
from pyrt.sim import simulated_gpus
from pyrt.sim.fake_cuda import CUresult


def test_an_owned_allocation_is_freed_once() -> None:
    with simulated_gpus(1) as sim:
        free = sim.cuda.mem_info(0)[0]
        ptr = int(sim.cuda.call("cuMemAlloc", 256))
        a = DeviceAllocation(sim.cuda, ptr, 256, 0, owned=True)
        assert (a.ptr, a.nbytes, a.device, a.freed) == (ptr, 256, 0, False)
        assert sim.cuda.mem_info(0)[0] == free - 256
        a.free()
        a.free()  # idempotent
        assert a.freed and sim.cuda.mem_info(0)[0] == free


def test_freeing_memory_the_driver_does_not_know_is_a_device_error() -> None:
    with simulated_gpus(1) as sim:
        with pytest.raises(DeviceError, match="cuMemFree failed with CUDA_ERROR_INVALID_VALUE"):
            DeviceAllocation(sim.cuda, 0xDEAD0, 16, 0, owned=True).free()
        with pytest.raises(DeviceError, match="cuMemFree failed with CUDA_ERROR_INVALID_VALUE"):
            sim.cuda.free_memory(0xDEAD0, 0)


def test_a_device_without_a_context_is_refused_before_freeing() -> None:
    with simulated_gpus(1) as sim, pytest.raises(DeviceError, match="CUDA device 3 does not exist"):
        sim.cuda.free_memory(0xDEAD0, 3)


def test_an_output_tensor_takes_a_layout_as_is_and_owns_its_stream_ordered_memory() -> None:
    with simulated_gpus(1) as sim:
        s = sim.cuda.stream(0)
        free = sim.cuda.mem_info(0)[0]
        t = OutputTensor(sim.cuda.alloc_async(32, s), ScalarType.FLOAT, (2, 3), 8, (1, 0), s.handle)
        assert isinstance(t, OwnedDeviceTensor)
        assert (t.scalar_type, t.shape, t.capacity, t.dim_order) == (ScalarType.FLOAT, (2, 3), 8, (1, 0))
        assert (t.offset, t.stream, t.keepalive) == (0, s.handle, None)
        assert sim.cuda.mem_info(0)[0] == free - 32
        del t
        gc.collect()
        s.synchronize()
        assert sim.cuda.mem_info(0)[0] == free  # freed on drop, once its stream reached the free


# -- stream-ordered memory (cuMemAllocAsync / cuMemFreeAsync) on the asynchronous fake ----------------
def test_a_stream_ordered_free_releases_memory_when_its_stream_reaches_it() -> None:
    with simulated_gpus(1) as sim:
        s = sim.cuda.stream(0)
        free = sim.cuda.mem_info(0)[0]
        buf = sim.cuda.alloc_async(64, s)
        sim.cuda.memcpy_htod(buf, bytes(range(64)), stream=s)
        out = bytearray(64)
        sim.cuda.memcpy_dtoh(out, buf, stream=s)
        buf.free()
        assert sim.driver.pending(s.handle) == 4  # alloc, two copies, free: nothing ran, nothing waited
        assert sim.cuda.mem_info(0)[0] == free - 64
        s.synchronize()
        assert bytes(out) == bytes(range(64)) and sim.cuda.mem_info(0)[0] == free
        assert sim.driver.hazards == []


def test_unordered_use_before_the_allocation_or_after_the_free_is_a_hazard() -> None:
    with simulated_gpus(1) as sim:
        s, other = sim.cuda.stream(0), sim.cuda.stream(0)
        buf = sim.cuda.alloc_async(16, s)
        sim.cuda.memcpy_htod(buf, bytes(16), stream=other)  # nothing orders it after the allocation
        with pytest.raises(DeviceError, match="CUDA_ERROR_ILLEGAL_ADDRESS"):
            other.synchronize()
        assert any("before its stream reached cuMemAllocAsync" in h for h in sim.driver.hazards)
        sim.driver.hazards.clear()
        s.synchronize()
        out = bytearray(16)
        sim.cuda.memcpy_dtoh(out, buf, stream=other)  # queued, unordered with the free below
        buf.free()
        s.synchronize()  # the free runs first
        with pytest.raises(DeviceError, match="CUDA_ERROR_ILLEGAL_ADDRESS"):
            other.synchronize()
        assert any("after its stream reached cuMemFreeAsync" in h for h in sim.driver.hazards)


def test_stream_ordered_calls_fail_as_the_driver_does() -> None:
    with simulated_gpus(1) as sim:
        drv, s = sim.driver, sim.cuda.stream(0)
        err, ptr = drv.cuMemAllocAsync(32, s.raw)
        assert err == CUresult.CUDA_SUCCESS
        assert drv.cuMemAllocAsync(32, 0xBAD)[0] == CUresult.CUDA_ERROR_INVALID_HANDLE
        assert drv.cuMemAllocAsync(0, s.raw)[0] == CUresult.CUDA_ERROR_INVALID_VALUE
        assert drv.cuMemAllocAsync(1 << 50, s.raw)[0] == CUresult.CUDA_ERROR_OUT_OF_MEMORY
        assert drv.cuMemFreeAsync(ptr, 0xBAD)[0] == CUresult.CUDA_ERROR_INVALID_HANDLE
        assert drv.cuMemFreeAsync(0xDEAD0, s.raw)[0] == CUresult.CUDA_ERROR_INVALID_VALUE
        assert drv.cuMemFreeAsync(ptr, s.raw)[0] == CUresult.CUDA_SUCCESS
        assert drv.cuMemFreeAsync(ptr, s.raw)[0] == CUresult.CUDA_ERROR_INVALID_VALUE  # a double free
        assert drv.cuMemFree(ptr)[0] == CUresult.CUDA_ERROR_INVALID_VALUE
        drv.cuCtxSetCurrent(None)
        assert drv.cuMemAllocAsync(32, 0)[0] == CUresult.CUDA_ERROR_INVALID_CONTEXT  # the legacy stream needs one
        assert drv.cuMemAllocAsync(32, s.raw)[0] == CUresult.CUDA_SUCCESS  # another stream names its own


def test_a_stream_ordered_free_fails_a_capture() -> None:
    with simulated_gpus(1) as sim:
        drv, s = sim.driver, sim.cuda.stream(0)
        ptr = drv.cuMemAllocAsync(32, s.raw)[1]
        assert drv.cuStreamBeginCapture(s.raw, 0)[0] == CUresult.CUDA_SUCCESS
        assert drv.cuMemFreeAsync(ptr, s.raw)[0] == CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
        assert drv.cuStreamEndCapture(s.raw)[0] == CUresult.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
        assert drv.cuMemFreeAsync(ptr, s.raw)[0] == CUresult.CUDA_SUCCESS  # the refused free left it live


def test_a_stream_allocation_outliving_its_stream_falls_back_to_a_synchronous_free() -> None:
    with simulated_gpus(1) as sim:
        s = sim.cuda.stream(0)
        free = sim.cuda.mem_info(0)[0]
        buf = sim.cuda.alloc_async(16, s)
        s.close()
        buf.free()
        assert buf.freed and sim.cuda.mem_info(0)[0] == free


def test_a_device_without_the_stream_ordered_allocator_says_so() -> None:
    with simulated_gpus(1) as sim:
        sim.driver.memory_pools = False
        s = sim.cuda.stream(0)
        assert sim.cuda.memory_pools(0) is False
        assert sim.driver.cuMemAllocAsync(16, s.raw)[0] == CUresult.CUDA_ERROR_NOT_SUPPORTED
        with pytest.raises(DeviceError, match="cuMemAllocAsync failed with CUDA_ERROR_NOT_SUPPORTED"):
            sim.cuda.alloc_async(16, s)
    with simulated_gpus(1) as sim:
        assert sim.cuda.memory_pools(0) is True
