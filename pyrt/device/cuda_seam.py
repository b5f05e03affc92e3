"""The CUDA seam: devices, contexts, streams, events and device memory (users import it as :mod:`pyrt.cuda`).

Everything goes through one *driver* module with the surface of
``cuda.bindings.driver`` (cuda-python), imported lazily. Tests swap in a fake
driver (``pyrt.sim.fake_cuda``) with :func:`use_driver`, so the code above
this seam runs unchanged on machines without a GPU. Every driver return code is
checked; a failure raises :class:`~pyrt.errors.DeviceError` naming the call and
the CUDA error name. Without a driver or GPU, :func:`device_count` is 0 and
anything that needs a device raises ``DeviceError`` listing what is present.

>>> from pyrt.sim import simulated_gpus
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
from types import ModuleType
from typing import Any

from pyrt.checks import is_int
from pyrt.device.driver import CudaDriver, DeviceInfo
from pyrt.device.memory import DeviceAllocation, StreamAllocation, host_buffer
from pyrt.device.streams import Event, Stream
from pyrt.errors import DeviceError, InputError

_CU_STREAM_NON_BLOCKING = 1
_CU_EVENT_DEFAULT = 0
_CU_EVENT_DISABLE_TIMING = 2


class Cuda(CudaDriver):
    """CUDA over one driver module; ``Cuda()`` imports ``cuda.bindings.driver`` on first use.

    The checked driver calls, device queries and contexts are :class:`~pyrt.device.driver.CudaDriver`'s;
    this class adds device memory, copies, streams and events.

    >>> from pyrt.sim.fake_cuda import FakeDriver
    >>> Cuda(FakeDriver(gpus=1)).device_count()
    1
    """

    def alloc(self, nbytes: int, device: int) -> DeviceAllocation:
        """Allocate ``nbytes`` of device memory on ``device`` (free it, or use ``with``)."""
        if not is_int(nbytes, low=0):
            raise InputError(f"allocation size must be a non-negative int, got {nbytes!r}")
        nbytes = int(nbytes)
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
        if not is_int(nbytes, low=0):
            raise InputError(f"allocation size must be a non-negative int, got {nbytes!r}")
        nbytes = int(nbytes)
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
        host, nbytes = host_buffer(src, writable=False)
        dptr = dst.span(dst_offset, nbytes, "destination")
        self._copy("cuMemcpyHtoD", dst.device, stream, dptr, host, nbytes)

    def memcpy_dtoh(
        self, dst: Any, src: DeviceAllocation, *, src_offset: int = 0, stream: Stream | None = None
    ) -> None:
        """Fill writable host buffer ``dst`` (all of it) from ``src`` at ``src_offset``."""
        host, nbytes = host_buffer(dst, writable=True)
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


__all__ = [
    "Cuda", "DeviceInfo", "DeviceAllocation", "StreamAllocation", "Stream", "Event", "current", "resolve",
    "use_driver", "device_count", "devices", "require_device", "set_device", "synchronize", "alloc",
    "memcpy_htod", "memcpy_dtoh", "memcpy_dtod", "memcpy_peer", "stream", "event",
]
