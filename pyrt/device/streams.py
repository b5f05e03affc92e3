"""CUDA stream and event handles: bound to one device, closed once, checked before each use.

Made by :meth:`pyrt.cuda.Cuda.stream`, :meth:`~pyrt.cuda.Cuda.borrowed_stream` and
:meth:`~pyrt.cuda.Cuda.event`; every operation makes the handle's device current and goes
through the checked driver calls of :class:`~pyrt.device.driver.CudaDriver`.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pyrt.device.driver import CudaDriver
from pyrt.errors import DeviceError

_H = TypeVar("_H", bound="_Handle")


class _Handle:
    """A driver stream/event handle bound to one device, destroyed by ``close()``."""

    _destroy = ""

    def __init__(self, cuda: CudaDriver, raw: Any, device: int) -> None:
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
