"""A fake ``tensorrt`` module: the surface pyrt's engine layer uses, failures included.

It deserializes only reference engines (:mod:`pyrt.sim.refengine`); real
TensorRT engine bytes, or anything else, are refused the way TensorRT refuses
a bad plan: ``deserialize_cuda_engine`` logs an error and returns None. Its
engines live on a :class:`~pyrt.sim.fake_cuda.FakeDriver` device, read
their inputs from and write their outputs to that device's memory, and
compute real results on the CPU. Failures mirror TensorRT: a budget setter
that does not take (negative, or while a context exists) logs an error and
leaves the value unchanged; ``create_execution_context`` returns None when
device memory runs out; ``set_input_shape`` returns False outside the
optimization profile; an address outside the engine's device fails the
launch. :meth:`FakeTensorRT.inject_failure` makes any of these calls fail on
purpose, for the paths real TensorRT takes rarely.

The Python-binding layer behaves as ``tensorrt_rtx`` 1.7's pybind11 bindings do
(``tests/device/test_fake_surface.py`` compares the two surfaces): a subclass of
``ILogger`` or ``IStreamReaderV2`` whose ``__init__`` skips the base's raises
TypeError; an exception raised inside a ``log``/``read``/``seek`` callback is
printed to stderr, never propagated; a stream reader is asked for exact byte
counts and an empty read aborts deserialization.

>>> from pyrt.sim.fake_cuda import FakeDriver
>>> trt = FakeTensorRT(FakeDriver(gpus=1))
>>> class Quiet(trt.ILogger):
...     def log(self, severity, msg): pass
>>> trt.Runtime(Quiet()).deserialize_cuda_engine(b"not an engine") is None
True

The package: :mod:`.failures` (call counts, injected failures), :mod:`.bindings` (enums,
logger and reader bases, Dims), :mod:`.runtime`, :mod:`.engine` (engine and execution
context) and :mod:`.module` (:class:`FakeTensorRT`). It imports numpy, pyrt.errors,
:mod:`pyrt.sim.fake_cuda` and :mod:`pyrt.sim.refengine`.
"""

from __future__ import annotations

from pyrt.sim.fake_tensorrt.bindings import (
    DataType,
    Dims,
    ExecutionContextAllocationStrategy,
    ILogger,
    IOutputAllocator,
    IStreamReaderV2,
    Logger,
    SeekPosition,
    TensorIOMode,
)
from pyrt.sim.fake_tensorrt.engine import FakeCudaEngine, FakeExecutionContext
from pyrt.sim.fake_tensorrt.module import FakeTensorRT, __version__
from pyrt.sim.fake_tensorrt.runtime import FakeRuntime

__all__ = [
    "FakeTensorRT", "FakeRuntime", "FakeCudaEngine", "FakeExecutionContext", "DataType", "TensorIOMode",
    "ExecutionContextAllocationStrategy", "ILogger",
    "Logger", "SeekPosition", "IStreamReaderV2", "IOutputAllocator", "Dims", "__version__",
]
