"""Device memory handles: a span of device memory, its bounds checks and how it is freed.

:class:`DeviceAllocation` (``cuMemAlloc``, or borrowed memory left alone) and
:class:`StreamAllocation` (``cuMemAllocAsync``, freed in stream order), both made by
:class:`pyrt.cuda.Cuda`, and :func:`host_buffer`, the byte view of a host buffer that
copies hand the driver.
"""

from __future__ import annotations

from typing import Any

from pyrt.checks import is_int
from pyrt.device.driver import CudaDriver
from pyrt.errors import DeviceError, InputError


class DeviceAllocation:
    """A span of device memory: ``ptr``, ``nbytes``, ``device``; ``free()`` or ``with``.

    >>> from pyrt.cuda import alloc
    >>> from pyrt.sim import simulated_gpus
    >>> with simulated_gpus(1, memory=1024):
    ...     with alloc(256, device=0) as a:
    ...         (a.nbytes, a.device, a.ptr != 0)
    (256, 0, True)
    """

    __slots__ = ("_cuda", "ptr", "nbytes", "device", "_owned", "freed", "__weakref__")

    def __init__(self, cuda: CudaDriver, ptr: int, nbytes: int, device: int, *, owned: bool) -> None:
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
            if not is_int(value, low=0):
                raise InputError(f"{role} {label} must be a non-negative int, got {value!r}")
        offset, nbytes = int(offset), int(nbytes)  # a numpy int as a plain one: addresses are exact
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
    (see :meth:`pyrt.cuda.Cuda.alloc_async`).
    """

    __slots__ = ("_free_on",)

    def __init__(self, cuda: CudaDriver, ptr: int, nbytes: int, device: int, free_on: int) -> None:
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



def host_buffer(buf: Any, *, writable: bool) -> tuple[Any, int]:
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
