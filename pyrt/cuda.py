"""The CUDA seam: devices, contexts, streams, events and device memory.

Everything goes through one *driver* module with the surface of
``cuda.bindings.driver`` (cuda-python), imported lazily. Tests swap in a fake
driver (``pyrt.testing.fake_cuda``) with :func:`use_driver`, so the code above
this seam runs unchanged on machines without a GPU. Every driver return code is
checked; a failure raises :class:`~pyrt.errors.DeviceError` naming the call and
the CUDA error name. Without a driver or GPU, :func:`device_count` is 0 and
anything that needs a device raises ``DeviceError`` listing what is present.

>>> from pyrt.testing import simulated_gpus
>>> with simulated_gpus(2, memory=1 << 20):
...     with alloc(16, device=1) as buf:
...         memcpy_htod(buf, bytes(range(16)))
...         out = bytearray(16)
...         memcpy_dtoh(out, buf)
...     bytes(out) == bytes(range(16))
True
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeVar

from pyrt.errors import DeviceError, InputError

_NAME_LEN = 256  # bytes asked of cuDeviceGetName


@dataclass(frozen=True)
class DeviceInfo:
    """One CUDA device as the driver reports it."""

    index: int
    name: str
    compute_capability: tuple[int, int]
    total_memory: int

    def __str__(self) -> str:
        major, minor = self.compute_capability
        return f"{self.index}: {self.name} (sm_{major}{minor}, {self.total_memory >> 20} MiB)"


class Cuda:
    """CUDA over one driver module; ``Cuda()`` imports ``cuda.bindings.driver`` on first use.

    >>> from pyrt.testing.fake_cuda import FakeDriver
    >>> Cuda(FakeDriver(gpus=1)).device_count()
    1
    """

    def __init__(self, driver: ModuleType | Any | None = None) -> None:
        self._driver = driver
        self._lock = threading.Lock()
        self._initialized = False
        self._count = 0
        self._why_none = ""
        self._devices: list[DeviceInfo] | None = None
        self._handles: dict[int, Any] = {}
        self._contexts: dict[int, Any] = {}
        self._pools: dict[int, bool] = {}

    # -- driver plumbing -------------------------------------------------
    @property
    def driver(self) -> Any:
        """The driver module (imported on first use)."""
        if self._driver is None:
            try:
                from cuda.bindings import driver
            except ImportError as exc:
                raise DeviceError(f"cuda-python is not installed ({exc}); no CUDA devices") from exc
            self._driver = driver
        return self._driver

    def call(self, name: str, *args: Any) -> Any:
        """Call driver function ``name``; raise DeviceError unless it returns CUDA_SUCCESS.

        Returns the call's outputs: None, one value, or a tuple of values.
        """
        driver = self._driver if self._driver is not None else self.driver
        try:
            result = getattr(driver, name)(*args)
        except DeviceError:
            raise
        except Exception as exc:  # the binding raises for a missing driver library, bad types
            raise DeviceError(f"{name} failed: {type(exc).__name__}: {exc}") from exc
        if result[0]:  # CUresult is an int enum: CUDA_SUCCESS is 0
            raise DeviceError(f"{name} failed with {self.error_name(result[0])}")
        n = len(result)
        if n == 1:
            return None
        return result[1] if n == 2 else tuple(result[1:])

    def error_name(self, code: Any) -> str:
        """The CUDA error name for a CUresult (works without a loaded driver library)."""
        try:
            return str(self.driver.CUresult(int(code)).name)
        except Exception:  # an unknown code still gets a readable name
            return f"CUresult {int(code)}"

    def _init(self) -> None:
        with self._lock:
            if self._initialized:
                return
            self._initialized = True
            try:
                self.call("cuInit", 0)
                self._count = int(self.call("cuDeviceGetCount"))
            except DeviceError as exc:
                self._count, self._why_none = 0, str(exc)
            if self._count == 0 and not self._why_none:
                self._why_none = "the driver reports no devices"

    # -- devices ---------------------------------------------------------
    def device_count(self) -> int:
        """Number of CUDA devices; 0 (never an exception) without a driver or GPU."""
        self._init()
        return self._count

    def devices(self) -> list[DeviceInfo]:
        """Every device's name, compute capability and memory."""
        if self._devices is None:
            self._devices = [self._query(i) for i in range(self.device_count())]
        return list(self._devices)

    def _query(self, index: int) -> DeviceInfo:
        dev = self._handle(index)
        raw = self.call("cuDeviceGetName", _NAME_LEN, dev)
        name = bytes(raw).split(b"\0", 1)[0].decode("utf-8", "replace")
        attr = self.driver.CUdevice_attribute
        major = self.call("cuDeviceGetAttribute", attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
        minor = self.call("cuDeviceGetAttribute", attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
        total = self.call("cuDeviceTotalMem", dev)
        return DeviceInfo(index, name, (int(major), int(minor)), int(total))

    def describe_devices(self) -> str:
        """A one-line list of present devices (or why there are none) for error messages."""
        if self.device_count() == 0:
            return f"no CUDA devices are present ({self._why_none})"
        return "present devices: " + "; ".join(str(d) for d in self.devices())

    def require_device(self, index: int, *, purpose: str = "") -> DeviceInfo:
        """Return device ``index``'s info, or raise DeviceError listing the devices present."""
        if isinstance(index, bool) or not isinstance(index, int):
            raise DeviceError(f"CUDA device index must be an int, got {index!r}")
        count = self.device_count()
        if not 0 <= index < count:
            what = f" (needed for {purpose})" if purpose else ""
            raise DeviceError(f"CUDA device {index} does not exist{what}; {self.describe_devices()}")
        return self.devices()[index]

    def _handle(self, index: int) -> Any:
        if index not in self._handles:
            self._handles[index] = self.call("cuDeviceGet", index)
        return self._handles[index]

    def context(self, index: int) -> Any:
        """The retained primary context of device ``index`` (retained once, kept for life)."""
        ctx = self._contexts.get(index)  # a dict read is atomic: the lock guards creation only
        if ctx is None:
            self.require_device(index)
            ctx = self.call("cuDevicePrimaryCtxRetain", self._handle(index))
            with self._lock:
                self._contexts.setdefault(index, ctx)
                ctx = self._contexts[index]
        return ctx

    def memory_pools(self, index: int) -> bool:
        """Whether device ``index`` has the stream-ordered allocator (``cuMemAllocAsync``; asked once)."""
        found = self._pools.get(index)
        if found is None:
            self.require_device(index)
            attr = self.driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED
            found = self._pools[index] = bool(self.call("cuDeviceGetAttribute", attr, self._handle(index)))
        return found

    def set_device(self, index: int) -> None:
        """Make device ``index``'s primary context current on this thread."""
        self.call("cuCtxSetCurrent", self.context(index))

    def synchronize(self, index: int) -> None:
        """Wait for all work on device ``index``."""
        self.set_device(index)
        self.call("cuCtxSynchronize")

    def mem_info(self, index: int) -> tuple[int, int]:
        """(free, total) bytes of device ``index``."""
        self.set_device(index)
        free, total = self.call("cuMemGetInfo")
        return int(free), int(total)

    # -- memory ----------------------------------------------------------
    def free_memory(self, ptr: int, device: int) -> None:
        """``cuMemFree(ptr)`` with device ``device``'s context current (it synchronises the device)."""
        self.set_device(device)
        self.call("cuMemFree", ptr)

    def free_async(self, ptr: int, device: int, stream: int) -> None:
        """``cuMemFreeAsync(ptr, stream)``: a stream-ordered free of the memory at ``ptr``, no host synchronisation.

        The memory is released when stream handle ``stream`` reaches the free, so work queued on
        it before still reads valid memory; work on other streams must be ordered before it by
        the caller. A stream other than the legacy default ones (handles 0-2) names its own
        context; for those, device ``device``'s context is made current first. The same calls and
        errors as ``set_device`` and ``call``, inlined: this runs once per dropped output of every forward.
        """
        driver = self._driver if self._driver is not None else self.driver
        try:
            if stream < _LEGACY_STREAMS and (result := driver.cuCtxSetCurrent(self.context(device)))[0]:
                raise DeviceError(f"cuCtxSetCurrent failed with {self.error_name(result[0])}")
            result = driver.cuMemFreeAsync(ptr, stream)
        except DeviceError:
            raise
        except Exception as exc:  # the binding raises for a missing driver library, bad types
            raise DeviceError(f"cuMemFreeAsync failed: {type(exc).__name__}: {exc}") from exc
        if result[0]:
            raise DeviceError(f"cuMemFreeAsync failed with {self.error_name(result[0])}")

    def alloc(self, nbytes: int, device: int) -> DeviceAllocation:
        """Allocate ``nbytes`` of device memory on ``device`` (free it, or use ``with``)."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise InputError(f"allocation size must be a non-negative int, got {nbytes!r}")
        self.set_device(device)
        if nbytes == 0:
            return DeviceAllocation(self, 0, 0, device, owned=False)
        ptr = self.call("cuMemAlloc", nbytes)
        return DeviceAllocation(self, int(ptr), nbytes, device, owned=True)

    def alloc_async(self, nbytes: int, stream: Stream, free_on: int | None = None) -> StreamAllocation:
        """``nbytes`` of device memory on ``stream``'s device, allocated and freed in stream order.

        ``cuMemAllocAsync`` on ``stream``: work queued on ``stream`` after this call may use it
        (other streams must wait for ``stream`` first). ``free()`` -- or dropping the tensor that owns
        it -- queues ``cuMemFreeAsync`` on stream handle ``free_on`` (default ``stream``'s) without
        synchronising the host; whoever uses the memory on another stream orders that stream before
        ``free_on``.
        """
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise InputError(f"allocation size must be a non-negative int, got {nbytes!r}")
        stream.check_open()
        self.set_device(stream.device)
        ptr = self.call("cuMemAllocAsync", max(nbytes, 1), stream.raw)
        return StreamAllocation(self, int(ptr), nbytes, stream.device, stream.handle if free_on is None else free_on)

    def borrow(self, ptr: int, nbytes: int, device: int) -> DeviceAllocation:
        """Wrap memory someone else owns (e.g. a torch CUDA tensor); ``free()`` leaves it alone."""
        self.require_device(device)
        return DeviceAllocation(self, int(ptr), int(nbytes), device, owned=False)

    def memcpy_htod(
        self, dst: DeviceAllocation, src: Any, *, dst_offset: int = 0, stream: Stream | None = None
    ) -> None:
        """Copy the bytes of host buffer ``src`` into ``dst`` at ``dst_offset``.

        With ``stream`` the copy is asynchronous; keep ``src`` alive until the stream syncs.
        """
        host, nbytes = _host_buffer(src, writable=False)
        dptr = dst.span(dst_offset, nbytes, "destination")
        self._copy("cuMemcpyHtoD", dst.device, stream, dptr, host, nbytes)

    def memcpy_dtoh(
        self, dst: Any, src: DeviceAllocation, *, src_offset: int = 0, stream: Stream | None = None
    ) -> None:
        """Fill writable host buffer ``dst`` (all of it) from ``src`` at ``src_offset``."""
        host, nbytes = _host_buffer(dst, writable=True)
        sptr = src.span(src_offset, nbytes, "source")
        self._copy("cuMemcpyDtoH", src.device, stream, host, sptr, nbytes)

    def memcpy_dtod(
        self,
        dst: DeviceAllocation,
        src: DeviceAllocation,
        nbytes: int,
        *,
        dst_offset: int = 0,
        src_offset: int = 0,
        stream: Stream | None = None,
    ) -> None:
        """Copy ``nbytes`` between two allocations on the same device (see :meth:`memcpy_peer`)."""
        if dst.device != src.device:
            raise DeviceError(
                f"memcpy_dtod between device {src.device} and device {dst.device}: use memcpy_peer"
            )
        dptr = dst.span(dst_offset, nbytes, "destination")
        sptr = src.span(src_offset, nbytes, "source")
        self._copy("cuMemcpyDtoD", dst.device, stream, dptr, sptr, nbytes)

    def memcpy_peer(
        self,
        dst: DeviceAllocation,
        src: DeviceAllocation,
        nbytes: int,
        *,
        dst_offset: int = 0,
        src_offset: int = 0,
        stream: Stream | None = None,
    ) -> None:
        """Copy ``nbytes`` from ``src`` to ``dst`` on any devices (the driver stages if needed)."""
        dptr = dst.span(dst_offset, nbytes, "destination")
        sptr = src.span(src_offset, nbytes, "source")
        dctx, sctx = self.context(dst.device), self.context(src.device)
        self._copy("cuMemcpyPeer", dst.device, stream, dptr, dctx, sptr, sctx, nbytes)

    def _copy(self, fn: str, device: int, stream: Stream | None, *args: Any) -> None:
        """Call ``fn(*args)`` with ``device`` current, or ``fn + "Async"(*args, stream)`` on ``stream``."""
        if stream is not None and stream.device != device:
            raise DeviceError(f"stream of device {stream.device} used for memory on device {device}")
        if stream is not None:
            stream.check_open()
        self.set_device(device)
        if stream is None:
            self.call(fn, *args)
        else:
            self.call(fn + "Async", *args, stream.raw)

    # -- streams and events ----------------------------------------------
    def stream(self, device: int) -> Stream:
        """A new non-blocking stream on ``device`` (close it, or use ``with``)."""
        self.set_device(device)
        raw = self.call("cuStreamCreate", _CU_STREAM_NON_BLOCKING)
        return Stream(self, raw, device)

    def borrowed_stream(self, handle: int, device: int) -> Stream:
        """Wrap a stream someone else owns (0: the legacy default stream of ``device``); never destroyed."""
        stream = Stream(self, handle, device)
        stream._destroy = ""
        return stream

    def event(self, device: int, *, timing: bool = False) -> Event:
        """A new event on ``device``; ``timing=True`` makes it usable with :meth:`Event.elapsed_ms`."""
        self.set_device(device)
        raw = self.call("cuEventCreate", _CU_EVENT_DEFAULT if timing else _CU_EVENT_DISABLE_TIMING)
        return Event(self, raw, device)


_CU_STREAM_NON_BLOCKING = 1
_LEGACY_STREAMS = 3  # handles below: the legacy default stream (0, CU_STREAM_LEGACY = 1), the per-thread one (2)
_CU_EVENT_DEFAULT = 0
_CU_EVENT_DISABLE_TIMING = 2


class DeviceAllocation:
    """A span of device memory: ``ptr``, ``nbytes``, ``device``; ``free()`` or ``with``.

    >>> from pyrt.testing import simulated_gpus
    >>> with simulated_gpus(1, memory=1024):
    ...     with alloc(256, device=0) as a:
    ...         (a.nbytes, a.device, a.ptr != 0)
    (256, 0, True)
    """

    __slots__ = ("_cuda", "ptr", "nbytes", "device", "_owned", "freed", "__weakref__")

    def __init__(self, cuda: Cuda, ptr: int, nbytes: int, device: int, *, owned: bool) -> None:
        self._cuda = cuda
        self.ptr = ptr
        self.nbytes = nbytes
        self.device = device
        self._owned = owned
        self.freed = False

    def span(self, offset: int, nbytes: int, role: str = "span") -> int:
        """Address of ``[offset, offset + nbytes)``, bounds-checked against this allocation."""
        if self.freed:
            raise DeviceError(f"{role} allocation at {self.ptr:#x} on device {self.device} was freed")
        for label, value in (("offset", offset), ("size", nbytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InputError(f"{role} {label} must be a non-negative int, got {value!r}")
        if offset + nbytes > self.nbytes:
            raise InputError(
                f"{role} range [{offset}, {offset + nbytes}) overflows the {self.nbytes}-byte "
                f"allocation at {self.ptr:#x} on device {self.device}"
            )
        return self.ptr + offset

    def free(self) -> None:
        """Release the memory (idempotent; borrowed memory is left alone)."""
        if self.freed:
            return
        self.freed = True
        if self._owned:
            self._cuda.free_memory(self.ptr, self.device)

    def __enter__(self) -> DeviceAllocation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    def __repr__(self) -> str:
        state = " freed" if self.freed else ""
        return f"DeviceAllocation(ptr={self.ptr:#x}, nbytes={self.nbytes}, device={self.device}{state})"


class StreamAllocation(DeviceAllocation):
    """Owned memory from ``cuMemAllocAsync``; ``free()`` queues ``cuMemFreeAsync`` on stream handle ``free_on``.

    Built positionally (one per output per graph replay): ``StreamAllocation(cuda, ptr, nbytes, device, free_on)``
    (see :meth:`Cuda.alloc_async`).
    """

    __slots__ = ("_free_on",)

    def __init__(self, cuda: Cuda, ptr: int, nbytes: int, device: int, free_on: int) -> None:
        self._cuda = cuda
        self.ptr = ptr
        self.nbytes = nbytes
        self.device = device
        self._owned = True
        self.freed = False
        self._free_on = free_on

    def free(self) -> None:
        """Queue the free on its stream (idempotent); a stream that is gone: ``cuMemFree`` (it waits for the device)."""
        if self.freed:
            return
        self.freed = True
        try:
            self._cuda.free_async(self.ptr, self.device, self._free_on)
        except DeviceError:
            self._cuda.free_memory(self.ptr, self.device)


_H = TypeVar("_H", bound="_Handle")


class _Handle:
    """A driver stream/event handle bound to one device, destroyed by ``close()``."""

    _destroy = ""

    def __init__(self, cuda: Cuda, raw: Any, device: int) -> None:
        self._cuda = cuda
        self.raw = raw
        self.device = device
        self.closed = False

    @property
    def handle(self) -> int:
        """The handle as an int (what TensorRT's ``execute_async_v3`` takes)."""
        return int(self.raw)

    def check_open(self) -> None:
        if self.closed:
            raise DeviceError(f"{type(self).__name__} {self.handle:#x} on device {self.device} is closed")

    def close(self) -> None:
        """Destroy the handle (idempotent; a borrowed handle is only marked closed)."""
        if not self.closed:
            self.closed = True
            if self._destroy:
                self._cuda.set_device(self.device)
                self._cuda.call(self._destroy, self.raw)

    def __enter__(self: _H) -> _H:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Stream(_Handle):
    """A CUDA stream; ``handle`` is its int value."""

    _destroy = "cuStreamDestroy"

    def synchronize(self) -> None:
        """Block until all work queued on this stream is done."""
        self.check_open()
        self._cuda.set_device(self.device)
        self._cuda.call("cuStreamSynchronize", self.raw)

    def wait(self, event: Event) -> None:
        """Make later work on this stream wait for ``event`` (no host synchronisation)."""
        self.check_open()
        event.check_open()
        self._cuda.set_device(self.device)  # handle 0 means the current context's legacy stream
        self._cuda.call("cuStreamWaitEvent", self.raw, event.raw, 0)


class Event(_Handle):
    """A CUDA event for ordering work across streams."""

    _destroy = "cuEventDestroy"

    def record(self, stream: Stream) -> None:
        """Record this event on ``stream``."""
        self.check_open()
        stream.check_open()
        self._cuda.set_device(self.device)
        self._cuda.call("cuEventRecord", self.raw, stream.raw)

    def synchronize(self) -> None:
        """Block until the work recorded before this event is done."""
        self.check_open()
        self._cuda.call("cuEventSynchronize", self.raw)

    def elapsed_ms(self, end: Event) -> float:
        """Milliseconds of device time from this event to ``end`` (both recorded, created with ``timing=True``).

        Waits for ``end`` first.
        """
        self.check_open()
        end.check_open()
        end.synchronize()
        return float(self._cuda.call("cuEventElapsedTime", self.raw, end.raw))


def _host_buffer(buf: Any, *, writable: bool) -> tuple[Any, int]:
    """(buffer to hand the driver, nbytes) of a C-contiguous host buffer.

    The driver gets a byte view of ``buf`` itself, not a bare address: the binding takes
    its address through the buffer protocol, and the view leads back to the memory's
    owner (the simulated driver checks that owner is still alive when an asynchronous
    copy runs, as a GPU would read it then).
    """
    try:
        view = memoryview(buf)
    except TypeError as exc:
        raise InputError(f"host buffer must support the buffer protocol, got {type(buf).__name__}") from exc
    if not view.c_contiguous:
        raise InputError("host buffer must be C-contiguous")
    if writable and view.readonly:
        raise InputError("destination host buffer is read-only")
    if view.nbytes == 0:
        return 0, 0
    import numpy as np

    return np.frombuffer(view.cast("B"), dtype=np.uint8), view.nbytes


# -- the process-wide seam -----------------------------------------------
_current: Cuda | None = None
_current_lock = threading.Lock()


def current() -> Cuda:
    """The :class:`Cuda` that pyrt uses now (the real driver unless swapped)."""
    global _current
    with _current_lock:
        if _current is None:
            _current = Cuda()
        return _current


def resolve(cuda: Cuda | ModuleType | Any | None) -> Cuda:
    """``None`` -> :func:`current`; a :class:`Cuda` as is; a driver module -> ``Cuda(module)``."""
    if cuda is None:
        return current()
    return cuda if isinstance(cuda, Cuda) else Cuda(cuda)


@contextlib.contextmanager
def use_driver(driver: ModuleType | Any) -> Iterator[Cuda]:
    """Route pyrt's CUDA calls through ``driver`` (e.g. a fake) inside the block."""
    global _current
    with _current_lock:
        saved, _current = _current, resolve(driver)
        cuda = _current
    try:
        yield cuda
    finally:
        with _current_lock:
            _current = saved


def device_count() -> int:
    """Number of CUDA devices; 0 without a driver or GPU."""
    return current().device_count()


def devices() -> list[DeviceInfo]:
    """Info about every CUDA device."""
    return current().devices()


def require_device(index: int, *, purpose: str = "") -> DeviceInfo:
    """Info about device ``index``, or DeviceError listing the devices present."""
    return current().require_device(index, purpose=purpose)


def set_device(index: int) -> None:
    """Make device ``index``'s primary context current."""
    current().set_device(index)


def synchronize(index: int) -> None:
    """Wait for all work on device ``index``."""
    current().synchronize(index)


def alloc(nbytes: int, device: int) -> DeviceAllocation:
    """Allocate device memory (see :meth:`Cuda.alloc`)."""
    return current().alloc(nbytes, device)


def memcpy_htod(dst: DeviceAllocation, src: Any, *, dst_offset: int = 0, stream: Stream | None = None) -> None:
    """Host -> device copy (see :meth:`Cuda.memcpy_htod`)."""
    current().memcpy_htod(dst, src, dst_offset=dst_offset, stream=stream)


def memcpy_dtoh(dst: Any, src: DeviceAllocation, *, src_offset: int = 0, stream: Stream | None = None) -> None:
    """Device -> host copy (see :meth:`Cuda.memcpy_dtoh`)."""
    current().memcpy_dtoh(dst, src, src_offset=src_offset, stream=stream)


def memcpy_dtod(dst: DeviceAllocation, src: DeviceAllocation, nbytes: int, **kw: Any) -> None:
    """Same-device copy (see :meth:`Cuda.memcpy_dtod`)."""
    current().memcpy_dtod(dst, src, nbytes, **kw)


def memcpy_peer(dst: DeviceAllocation, src: DeviceAllocation, nbytes: int, **kw: Any) -> None:
    """Cross-device copy (see :meth:`Cuda.memcpy_peer`)."""
    current().memcpy_peer(dst, src, nbytes, **kw)


def stream(device: int) -> Stream:
    """A new stream on ``device``."""
    return current().stream(device)


def event(device: int, *, timing: bool = False) -> Event:
    """A new event on ``device`` (``timing=True``: usable with ``Event.elapsed_ms``)."""
    return current().event(device, timing=timing)
