"""A fake ``tensorrt`` module: the surface pyrt's engine layer uses, failures included.

It deserializes only reference engines (:mod:`pyrt.testing.refengine`); real
TensorRT engine bytes, or anything else, are refused the way TensorRT refuses
a bad plan: ``deserialize_cuda_engine`` logs an error and returns None. Its
engines live on a :class:`~pyrt.testing.fake_cuda.FakeDriver` device, read
their inputs from and write their outputs to that device's memory, and
compute real results on the CPU. Failures mirror TensorRT: a budget setter
that does not take (negative, or while a context exists) logs an error and
leaves the value unchanged; ``create_execution_context`` returns None when
device memory runs out; ``set_input_shape`` returns False outside the
optimization profile; an address outside the engine's device fails the
launch. :meth:`FakeTensorRT.inject_failure` makes any of these calls fail on
purpose, for the paths real TensorRT takes rarely.

The Python-binding layer behaves as ``tensorrt_rtx`` 1.7's pybind11 bindings do
(``tests/test_fake_surface.py`` compares the two surfaces): a subclass of
``ILogger`` or ``IStreamReaderV2`` whose ``__init__`` skips the base's raises
TypeError; an exception raised inside a ``log``/``read``/``seek`` callback is
printed to stderr, never propagated; a stream reader is asked for exact byte
counts and an empty read aborts deserialization.

>>> from pyrt.testing.fake_cuda import FakeDriver
>>> trt = FakeTensorRT(FakeDriver(gpus=1))
>>> class Quiet(trt.ILogger):
...     def log(self, severity, msg): pass
>>> trt.Runtime(Quiet()).deserialize_cuda_engine(b"not an engine") is None
True
"""

from __future__ import annotations

import enum
import json
import math
import mmap
import os
import sys
import tempfile
import weakref
from collections import Counter
from typing import Any, TypeAlias

import numpy as np

from pyrt.errors import PyrtError
from pyrt.testing.fake_cuda import FakeDriver
from pyrt.testing.refengine import ALIGN, DTYPES, HEADER, MAGIC, RefEngine, RefTensor

__version__ = "0.0-fake"

# Reference dtype -> TensorRT DataType member; float64/int16 have no TensorRT I/O type.
# (Kept apart from pyrt.device.tensorrt_seam's table on purpose: the fake must not share pyrt's mistakes.)
_IO_DTYPES = {
    "float32": "FLOAT", "float16": "HALF", "bfloat16": "BF16", "int8": "INT8",
    "int32": "INT32", "int64": "INT64", "bool": "BOOL", "uint8": "UINT8",
}
_PLAN_MAGICS = (b"ptrt", b"ftrt", b"vtrt", b"ntrt")  # first bytes of serialized TensorRT plans


class _Enum(enum.Enum):
    """A pybind11 enum: ``.name``, ``.value`` and ``int(member)``; members never equal plain ints."""

    def __int__(self) -> int:
        return int(self.value)


class DataType(_Enum):
    FLOAT = 0
    HALF = 1
    INT8 = 2
    INT32 = 3
    BOOL = 4
    UINT8 = 5
    FP8 = 6
    BF16 = 7
    INT64 = 8


class TensorIOMode(_Enum):
    NONE = 0
    INPUT = 1
    OUTPUT = 2


class _Severity(_Enum):
    INTERNAL_ERROR = 0
    ERROR = 1
    WARNING = 2
    INFO = 3
    VERBOSE = 4


class _Bound(type):
    """pybind11's rule for Python subclasses of a bound class: the base ``__init__`` must run.

    >>> class Lazy(ILogger):
    ...     def __init__(self): pass
    >>> Lazy()
    Traceback (most recent call last):
    ...
    TypeError: pyrt.testing.fake_tensorrt.ILogger.__init__() must be called when overriding __init__
    """

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        obj = super().__call__(*args, **kwargs)
        if not obj.__dict__.get("_bound_init"):
            base = next(b for b in cls.__mro__ if b.__dict__.get("_bound_root"))
            raise TypeError(f"{base.__module__}.{base.__qualname__}.__init__() must be called when overriding __init__")
        return obj


def _callback(obj: Any, name: str, *args: Any) -> Any:
    """Call a Python override as the bindings' trampolines do: an exception is printed to
    stderr (``[ERROR] Exception caught in read(): ...``) and the call yields None."""
    try:
        return getattr(obj, name)(*args)
    except Exception as exc:
        print(f"[ERROR] Exception caught in {name}(): {type(exc).__name__}: {exc}", file=sys.stderr)
        return None


def _log(logger: ILogger, severity: _Severity, msg: str) -> None:
    _callback(logger, "log", severity, msg)


class ILogger(metaclass=_Bound):
    """Base class of loggers, as in TensorRT: subclass, call ``ILogger.__init__``, override ``log``."""

    Severity = _Severity
    _bound_root = True

    def __init__(self) -> None:
        self._bound_init = True

    def log(self, severity: _Severity, msg: str) -> None:
        raise NotImplementedError('Tried to call pure virtual function "ILogger::log"')


class Logger(ILogger):
    """TensorRT's default logger: prints messages at or above ``min_severity``."""

    def __init__(self, min_severity: _Severity = _Severity.WARNING) -> None:
        super().__init__()
        self.min_severity = min_severity

    def log(self, severity: _Severity, msg: str) -> None:
        if severity.value <= self.min_severity.value:
            print(f"[fake TRT] [{severity.name[0]}] {msg}", file=sys.stderr)


class SeekPosition(_Enum):
    SET = 0
    CUR = 1
    END = 2


class IStreamReaderV2(metaclass=_Bound):
    """Base class of stream readers, as in TensorRT: call ``__init__``, override ``read`` and ``seek``.

    ``read(num_bytes, stream)`` returns any contiguous buffer (bytes, memoryview, numpy) of at most
    ``num_bytes``; TensorRT asks again for whatever is still missing, and an empty buffer aborts.
    The real base dlopens libcuda in its constructor and raises RuntimeError where that fails;
    ``FakeTensorRT.inject_failure("IStreamReaderV2")`` reproduces that for the reader class of
    that fake module.
    """

    _bound_root = True
    _fake: FakeTensorRT | None = None  # the fake module this reader class belongs to

    def __init__(self) -> None:
        fake = type(self)._fake
        if fake is not None and fake._fails("IStreamReaderV2"):
            raise RuntimeError("[ERROR] Failed to open cuda driver.")
        self._bound_init = True

    def read(self, num_bytes: int, stream: int) -> Any:
        raise NotImplementedError("[ERROR] Failed to find override read function in python.")

    def seek(self, offset: int, where: SeekPosition) -> bool:
        raise NotImplementedError("[ERROR] Failed to find override seek function in python.")


class Dims(tuple):
    """A shape, as TensorRT returns it (-1 for a dimension not yet known)."""


class _InvalidDims(Dims):
    """What a failed shape query returns (TensorRT's ``nbDims == -1``).

    The real binding's ``__len__`` returns -1, so ``len()`` raises ValueError; iterating it
    reads past the dims (undefined behaviour), which the fake refuses loudly.
    """

    def __len__(self) -> int:
        return -1

    def __iter__(self) -> Any:
        raise RuntimeError("fake tensorrt: iterating a Dims with nbDims == -1 (undefined behaviour in TensorRT)")

    def __getitem__(self, index: Any) -> Any:
        raise IndexError("Dims with nbDims == -1")

    def __repr__(self) -> str:
        return "Dims(nbDims=-1)"


class FakeTensorRT:
    """A fake TensorRT module bound to one fake CUDA driver.

    Use it wherever pyrt takes a ``trt`` module, or through
    :func:`pyrt.testing.simulated_gpus`, which installs it as the default.
    """

    __name__ = "fake_tensorrt"
    __version__ = __version__
    DataType = DataType
    TensorIOMode = TensorIOMode
    ILogger: TypeAlias = ILogger  # an alias, so Runtime's annotation can name it in the class body
    Logger = Logger
    Dims = Dims
    SeekPosition = SeekPosition

    def __init__(self, driver: FakeDriver) -> None:
        self.driver = driver
        self.calls: Counter[str] = Counter()
        self._failures: Counter[str] = Counter()
        # This module's own reader base, so inject_failure("IStreamReaderV2") reaches its constructor.
        self.IStreamReaderV2: type[IStreamReaderV2] = type(
            "IStreamReaderV2", (IStreamReaderV2,), {"_fake": self, "__doc__": IStreamReaderV2.__doc__})

    def Runtime(self, logger: ILogger) -> FakeRuntime:  # noqa: N802 - TensorRT's name
        """``trt.Runtime(logger)``; without a CUDA device this "crashes" (raises loudly)."""
        if not isinstance(logger, ILogger):
            raise TypeError("__init__(): incompatible constructor arguments. The following argument types are "
                            f"supported:\n    1. Runtime(logger: ILogger)\n\nInvoked with: {logger!r}")
        if self.driver.gpus == 0:
            raise RuntimeError(
                "fake tensorrt: Runtime created with no CUDA device (tensorrt_lean would segfault here)"
            )
        return FakeRuntime(self, logger)

    def inject_failure(self, call: str, times: int = 1) -> None:
        """Make the next ``times`` calls of ``call`` fail as TensorRT fails.

        ``call`` is one of deserialize_cuda_engine, create_execution_context,
        weight_streaming_budget_v2 (the setter), set_input_shape, infer_shapes,
        set_tensor_address, execute_async_v3, get_tensor_profile_shape, or
        IStreamReaderV2 (its constructor fails as where libcuda cannot be opened).
        """
        self._failures[call] += times

    def _fails(self, call: str) -> bool:
        self.calls[call] += 1
        if self._failures[call] > 0:
            self._failures[call] -= 1
            return True
        return False


class FakeRuntime:
    """``trt.Runtime``: deserializes reference engines onto the current device."""

    def __init__(self, trt: FakeTensorRT, logger: ILogger) -> None:
        self._trt = trt
        self.logger = logger
        self.stream_requests: list[int] = []  # byte counts the runtime asked a stream reader for
        self.stream_reads: list[tuple[int, int]] = []  # (num_bytes asked, bytes taken) per read() call

    def _read_stream(self, reader: IStreamReaderV2) -> mmap.mmap | bytes | None:
        """Pull a reference engine through ``reader`` the way TensorRT-RTX 1.7 pulls a plan.

        Seen on an H100 (docs/hardware.md): rewind with seek(0, SET), then exact-size requests
        for the parts of the plan (its 64-byte header, then 48 bytes of metadata, ...). Here the
        parts are the reference engine's header, its JSON (padded), then its weights region.
        TensorRT's copy goes to a spool file (its "device"), mapped read-only: the fake holds no
        host copy of a streamed engine, as TensorRT holds none of streamed weights.
        """
        if not _callback(reader, "seek", 0, SeekPosition.SET):
            self._error("IRuntime::deserializeCudaEngineV2: IStreamReaderV2 seek(0, SET) failed")
            return None
        with tempfile.TemporaryFile(prefix="pyrt-fake-engine-") as spool:
            head = self._request(reader, HEADER.size, "header", spool)
            if head is None:
                return None
            spool.seek(0)
            data = spool.read(HEADER.size)
            if data[:8] != MAGIC:
                return data  # refused by the caller, with what the bytes look like
            json_len = HEADER.unpack_from(data)[3]
            meta_len = _align(HEADER.size + json_len) - HEADER.size
            if self._request(reader, meta_len, "metadata", spool) is None:
                return None
            spool.seek(HEADER.size)
            meta = spool.read(json_len)
            try:
                weights = json.loads(meta)["weights"]
                size = max((_align(int(w["offset"]) + int(w["nbytes"])) for w in weights), default=0)
            except (ValueError, TypeError, KeyError) as exc:
                self._error(f"IRuntime::deserializeCudaEngineV2: bad reference-engine metadata: {exc!r}")
                return None
            spool.seek(HEADER.size + meta_len)
            if size and self._request(reader, size, "weights", spool) is None:
                return None
            spool.truncate(HEADER.size + meta_len + size)  # a trailing hole still counts
            return mmap.mmap(spool.fileno(), 0, access=mmap.ACCESS_READ)

    def _request(self, reader: IStreamReaderV2, nbytes: int, what: str, spool: Any) -> int | None:
        """One request of ``nbytes``, through the binding's trampoline (PyStreamReaderV2::read), into ``spool``.

        The trampoline calls ``read(remaining, stream)`` until ``nbytes`` arrive, takes at most
        ``remaining`` bytes of any buffer, stops at an empty one ("User aborted the operation"),
        and turns an exception or a non-buffer into 0 bytes for the whole request (printed to
        stderr). The runtime then logs how much it got. Runs of zeros become holes in the spool.
        """
        self.stream_requests.append(nbytes)
        got_total = 0
        while got_total < nbytes:
            want = nbytes - got_total
            got = _callback(reader, "read", want, 0)
            try:
                view = memoryview(got).cast("B")  # any C-contiguous buffer (the fake refuses strided ones)
            except TypeError as exc:
                print(f"[ERROR] Exception caught in read(): Object of type '{type(got).__name__}' is not an "
                      f"instance of 'buffer' ({exc})", file=sys.stderr)
                got_total = 0
                break
            take = min(view.nbytes, want)
            self.stream_reads.append((want, take))
            if take == 0:
                print("[ERROR] User aborted the operation, the read function in streamReaderV2 returned 0 bytes.",
                      file=sys.stderr)
                break
            piece = view[:take]
            if not np.frombuffer(piece, dtype=np.uint8).any():
                spool.seek(take, os.SEEK_CUR)  # zeros: a hole, as the device memory is zeroed
            else:
                spool.write(piece)
            got_total += take
        end = spool.tell()
        if os.fstat(spool.fileno()).st_size < end:
            spool.truncate(end)  # a trailing hole is still part of the file
        if got_total != nbytes:
            self._error(f"IRuntime::deserializeCudaEngineV2: Error Code 4: API Usage Error (Failed to read {what} "
                        f"from the stream: read {got_total} out of {nbytes} bytes)")
            return None
        return got_total

    def _error(self, msg: str) -> None:
        _log(self.logger, _Severity.ERROR, msg)

    def deserialize_cuda_engine(self, serialized_engine: Any) -> FakeCudaEngine | None:
        """Engine from a buffer or an ``IStreamReaderV2`` holding a reference engine, or None (logged).

        Anything else raises TypeError, as the binding's overload resolution does.
        """
        streamed = isinstance(serialized_engine, IStreamReaderV2)
        if streamed:
            serialized_engine = self._read_stream(serialized_engine)
            if serialized_engine is None:
                return None
        try:
            view = memoryview(serialized_engine).cast("B")
        except TypeError:
            raise TypeError(f"deserialize_cuda_engine(): incompatible function arguments: "
                            f"{type(serialized_engine).__name__} is neither a buffer nor an IStreamReaderV2") from None
        if self._trt._fails("deserialize_cuda_engine"):
            self._error("IRuntime::deserializeCudaEngine: injected failure")
            return None
        head = bytes(view[:8])
        if head != MAGIC:
            kind = "a serialized TensorRT engine" if head[:4] in _PLAN_MAGICS else "not an engine"
            self._error(
                f"IRuntime::deserializeCudaEngine: the fake TensorRT runtime deserializes only pyrt "
                f"reference engines ({MAGIC.decode()}); these {view.nbytes} bytes start with {head!r} "
                f"({kind}); real engines need a real GPU and TensorRT"
            )
            return None
        device = self._trt.driver.current_device()
        if device is None:
            self._error("IRuntime::deserializeCudaEngine: no current CUDA context")
            return None
        try:
            # TensorRT keeps its own copy: a streamed engine's is the spool already, a buffer's is copied
            ref = RefEngine.from_bytes(view if streamed else bytes(view), source="serialized engine")
        except PyrtError as exc:
            self._error(f"IRuntime::deserializeCudaEngine: {exc}")
            return None
        for t in [*ref.inputs, *ref.outputs]:
            if t.dtype not in _IO_DTYPES:
                self._error(f"IRuntime::deserializeCudaEngine: I/O tensor {t.name!r} has dtype "
                            f"{t.dtype}, which TensorRT cannot bind")
                return None
        engine = FakeCudaEngine(self._trt, ref, device, self.logger)
        if not ref.weight_streaming and not engine._hold("weights", sum(w.nbytes for w in ref.weights.values())):
            return None
        return engine


class FakeCudaEngine:
    """``trt.ICudaEngine`` over a reference engine on one fake device."""

    def __init__(self, trt: FakeTensorRT, ref: RefEngine, device: int, logger: ILogger) -> None:
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
        return 1

    @property
    def device_memory_size_v2(self) -> int:
        return 0  # activations live in host memory in the fake

    def _error(self, msg: str) -> None:
        _log(self.logger, _Severity.ERROR, msg)

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
        return DataType[_IO_DTYPES[self._tensors[name][0].dtype]]

    def get_tensor_shape(self, name: str) -> Dims:
        return Dims(self._tensors[name][0].shape)

    def get_tensor_profile_shape(self, name: str, profile_index: int) -> list[Dims]:
        """[min, opt, max], always three Dims as in the binding; invalid ones (nbDims -1) on failure."""
        entry = self._tensors.get(name)
        if self._trt._fails("get_tensor_profile_shape"):
            entry = None
        if entry is None or entry[1] is not TensorIOMode.INPUT or profile_index != 0:
            self._error(f"getProfileShape: Error Code 3: API Usage Error ({name!r} is not an input of "
                        f"optimization profile {profile_index})")
            return [_InvalidDims(), _InvalidDims(), _InvalidDims()]
        lo, hi = entry[0].profile()
        return [Dims(lo), Dims(hi), Dims(hi)]

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

    def create_execution_context(self, strategy: Any = None) -> FakeExecutionContext | None:
        """A context holding the resident weights; None (logged) when device memory runs out.

        ``strategy`` (an ExecutionContextAllocationStrategy in TensorRT) is accepted and ignored.
        """
        if self._trt._fails("create_execution_context"):
            self._error("createExecutionContext: injected failure")
            return None
        held: list[int] = []
        if self.ref.weight_streaming:
            resident = min(self._budget, self.streamable_weights_size)
            need = resident + self.weight_streaming_scratch_memory_size + self.device_memory_size_v2
            if not self._hold("execution context (resident weights + scratch)", need, held):
                return None
        context = FakeExecutionContext(self, held)
        self._contexts.add(context)
        return context


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _free_all(driver: FakeDriver, pointers: list[int]) -> None:
    for ptr in pointers:
        driver.free_internal(ptr)
    pointers.clear()


class FakeExecutionContext:
    """``trt.IExecutionContext``: shapes, addresses and a CPU launch on device memory."""

    def __init__(self, engine: FakeCudaEngine, held: list[int]) -> None:
        self.engine = engine
        self._shapes: dict[str, tuple[int, ...]] = {
            t.name: tuple(t.shape) for t in engine.ref.inputs if -1 not in t.shape
        }
        self._addresses: dict[str, int] = {}
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
        lo, hi = entry[0].profile()
        if len(shape) != len(lo) or not all(a <= d <= b for d, a, b in zip(shape, lo, hi, strict=True)):
            return self._error(
                f"setInputShape: {name!r} shape {shape} is outside the optimization profile [{lo}, {hi}]"
            )
        self._shapes[name] = shape
        return True

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
        for t in engine.ref.inputs:  # addresses are checked at enqueue time, the data read when it runs
            if self._view(t, self._shapes[t.name]) is None:
                return False
        for t in engine.ref.outputs:
            if self._view(t, out_shapes[t.name]) is None:
                return False
        shapes, addresses = dict(self._shapes), dict(self._addresses)

        def work() -> str | None:
            inputs = {}
            for t in engine.ref.inputs:
                view = self._view(t, shapes[t.name], addresses)
                if view is None:
                    return f"input {t.name!r} at {addresses[t.name]:#x} is no longer valid device memory"
                inputs[t.name] = (view, shapes[t.name])
            try:
                results = engine.ref.run_bytes(inputs)
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
