"""The fake TensorRT's optimization profiles, user-managed activation memory and device capacity
(issue 23, item 4): the contracts pyrt's memory plan and profile switch rely on."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pyrt.cuda import Cuda
from pyrt.sim import fake_tensorrt
from pyrt.sim.fake_cuda import FakeDriver
from pyrt.sim.fake_tensorrt import FakeTensorRT
from pyrt.sim.refengine import Ref, RefEngine, RefEngineFormatError, RefNode, RefProfile, RefTensor

MiB = 1 << 20


def two_profile_engine(act: tuple[int, int] = (MiB, 3 * MiB)) -> RefEngine:
    return RefEngine(
        [RefTensor("x", "float32", (-1, 4), (1, 4), (64, 4))], [RefTensor("y", "float32", (-1, 4))],
        nodes=[RefNode("aten::relu", [Ref("x")], {}, ["y"])],
        profiles=[RefProfile({"x": ((1, 4), (1, 4), (1, 4))}, act[0]),
                  RefProfile({"x": ((2, 4), (32, 4), (64, 4))}, act[1])],
    )


class _Log(fake_tensorrt.ILogger):
    def __init__(self) -> None:
        super().__init__()
        self.errors: list[str] = []

    def log(self, severity: Any, msg: str) -> None:
        if severity.name in ("ERROR", "INTERNAL_ERROR"):
            self.errors.append(msg)


def _engine(ref: RefEngine, memory: int = 64 * MiB) -> tuple[Any, Any, Cuda, _Log]:
    driver = FakeDriver(gpus=1, memory=memory)
    trt, cuda, log = FakeTensorRT(driver), Cuda(driver), _Log()
    cuda.set_device(0)
    engine = trt.Runtime(log).deserialize_cuda_engine(ref.to_bytes())
    assert engine is not None
    return trt, engine, cuda, log


def test_profiles_round_trip_and_report_their_ranges_and_memory() -> None:
    ref = two_profile_engine()
    again = RefEngine.from_bytes(ref.to_bytes())
    assert again.profiles == ref.profiles
    _, engine, _, _ = _engine(ref)
    assert engine.num_optimization_profiles == 2
    assert [tuple(d) for d in engine.get_tensor_profile_shape("x", 1)] == [(2, 4), (32, 4), (64, 4)]
    assert engine.device_memory_size_v2 == 3 * MiB
    assert [engine.get_device_memory_size_for_profile_v2(i) for i in (0, 1)] == [MiB, 3 * MiB]


def test_a_profile_outside_the_inputs_declared_range_is_refused() -> None:
    with pytest.raises(RefEngineFormatError, match="profiles\\[0\\]"):
        RefEngine([RefTensor("x", "float32", (-1,), (1,), (8,))], [RefTensor("y", "float32", (-1,))],
                  nodes=[RefNode("aten::relu", [Ref("x")], {}, ["y"])],
                  profiles=[RefProfile({"x": ((1,), (4,), (9,))})])


def test_static_contexts_take_the_largest_profiles_activation_memory() -> None:
    trt, engine, _, _ = _engine(two_profile_engine())
    before = trt.driver.memory_used(0)
    ctx = engine.create_execution_context()
    assert trt.driver.memory_used(0) - before == 3 * MiB
    user = engine.create_execution_context(trt.ExecutionContextAllocationStrategy.USER_MANAGED)
    assert trt.driver.memory_used(0) - before == 3 * MiB  # the caller provides it
    del ctx, user


def test_a_static_context_past_the_gpus_capacity_is_none() -> None:
    _, engine, _, log = _engine(two_profile_engine(act=(MiB, 40 * MiB)), memory=32 * MiB)
    assert engine.create_execution_context() is None
    assert "out of device memory" in log.errors[-1]
    assert engine.create_execution_context(fake_tensorrt.ExecutionContextAllocationStrategy.USER_MANAGED)


def _run(ctx: Any, cuda: Cuda, n: int, profile: int) -> np.ndarray:
    x = np.linspace(-1, 1, n * 4, dtype=np.float32).reshape(n, 4)
    with cuda.stream(0) as s, cuda.alloc(x.nbytes, 0) as a, cuda.alloc(x.nbytes, 0) as b:
        assert ctx.set_optimization_profile_async(profile, s.handle)
        assert ctx.active_optimization_profile == profile
        assert ctx.set_input_shape("x", x.shape)
        cuda.memcpy_htod(a, x, stream=s)
        assert ctx.set_tensor_address("x", a.ptr) and ctx.set_tensor_address("y", b.ptr)
        assert ctx.execute_async_v3(s.handle)
        out = np.empty_like(x)
        cuda.memcpy_dtoh(out, b, stream=s)
        s.synchronize()
    return out


def test_user_managed_context_needs_device_memory_and_runs_both_profiles() -> None:
    trt, engine, cuda, log = _engine(two_profile_engine())
    ctx = engine.create_execution_context(trt.ExecutionContextAllocationStrategy.USER_MANAGED)
    with cuda.stream(0) as s, cuda.alloc(16, 0) as a:
        ctx.set_input_shape("x", (1, 4))
        ctx.set_tensor_address("x", a.ptr)
        ctx.set_tensor_address("y", a.ptr)
        assert not ctx.execute_async_v3(s.handle)
        assert "set_device_memory was never called" in log.errors[-1]
    with cuda.alloc(MiB, 0) as small:
        ctx.set_device_memory(small.ptr, MiB)  # fewer bytes than the largest profile: refused
        assert "fewer than" in log.errors[-1]
    with cuda.alloc(3 * MiB, 0) as scratch:
        ctx.set_device_memory(scratch.ptr, 3 * MiB)
        assert _run(ctx, cuda, 1, 0).min() >= 0
        out = _run(ctx, cuda, 16, 1)
        assert out.shape == (16, 4) and out.min() == 0.0 and out.max() == 1.0
        assert not ctx.set_input_shape("x", (1, 4))  # profile 1 starts at 2 rows
        assert "outside optimization profile 1" in log.errors[-1]
