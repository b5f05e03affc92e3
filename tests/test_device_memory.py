"""Owned device memory on the simulated GPU: adopting what cuMemAlloc returned, freeing it, typed errors."""

from __future__ import annotations

import gc

import pytest

from pyrt.cuda import DeviceAllocation
from pyrt.dtypes import ScalarType
from pyrt.errors import DeviceError
from pyrt.tensors import DeviceTensor, OwnedDeviceTensor
from pyrt.testing import simulated_gpus


def test_an_adopted_allocation_is_owned_and_freed_once() -> None:
    with simulated_gpus(1) as sim:
        free = sim.cuda.mem_info(0)[0]
        ptr = int(sim.cuda.call("cuMemAlloc", 256))
        a = DeviceAllocation.adopt(sim.cuda, ptr, 256, 0)
        assert (a.ptr, a.nbytes, a.device, a.freed) == (ptr, 256, 0, False)
        assert sim.cuda.mem_info(0)[0] == free - 256
        a.free()
        a.free()  # idempotent
        assert a.freed and sim.cuda.mem_info(0)[0] == free


def test_freeing_memory_the_driver_does_not_know_is_a_device_error() -> None:
    with simulated_gpus(1) as sim:
        with pytest.raises(DeviceError, match="cuMemFree failed with CUDA_ERROR_INVALID_VALUE"):
            DeviceAllocation.adopt(sim.cuda, 0xDEAD0, 16, 0).free()
        with pytest.raises(DeviceError, match="cuMemFree failed with CUDA_ERROR_INVALID_VALUE"):
            sim.cuda.free_memory(0xDEAD0, 0)


def test_a_device_without_a_context_is_refused_before_freeing() -> None:
    with simulated_gpus(1) as sim, pytest.raises(DeviceError, match="CUDA device 3 does not exist"):
        sim.cuda.free_memory(0xDEAD0, 3)


def test_like_copies_a_templates_layout_and_owns_the_new_memory() -> None:
    with simulated_gpus(1) as sim:
        template = DeviceTensor(sim.cuda.alloc(64, 0), 0, ScalarType.FLOAT, [2, 3], 8, (1, 0))
        template.stream = 7
        free = sim.cuda.mem_info(0)[0]
        t = OwnedDeviceTensor.like(DeviceAllocation.adopt(sim.cuda, int(sim.cuda.call("cuMemAlloc", 32)), 32, 0), 0,
                                   template)
        assert type(t) is OwnedDeviceTensor
        assert (t.scalar_type, t.shape, t.capacity, t.dim_order) == (ScalarType.FLOAT, (2, 3), 8, (1, 0))
        assert (t.offset, t.stream, t.keepalive) == (0, None, None)
        assert sim.cuda.mem_info(0)[0] == free - 32
        del t
        gc.collect()
        assert sim.cuda.mem_info(0)[0] == free  # freed on drop
        template.allocation.free()
