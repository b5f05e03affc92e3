"""The Python-binding layer of the fake TensorRT, as ``tensorrt_rtx``'s pybind11 bindings behave:
enums that never equal plain ints, logger and stream-reader bases whose ``__init__`` must run,
callbacks whose exceptions are printed and swallowed, and ``Dims``.
"""

from __future__ import annotations

import enum
import sys
from typing import Any

from pyrt.sim.fake_tensorrt.failures import FailureInjection

# Reference dtype -> TensorRT DataType member; float64/int16 have no TensorRT I/O type.
# (Kept apart from pyrt.device.tensorrt_seam's table on purpose: the fake must not share pyrt's mistakes.)
IO_DTYPES = {
    "float32": "FLOAT", "float16": "HALF", "bfloat16": "BF16", "int8": "INT8",
    "int32": "INT32", "int64": "INT64", "bool": "BOOL", "uint8": "UINT8",
}


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


class ExecutionContextAllocationStrategy(_Enum):
    """Who provides an execution context's activation memory: TensorRT at creation (STATIC), TensorRT
    per profile (ON_PROFILE_CHANGE), or the caller through ``set_device_memory`` (USER_MANAGED)."""

    STATIC = 0
    ON_PROFILE_CHANGE = 1
    USER_MANAGED = 2


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
    TypeError: pyrt.sim.fake_tensorrt.ILogger.__init__() must be called when overriding __init__
    """

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        obj = super().__call__(*args, **kwargs)
        if not obj.__dict__.get("_bound_init"):
            base = next(b for b in cls.__mro__ if b.__dict__.get("_bound_root"))
            raise TypeError(f"{base.__module__}.{base.__qualname__}.__init__() must be called when overriding __init__")
        return obj


def call_override(obj: Any, name: str, *args: Any) -> Any:
    """Call a Python override as the bindings' trampolines do: an exception is printed to
    stderr (``[ERROR] Exception caught in read(): ...``) and the call yields None."""
    try:
        return getattr(obj, name)(*args)
    except Exception as exc:
        print(f"[ERROR] Exception caught in {name}(): {type(exc).__name__}: {exc}", file=sys.stderr)
        return None


def log_message(logger: ILogger, severity: _Severity, msg: str) -> None:
    call_override(logger, "log", severity, msg)


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
    _fake: FailureInjection | None = None  # the fake module this reader class belongs to

    def __init__(self) -> None:
        fake = type(self)._fake
        if fake is not None and fake._fails("IStreamReaderV2"):
            raise RuntimeError("[ERROR] Failed to open cuda driver.")
        self._bound_init = True

    def read(self, num_bytes: int, stream: int) -> Any:
        raise NotImplementedError("[ERROR] Failed to find override read function in python.")

    def seek(self, offset: int, where: SeekPosition) -> bool:
        raise NotImplementedError("[ERROR] Failed to find override seek function in python.")


class IOutputAllocator(metaclass=_Bound):
    """Base class of output allocators, as in TensorRT: call ``__init__``, override
    ``reallocate_output_async(tensor_name, memory, size, alignment, stream)`` (returns the address
    TensorRT writes to, 0 to fail the launch) and ``notify_shape(tensor_name, shape)``."""

    _bound_root = True

    def __init__(self) -> None:
        self._bound_init = True

    def reallocate_output(self, tensor_name: str, memory: int, size: int, alignment: int) -> int:
        raise NotImplementedError('Tried to call pure virtual function "IOutputAllocator::reallocateOutput"')

    def reallocate_output_async(self, tensor_name: str, memory: int, size: int, alignment: int, stream: int) -> int:
        return self.reallocate_output(tensor_name, memory, size, alignment)  # TensorRT's default does this

    def notify_shape(self, tensor_name: str, shape: Dims) -> None:
        raise NotImplementedError('Tried to call pure virtual function "IOutputAllocator::notifyShape"')


class Dims(tuple):
    """A shape, as TensorRT returns it (-1 for a dimension not yet known)."""


class InvalidDims(Dims):
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


# The binding classes' home is the package, as TensorRT's are its module's: messages and reprs name
# pyrt.sim.fake_tensorrt.ILogger (cf. tensorrt_rtx.ILogger), not this submodule.
for _cls in (DataType, TensorIOMode, ExecutionContextAllocationStrategy, ILogger, Logger, SeekPosition,
             IStreamReaderV2, IOutputAllocator, Dims):
    _cls.__module__ = "pyrt.sim.fake_tensorrt"
