"""The TensorRT seam: find a TensorRT flavour, make runtimes, map dtypes.

pyrt speaks to TensorRT only through the module this returns, so tests can
swap in ``pyrt.sim.fake_tensorrt`` with :func:`use_tensorrt`. Flavours are
tried in the order of :data:`FLAVOURS`. ``tensorrt_lean`` crashes the process
when used without a CUDA device, so it is never imported without one, and no
runtime of any flavour is created without one: both raise
:class:`~pyrt.errors.DeviceError` instead.

>>> load_tensorrt("tensorrt_rtx").__name__      # doctest: +SKIP
'tensorrt_rtx'
>>> from pyrt.sim import simulated_gpus
>>> with simulated_gpus(1) as sim:
...     load_tensorrt() is sim.tensorrt
True
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import importlib.util
import logging
import threading
import weakref
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from pyrt.device import cuda_seam
from pyrt.errors import BackendError, DeviceError, EngineError

FLAVOURS = ("tensorrt", "tensorrt_rtx", "tensorrt_lean")
_NEEDS_DEVICE_TO_IMPORT = ("tensorrt_lean",)
_log = logging.getLogger("pyrt.tensorrt")

# TensorRT DataType member name <-> pyrt dtype string.
_DTYPE_NAMES = {
    "FLOAT": "float32", "HALF": "float16", "BF16": "bfloat16", "INT8": "int8",
    "INT32": "int32", "INT64": "int64", "BOOL": "bool", "UINT8": "uint8", "FP8": "float8_e4m3fn",
}
_TRT_NAMES = {v: k for k, v in _DTYPE_NAMES.items()}

_override: ModuleType | Any | None = None
_override_lock = threading.Lock()


@contextlib.contextmanager
def use_tensorrt(module: ModuleType | Any) -> Iterator[Any]:
    """Make :func:`load_tensorrt` with no argument return ``module`` inside the block."""
    global _override
    with _override_lock:
        saved, _override = _override, module
    try:
        yield module
    finally:
        with _override_lock:
            _override = saved


def flavour_of(trt: ModuleType | Any) -> str:
    """The flavour name of a TensorRT module ("tensorrt", "tensorrt_rtx", ...)."""
    return str(getattr(trt, "__name__", type(trt).__name__)).split(".")[0]


def load_tensorrt(trt: ModuleType | str | Any | None = None, *, cuda: Any = None) -> Any:
    """Return a TensorRT module: ``trt`` itself, the named flavour, or the first that imports.

    Raises BackendError listing each flavour tried and why it failed, or
    DeviceError when only ``tensorrt_lean`` remains and no CUDA device exists.
    """
    if trt is None:
        with _override_lock:
            if _override is not None:
                return _override
        names: tuple[str, ...] = FLAVOURS
    elif isinstance(trt, str):
        if trt not in FLAVOURS:
            raise BackendError(f"unknown TensorRT flavour {trt!r}; choose one of {', '.join(FLAVOURS)}")
        names = (trt,)
    else:
        if flavour_of(trt) in _NEEDS_DEVICE_TO_IMPORT:
            _require_any_device(cuda, flavour_of(trt))
        return trt
    failures: list[str] = []
    device_missing = False
    for name in names:
        if name in _NEEDS_DEVICE_TO_IMPORT and cuda_seam.resolve(cuda).device_count() == 0:
            if importlib.util.find_spec(name) is None:
                failures.append(f"{name}: not installed")
            else:
                device_missing = True
                failures.append(f"{name}: installed but not imported, it needs a CUDA device "
                                f"({cuda_seam.resolve(cuda).describe_devices()})")
            continue
        try:
            return importlib.import_module(name)
        except Exception as exc:  # ImportError, or a broken install raising anything else
            failures.append(f"{name}: {type(exc).__name__}: {exc}")
    error = DeviceError if device_missing else BackendError
    raise error("no usable TensorRT flavour; tried " + "; ".join(failures))


def _require_any_device(cuda: Any, what: str) -> None:
    seam = cuda_seam.resolve(cuda)
    if seam.device_count() == 0:
        raise DeviceError(f"{what} needs a CUDA device before any TensorRT runtime call; {seam.describe_devices()}")


class _Messages:
    """Recent TensorRT log lines, per thread; errors are kept to explain a failed call."""

    def __init__(self) -> None:
        self._local = threading.local()

    @property
    def errors(self) -> collections.deque[str]:
        errors = getattr(self._local, "errors", None)
        if errors is None:
            errors = self._local.errors = collections.deque(maxlen=16)
        return errors

    def record(self, severity: str, msg: str) -> None:
        if severity in ("INTERNAL_ERROR", "ERROR"):
            self.errors.append(msg)
            _log.error("%s", msg)
        else:  # TensorRT's warnings and information are its chatter: debug lines (pyrt.logs)
            _log.debug("%s: %s", severity, msg)

    def take(self) -> str:
        """Errors logged since the last take, joined for a message ('' if none)."""
        text = " | ".join(self.errors)
        self.errors.clear()
        return text


def make_logger(trt: Any) -> Any:
    """A ``trt.ILogger`` that forwards to Python logging and remembers errors (``.messages``)."""

    base = trt.ILogger  # the class only: a logger must not keep its module alive (shared_logger's weak keys)

    class _Logger(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            base.__init__(self)
            self.messages = _Messages()

        def log(self, severity: Any, msg: str) -> None:
            self.messages.record(getattr(severity, "name", str(severity)), msg)

    return _Logger()


def unsupported_device(trt: Any, capability: tuple[int, int]) -> str | None:
    """Why ``trt`` cannot run engines on a GPU of compute ``capability``, or None if it may.

    TensorRT-RTX runs only on the GPUs its ``ComputeCapability`` enum names (and newer
    ones); on an H100 (9.0, absent from that enum) it refuses every engine, even one it
    built there for ``CURRENT`` (docs/hardware.md). Other flavours: None.

    >>> import types, enum
    >>> rtx = types.SimpleNamespace(__name__="tensorrt_rtx", __version__="1.7",
    ...     ComputeCapability=enum.Enum("CC", "NONE CURRENT SM80 SM89 SM120"))
    >>> unsupported_device(rtx, (9, 0))
    'tensorrt_rtx 1.7 does not run engines on compute capability 9.0 (it targets 8.0, 8.9, 12.0 and newer)'
    >>> unsupported_device(rtx, (8, 9)) is None and unsupported_device(rtx, (13, 0)) is None
    True
    """
    members = getattr(getattr(trt, "ComputeCapability", None), "__members__", None)
    if flavour_of(trt) != "tensorrt_rtx" or not members:
        return None
    listed = sorted((int(m[2:-1]), int(m[-1])) for m in members if m.startswith("SM") and m[2:].isdigit())
    major, minor = capability
    if not listed or (major, minor) in listed or (major, minor) > listed[-1]:
        return None
    return (f"{flavour_of(trt)} {getattr(trt, '__version__', '?')} does not run engines on compute capability "
            f"{major}.{minor} (it targets {', '.join(f'{a}.{b}' for a, b in listed)} and newer)")


_shared_loggers: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()  # module -> its logger


def shared_logger(trt: Any) -> Any:
    """The one logger pyrt registers with ``trt``: TensorRT keeps a single logger per process
    and warns about (then ignores) every different one passed after it (seen on an H100,
    docs/hardware.md). Its errors are kept per thread."""
    with _override_lock:
        logger = _shared_loggers.get(trt)
        if logger is None:
            logger = _shared_loggers[trt] = make_logger(trt)
        return logger


def create_runtime(trt: Any, *, cuda: Any = None) -> tuple[Any, Any]:
    """(runtime, logger) for ``trt``; DeviceError first when no CUDA device exists."""
    _require_any_device(cuda, f"{flavour_of(trt)}.Runtime")
    logger = shared_logger(trt)
    logger.messages.take()  # errors left over from an earlier call on this thread are not this one's
    try:
        runtime = trt.Runtime(logger)
    except Exception as exc:
        raise EngineError(f"{flavour_of(trt)}.Runtime() failed: {exc}") from exc
    if runtime is None:
        raise EngineError(f"{flavour_of(trt)}.Runtime() returned None: {logger.messages.take()}")
    return runtime, logger


def dtype_from_trt(dtype: Any) -> str:
    """pyrt dtype string for a TensorRT DataType (``trt.DataType.FLOAT`` -> "float32")."""
    name = getattr(dtype, "name", str(dtype).rsplit(".", 1)[-1])
    try:
        return _DTYPE_NAMES[name]
    except KeyError:
        raise BackendError(f"TensorRT dtype {name} has no pyrt equivalent") from None


def dtype_to_trt(trt: Any, dtype: str) -> Any:
    """TensorRT DataType for a pyrt dtype string ("float16" -> ``trt.DataType.HALF``)."""
    try:
        return getattr(trt.DataType, _TRT_NAMES[dtype])
    except (KeyError, AttributeError):
        raise BackendError(f"dtype {dtype!r} has no TensorRT equivalent in {flavour_of(trt)}") from None
