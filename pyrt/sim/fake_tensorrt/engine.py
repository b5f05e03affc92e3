"""The fake ``trt.ICudaEngine`` and ``trt.IExecutionContext`` over a reference engine on one fake
device: tensors and profiles, weight-streaming budgets, device memory held, shapes, addresses,
and a launch queued on a fake CUDA stream that computes real results on the CPU.
"""

from __future__ import annotations

import math
import time
import weakref
from typing import Any

import numpy as np

from pyrt.errors import PyrtError
from pyrt.sim.fake_cuda import FakeDriver
from pyrt.sim.fake_tensorrt.bindings import (
    IO_DTYPES,
    DataType,
    Dims,
    ExecutionContextAllocationStrategy,
    ILogger,
    InvalidDims,
    IOutputAllocator,
    TensorIOMode,
    call_override,
    log_message,
)
from pyrt.sim.fake_tensorrt.failures import FailureInjection
from pyrt.sim.refengine import DTYPES, RefEngine, RefTensor

OUTPUT_ALIGNMENT = 256  # what the fake asks an output allocator for (cudaMalloc's guarantee)


def _run_bytes(engine: FakeCudaEngine, inputs: dict[str, tuple[np.ndarray, tuple[int, ...]]]
               ) -> dict[str, tuple[np.ndarray, tuple[int, ...]]]:
    """The reference engine's results, after ``seconds_per_row`` per row of the first input (a slow GPU) and, for an
    engine that streams weights, the streamed bytes at ``stream_bytes_per_second`` (a cost per pass)."""
    if engine._trt.seconds_per_row > 0:
        shape = inputs[engine.ref.inputs[0].name][1]
        time.sleep(engine._trt.seconds_per_row * (int(shape[0]) if shape else 1))
    rate = engine._trt.stream_bytes_per_second
    if rate > 0 and engine.ref.weight_streaming:
        time.sleep(max(engine.streamable_weights_size - engine.weight_streaming_budget_v2, 0) / rate)
    return engine.ref.run_bytes(inputs)


class FakeCudaEngine:
    """``trt.ICudaEngine`` over a reference engine on one fake device."""

    def __init__(self, trt: FailureInjection, ref: RefEngine, device: int, logger: ILogger) -> None:
        self._trt, self.ref, self.device, self.logger = trt, ref, device, logger
        self._tensors: dict[str, tuple[RefTensor, TensorIOMode]] = {
            **{t.name: (t, TensorIOMode.INPUT) for t in ref.inputs},
            **{t.name: (t, TensorIOMode.OUTPUT) for t in ref.outputs},
        }
        self._order = list(self._tensors)
        self._budget = self.streamable_weights_size
        self._contexts: weakref.WeakSet[FakeExecutionContext] = weakref.WeakSet()
        self._held: list[int] = []
        weakref.finalize(self, _free_all, trt.driver, self._held)

    # Read-only properties, as in the binding.
    @property
    def name(self) -> str:
        return "fake_engine"

    @property
    def num_optimization_profiles(self) -> int:
        return len(self.ref.optimization_profiles())

    @property
    def device_memory_size_v2(self) -> int:
        """Activation bytes a context needs: the largest of its profiles' (the reference engine declares them)."""
        return max(p.device_memory for p in self.ref.optimization_profiles())

    def get_device_memory_size_for_profile_v2(self, profile_index: int) -> int:
        profiles = self.ref.optimization_profiles()
        if not 0 <= profile_index < len(profiles):
            self._error(f"getDeviceMemorySizeForProfileV2: profile index {profile_index} is out of range "
                        f"[0, {len(profiles)})")
            return 0
        return profiles[profile_index].device_memory

    def _error(self, msg: str) -> None:
        log_message(self.logger, ILogger.Severity.ERROR, msg)

    def _hold(self, what: str, nbytes: int, into: list[int] | None = None) -> bool:
        """Take ``nbytes`` of this engine's device memory; log and return False when out."""
        if nbytes == 0:
            return True
        ptr = self._trt.driver.allocate_internal(nbytes, self.device)
        if ptr is None:
            free = self._trt.driver.free_memory(self.device)
            self._error(f"out of device memory on device {self.device}: {what} need {nbytes} bytes, {free} free")
            return False
        (self._held if into is None else into).append(ptr)
        return True

    # -- tensors ------------------------------------------------------------------
    @property
    def num_io_tensors(self) -> int:
        return len(self._order)

    def get_tensor_name(self, index: int) -> str:
        return self._order[index]

    def get_tensor_mode(self, name: str) -> TensorIOMode:
        entry = self._tensors.get(name)
        return TensorIOMode.NONE if entry is None else entry[1]

    def get_tensor_dtype(self, name: str) -> DataType:
        return DataType[IO_DTYPES[self._tensors[name][0].dtype]]

    def get_tensor_shape(self, name: str) -> Dims:
        return Dims(self._tensors[name][0].shape)

    def get_tensor_profile_shape(self, name: str, profile_index: int) -> list[Dims]:
        """[min, opt, max], always three Dims as in the binding; invalid ones (nbDims -1) on failure."""
        entry = self._tensors.get(name)
        if self._trt._fails("get_tensor_profile_shape"):
            entry = None
        profiles = self.ref.optimization_profiles()
        if entry is None or entry[1] is not TensorIOMode.INPUT or not 0 <= profile_index < len(profiles):
            self._error(f"getProfileShape: Error Code 3: API Usage Error ({name!r} is not an input of "
                        f"optimization profile {profile_index})")
            return [InvalidDims(), InvalidDims(), InvalidDims()]
        return [Dims(d) for d in profiles[profile_index].bounds(entry[0])]

    # -- weight streaming ------------------------------------------------------------
    @property
    def streamable_weights_size(self) -> int:
        return self.ref.streamable_weights_size

    @property
    def weight_streaming_scratch_memory_size(self) -> int:
        """Room to stage the largest weight while streaming (0 without streaming)."""
        if not self.ref.weight_streaming:
            return 0
        return max((w.nbytes for w in self.ref.weights.values()), default=0)

    @property
    def weight_streaming_budget_v2(self) -> int:
        return self._budget

    @weight_streaming_budget_v2.setter
    def weight_streaming_budget_v2(self, budget: int) -> None:
        # TensorRT's setter returns a bool the Python binding drops: failures only log.
        if self._trt._fails("weight_streaming_budget_v2"):
            self._error("setWeightStreamingBudgetV2: injected failure")
        elif not self.ref.weight_streaming:
            self._error("setWeightStreamingBudgetV2: the engine was not built with weight streaming")
        elif budget < 0:
            self._error(f"setWeightStreamingBudgetV2: budget {budget} must be non-negative")
        elif len(self._contexts):
            self._error("setWeightStreamingBudgetV2: the budget cannot change while execution contexts exist")
        else:
            self._budget = int(budget)

    def get_weight_streaming_automatic_budget(self) -> int:
        """The streamable bytes that fit in free device memory beside the scratch space."""
        free = self._trt.driver.free_memory(self.device)
        room = free - self.weight_streaming_scratch_memory_size - self.device_memory_size_v2
        return max(0, min(self.streamable_weights_size, room))

    def create_execution_context(self, strategy: Any = ExecutionContextAllocationStrategy.STATIC
                                 ) -> FakeExecutionContext | None:
        """A context holding the resident weights; None (logged) when device memory runs out.

        ``strategy``: STATIC takes the activation memory of the largest profile now,
        ON_PROFILE_CHANGE that of profile 0 (the fake keeps it for every profile), USER_MANAGED
        none: the caller must ``set_device_memory`` before a launch.
        """
        if self._trt._fails("create_execution_context"):
            self._error("createExecutionContext: injected failure")
            return None
        if not isinstance(strategy, ExecutionContextAllocationStrategy):
            raise TypeError(f"create_execution_context(): incompatible function arguments: {strategy!r}")
        held: list[int] = []
        need = 0
        if self.ref.weight_streaming:
            need = min(self._budget, self.streamable_weights_size) + self.weight_streaming_scratch_memory_size
        if strategy is not ExecutionContextAllocationStrategy.USER_MANAGED:
            need += self.device_memory_size_v2
        if not self._hold("execution context (resident weights, scratch, activations)", need, held):
            return None
        user = strategy is ExecutionContextAllocationStrategy.USER_MANAGED
        self.ref.prepare()  # TensorRT sets a context up when it is made, not at its first launch
        context = FakeExecutionContext(self, held, user_managed=user)
        self._contexts.add(context)
        return context


def _free_all(driver: FakeDriver, pointers: list[int]) -> None:
    for ptr in pointers:
        driver.free_internal(ptr)
    pointers.clear()


class FakeExecutionContext:
    """``trt.IExecutionContext``: shapes, addresses and a CPU launch on device memory."""

    def __init__(self, engine: FakeCudaEngine, held: list[int], *, user_managed: bool = False) -> None:
        self.engine = engine
        self._profile = 0
        self._user_managed = user_managed
        self._memory: tuple[int, int] | None = None  # (address, size) given by set_device_memory
        self._shapes: dict[str, tuple[int, ...]] = {
            t.name: tuple(t.shape) for t in engine.ref.inputs if -1 not in t.shape
        }
        self._addresses: dict[str, int] = {}
        self._allocators: dict[str, IOutputAllocator] = {}
        self._inferred: tuple[Any, dict[str, tuple[int, ...]]] | None = None
        weakref.finalize(self, _free_all, engine._trt.driver, held)

    def _error(self, msg: str) -> bool:
        self.engine._error(msg)
        return False

    def set_input_shape(self, name: str, shape: Any) -> bool:
        if self.engine._trt._fails("set_input_shape"):
            return self._error(f"setInputShape: injected failure for {name!r}")
        entry = self.engine._tensors.get(name)
        if entry is None or entry[1] is not TensorIOMode.INPUT:
            return self._error(f"setInputShape: {name!r} is not an input tensor")
        shape = tuple(int(d) for d in shape)
        lo, _, hi = self.engine.ref.optimization_profiles()[self._profile].bounds(entry[0])
        if len(shape) != len(lo) or not all(a <= d <= b for d, a, b in zip(shape, lo, hi, strict=True)):
            return self._error(f"setInputShape: {name!r} shape {shape} is outside optimization profile "
                               f"{self._profile} [{lo}, {hi}]")
        self._shapes[name] = shape
        return True

    @property
    def active_optimization_profile(self) -> int:
        return self._profile

    def set_optimization_profile_async(self, profile_index: int, stream_handle: int) -> bool:
        """Switch profile (input shapes of dynamic inputs must then be set again)."""
        engine = self.engine
        if not 0 <= int(profile_index) < engine.num_optimization_profiles:
            return self._error(f"setOptimizationProfileAsync: profile index {profile_index} is out of range "
                               f"[0, {engine.num_optimization_profiles})")
        if engine._trt.driver.stream_device(stream_handle) != engine.device:
            return self._error(f"setOptimizationProfileAsync: stream {int(stream_handle):#x} is not a live "
                               f"stream of device {engine.device}")
        self._profile = int(profile_index)
        self._shapes = {t.name: tuple(t.shape) for t in engine.ref.inputs if -1 not in t.shape}
        return True

    def set_device_memory(self, memory: int, size: int) -> None:
        """The activation memory of a USER_MANAGED context: ``size`` bytes at ``memory`` on the engine's
        device, at least ``device_memory_size_v2`` (a refusal only logs, as in the binding)."""
        engine = self.engine
        need = engine.device_memory_size_v2
        if int(size) < need:
            self._error(f"setDeviceMemoryV2: {size} bytes are fewer than the {need} the engine needs")
        elif need and engine._trt.driver.view(int(memory), int(size), engine.device) is None:
            self._error(f"setDeviceMemoryV2: {int(memory):#x} is not {size} bytes of device {engine.device}'s memory")
        elif int(memory) % 256:
            self._error(f"setDeviceMemoryV2: {int(memory):#x} is not 256-byte aligned")
        else:
            self._memory = (int(memory), int(size))

    def _activations(self) -> tuple[int, int] | None:
        """(address, bytes) of the activation memory this launch uses; None (logged) when unusable."""
        need = self.engine.ref.optimization_profiles()[self._profile].device_memory
        if not self._user_managed:
            return (0, 0)
        if self._memory is None and need:
            self._error("enqueueV3: the context was created with USER_MANAGED memory and set_device_memory "
                        "was never called")
            return None
        return (self._memory[0], need) if self._memory and need else (0, 0)

    def _output_shapes(self) -> dict[str, tuple[int, ...]]:
        key = tuple(sorted(self._shapes.items()))
        if self._inferred is None or self._inferred[0] != key:
            self._inferred = (key, self.engine.ref.infer_output_shapes(self._shapes))
        return self._inferred[1]

    def infer_shapes(self) -> list[str]:
        missing = [t.name for t in self.engine.ref.inputs if t.name not in self._shapes]
        if missing:
            return missing
        if self.engine._trt._fails("infer_shapes"):
            raise RuntimeError("infer_shapes: injected failure")
        try:
            self._output_shapes()
        except PyrtError as exc:
            raise RuntimeError(f"infer_shapes failed: {exc}") from exc
        return []

    def get_tensor_shape(self, name: str) -> Dims:
        entry = self.engine._tensors.get(name)
        if entry is None:
            self._error(f"getTensorShape: no tensor {name!r}")
            return Dims(())
        if entry[1] is TensorIOMode.INPUT:
            return Dims(self._shapes.get(name, entry[0].shape))
        if len(self._shapes) < len(self.engine.ref.inputs):
            return Dims(entry[0].shape)
        return Dims(self._output_shapes()[name])

    def set_tensor_address(self, name: str, memory: int) -> bool:
        if self.engine._trt._fails("set_tensor_address"):
            return self._error(f"setTensorAddress: injected failure for {name!r}")
        if name not in self.engine._tensors:
            return self._error(f"setTensorAddress: no tensor {name!r}")
        if int(memory) == 0:
            return self._error(f"setTensorAddress: null address for {name!r}")
        self._addresses[name] = int(memory)
        return True

    def set_output_allocator(self, name: str, output_allocator: IOutputAllocator | None) -> bool:
        entry = self.engine._tensors.get(name)
        if entry is None or entry[1] is not TensorIOMode.OUTPUT:
            return self._error(f"setOutputAllocator: {name!r} is not an output tensor")
        if output_allocator is None:
            self._allocators.pop(name, None)
        elif not isinstance(output_allocator, IOutputAllocator):
            raise TypeError(f"set_output_allocator(): incompatible function arguments: {output_allocator!r} "
                            "is not an IOutputAllocator")
        else:
            self._allocators[name] = output_allocator
        return True

    def get_output_allocator(self, name: str) -> IOutputAllocator | None:
        return self._allocators.get(name)

    def execute_async_v3(self, stream_handle: int) -> bool:
        engine, driver = self.engine, self.engine._trt.driver
        if engine._trt._fails("execute_async_v3"):
            return self._error("enqueueV3: injected failure")
        if driver.current_device() != engine.device:
            return self._error(
                f"enqueueV3: the current CUDA device is {driver.current_device()}, "
                f"but the engine lives on device {engine.device}"
            )
        if driver.stream_device(stream_handle) != engine.device:
            return self._error(f"enqueueV3: stream {int(stream_handle):#x} is not a live stream of "
                               f"device {engine.device}")
        missing = [n for n in engine._order if n not in self._addresses]
        unset = [t.name for t in engine.ref.inputs if t.name not in self._shapes]
        if missing or unset:
            return self._error(f"enqueueV3: tensors without addresses {missing}, inputs without shapes {unset}")
        try:
            out_shapes = self._output_shapes()
        except PyrtError as exc:
            return self._error(f"enqueueV3: shape inference failed: {exc}")
        if any(-1 in shape for shape in out_shapes.values()):
            return self._execute_data_dependent(int(stream_handle), out_shapes)
        for t in engine.ref.inputs:  # addresses are checked at enqueue time, the data read when it runs
            if self._view(t, self._shapes[t.name]) is None:
                return False
        for t in engine.ref.outputs:
            if self._view(t, out_shapes[t.name]) is None:
                return False
        scratch = self._activations()
        if scratch is None:
            return False
        shapes, addresses = dict(self._shapes), dict(self._addresses)

        def work() -> str | None:
            if scratch[1]:  # activations are written as the engine runs: the memory must still be there
                region = engine._trt.driver.view(scratch[0], scratch[1], engine.device)
                if region is None:
                    return f"activation memory at {scratch[0]:#x} ({scratch[1]} bytes) is no longer valid"
                region[:: max(1, scratch[1] // 64)] = len(engine._order)
            inputs = {}
            for t in engine.ref.inputs:
                view = self._view(t, shapes[t.name], addresses)
                if view is None:
                    return f"input {t.name!r} at {addresses[t.name]:#x} is no longer valid device memory"
                inputs[t.name] = (view, shapes[t.name])
            try:
                results = _run_bytes(engine, inputs)
            except PyrtError as exc:
                return f"enqueueV3: {exc}"
            for name, (raw, shape) in results.items():
                t = next(o for o in engine.ref.outputs if o.name == name)
                target = self._view(t, shape, addresses)
                if target is None:
                    return f"output {name!r} at {addresses[name]:#x} is no longer valid device memory"
                target[:] = raw
            return None

        if not driver.launch(int(stream_handle), work, f"enqueueV3 of an engine on device {engine.device}"):
            return self._error(f"enqueueV3: stream {int(stream_handle):#x} is not a live stream")
        return True

    def _execute_data_dependent(self, stream_handle: int, out_shapes: dict[str, tuple[int, ...]]) -> bool:
        """An engine with a data-dependent output learns its shape by running, as TensorRT does: the
        stream's earlier work runs first, then the engine; each such output asks its allocator for
        memory (``reallocate_output_async``) and reports its shape (``notify_shape``), all before
        enqueueV3 returns. ``ask_extra_bytes`` makes the fake ask for more than the result needs."""
        engine, trt = self.engine, self.engine._trt
        dynamic = [n for n, s in out_shapes.items() if -1 in s]
        missing = [n for n in dynamic if n not in self._allocators]
        if missing:
            return self._error(f"enqueueV3: outputs {missing} have data-dependent shapes and no output allocator")
        if any(self._view(t, self._shapes[t.name]) is None for t in engine.ref.inputs):
            return False
        trt.driver.cuStreamSynchronize(stream_handle)  # TensorRT waits for the inputs to know the shape
        inputs = {t.name: (self._view(t, self._shapes[t.name]), self._shapes[t.name]) for t in engine.ref.inputs}
        try:
            results = _run_bytes(engine, inputs)  # type: ignore[arg-type]  # views checked above
        except PyrtError as exc:
            return self._error(f"enqueueV3: {exc}")
        for t in engine.ref.outputs:
            raw, shape = results[t.name]
            if t.name in dynamic:
                size = int(raw.nbytes) + trt.ask_extra_bytes
                trt.allocations_asked.append((t.name, size))
                ptr = call_override(self._allocators[t.name], "reallocate_output_async", t.name,
                                self._addresses.get(t.name, 0), size, OUTPUT_ALIGNMENT, stream_handle)
                if not ptr:
                    return self._error(f"enqueueV3: the output allocator of {t.name!r} gave no memory "
                                       f"for {size} bytes")
                self._addresses[t.name] = int(ptr)
            target = self._view(t, shape) if raw.nbytes else None
            if raw.nbytes and target is None:
                return False
            if target is not None:
                target[:] = raw
            if t.name in dynamic:
                call_override(self._allocators[t.name], "notify_shape", t.name, Dims(shape))
        return True

    def _view(self, t: RefTensor, shape: tuple[int, ...], addresses: dict[str, int] | None = None
              ) -> np.ndarray | None:
        nbytes = math.prod(shape) * DTYPES[t.dtype]
        address = (self._addresses if addresses is None else addresses)[t.name]
        view = self.engine._trt.driver.view(address, nbytes, self.engine.device)
        if view is None:
            owner = self.engine._trt.driver.owner(address)
            where = "no allocation" if owner is None else f"memory of device {owner} (or too small)"
            self._error(
                f"enqueueV3: illegal address {address:#x} for {t.name!r} ({nbytes} bytes): "
                f"{where}; the engine lives on device {self.engine.device}"
            )
        return view
