"""TensorRT output allocators for outputs whose shape only the run decides (``nonzero``...).

TensorRT cannot say before running how many rows ``nonzero`` gives: it reports -1 for that
dim, and at run time calls an ``IOutputAllocator`` installed on the execution context for
that output: ``reallocate_output_async(tensor_name, memory, size, alignment, stream)`` asks
for ``size`` bytes (``memory`` is the address bound by ``set_tensor_address``) and
``notify_shape(tensor_name, shape)`` reports the real shape, both before
``execute_async_v3`` returns.

pyrt's program planned such an output at its upper bound (ExecuTorch's ``DYNAMIC_BOUND``),
so :class:`PlannedOutput` hands TensorRT that planned buffer whenever the size asked fits
(no copy, no allocation); one that does not fit is an :class:`~pyrt.errors.ExecutionError`
naming the output, the size asked and the bound, raised by the engine after the launch
(an exception cannot cross TensorRT's C++ frames, so the callback returns a null address,
which makes TensorRT fail the launch, and records why).

>>> out = PlannedOutput("engine_0", "output_0")
>>> out.plan(address=4096, capacity=128)
>>> out.reallocate("output_0", 4096, 64, 16), out.failure
(4096, None)
>>> out.reallocate("output_0", 4096, 256, 16)
0
>>> "needs 256 bytes, more than the 128 bytes planned" in str(out.failure)
True
"""

from __future__ import annotations

import functools
from typing import Any

from pyrt.errors import EngineError, ExecutionError


class PlannedOutput:
    """One data-dependent output: the buffer planned for this run, and what TensorRT reported."""

    def __init__(self, engine: str, name: str) -> None:
        self.engine, self.name = engine, name
        self.address = 0
        self.capacity = 0
        self.shape: tuple[int, ...] | None = None  # set by notify_shape
        self.failure: ExecutionError | None = None
        self.asked: list[int] = []  # sizes TensorRT asked for this run (tests and diagnostics)

    def plan(self, *, address: int, capacity: int) -> None:
        """Before a launch: the planned buffer (its address and planned bytes); clears the last run's report."""
        self.address, self.capacity = int(address), int(capacity)
        self.shape, self.failure = None, None
        self.asked = []

    def reallocate(self, tensor_name: str, memory: int, size: int, alignment: int) -> int:
        """The address TensorRT writes ``size`` bytes to: the planned buffer, or 0 (a failed launch)."""
        size, alignment = int(size), max(int(alignment), 1)
        self.asked.append(size)
        if size > self.capacity:
            self.failure = ExecutionError(
                f"{self.engine}: output {tensor_name!r} needs {size} bytes, more than the {self.capacity} bytes "
                f"planned for it (its upper bound); the program's bound is too small for this input")
            return 0
        if self.address % alignment:
            self.failure = ExecutionError(
                f"{self.engine}: output {tensor_name!r}: TensorRT asks for {alignment}-byte alignment, the planned "
                f"buffer at {self.address:#x} is not aligned so")
            return 0
        return self.address

    def notify(self, tensor_name: str, shape: Any) -> None:
        try:
            dims = tuple(int(shape[i]) for i in range(len(shape)))
        except (TypeError, ValueError):
            self.failure = ExecutionError(f"{self.engine}: TensorRT reported an unreadable shape {shape!r} "
                                          f"for output {tensor_name!r}")
            return
        if any(d < 0 for d in dims):
            self.failure = ExecutionError(f"{self.engine}: TensorRT reported shape {dims} for output {tensor_name!r}")
            return
        self.shape = dims

    def result(self) -> tuple[int, ...]:
        """After a launch: the shape TensorRT reported; raises what went wrong otherwise."""
        if self.failure is not None:
            raise self.failure
        if self.shape is None:
            raise ExecutionError(f"{self.engine}: TensorRT never reported the shape of output {self.name!r} "
                                 "(notify_shape was not called before execute_async_v3 returned)")
        return self.shape


@functools.cache
def allocator_class(base: Any) -> type:
    """A subclass of the flavour's ``IOutputAllocator`` that serves a :class:`PlannedOutput`."""

    class OutputAllocator(base):  # base: the flavour's IOutputAllocator
        def __init__(self, planned: PlannedOutput) -> None:
            base.__init__(self)  # TensorRT's pybind base must be initialised explicitly
            self.planned = planned

        def reallocate_output(self, tensor_name: str, memory: int, size: int, alignment: int) -> int:
            return self.planned.reallocate(tensor_name, memory, size, alignment)

        def reallocate_output_async(self, tensor_name: str, memory: int, size: int, alignment: int,
                                    stream: int) -> int:
            return self.planned.reallocate(tensor_name, memory, size, alignment)

        def notify_shape(self, tensor_name: str, shape: Any) -> None:
            self.planned.notify(tensor_name, shape)

    return OutputAllocator


def install(module: Any, context: Any, engine: str, names: list[str]) -> dict[str, tuple[PlannedOutput, Any]]:
    """An allocator per output name on ``context``: name -> (its PlannedOutput, the allocator object).

    The caller keeps the returned objects alive as long as the context (TensorRT does not own them).
    """
    base = getattr(module, "IOutputAllocator", None)
    if base is None:
        raise EngineError(f"{engine}: this TensorRT has no IOutputAllocator, needed for the data-dependent "
                          f"shapes of outputs {names}")
    out = {}
    for name in names:
        planned = PlannedOutput(engine, name)
        allocator = allocator_class(base)(planned)
        if not context.set_output_allocator(name, allocator):
            raise EngineError(f"{engine}: TensorRT refused an output allocator for {name!r}")
        out[name] = (planned, allocator)
    return out
