"""A fake CUDA driver with the surface of ``cuda.bindings.driver`` that pyrt uses.

"Device memory" is host memory (numpy byte arrays) at synthetic addresses:
device ``d`` hands out addresses from ``(d + 1) << 40`` upward, so a host
pointer or another device's pointer used by mistake is caught, not silently
read. Like the real binding, every function returns a tuple whose first item
is a :class:`CUresult`. It is deliberately strict where real CUDA would only
misbehave: a memcpy whose device pointer does not belong to the current
context's device fails with ``CUDA_ERROR_INVALID_VALUE`` (cross-device copies
must use ``cuMemcpyPeer``). Streams run work immediately, in order.

>>> drv = FakeDriver(gpus=1, memory=1 << 20)
>>> drv.cuInit(0)[0] == CUresult.CUDA_SUCCESS
True
>>> drv.cuDeviceGet(5)[0].name
'CUDA_ERROR_INVALID_DEVICE'
"""

from __future__ import annotations

import bisect
import ctypes
import enum
import threading
import time
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np

_ADDRESS_ALIGN = 256  # cuMemAlloc returns 256-byte aligned pointers
_POISON = 0xCD  # fresh allocations are filled with this, never zeros: reads of unset memory show
_POISON_LIMIT = 16 << 20  # larger allocations stay lazily zeroed to spare host memory
_EVENT_DISABLE_TIMING = 2  # CU_EVENT_DISABLE_TIMING


class CUresult(enum.IntEnum):
    """The CUresult codes the fake returns (same names and values as cuda-python)."""

    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_OUT_OF_MEMORY = 2
    CUDA_ERROR_NOT_INITIALIZED = 3
    CUDA_ERROR_NO_DEVICE = 100
    CUDA_ERROR_INVALID_DEVICE = 101
    CUDA_ERROR_INVALID_CONTEXT = 201
    CUDA_ERROR_INVALID_HANDLE = 400
    CUDA_ERROR_ILLEGAL_ADDRESS = 700


class CUdevice_attribute(enum.IntEnum):
    """The device attributes the fake answers (same values as cuda-python)."""

    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76


class _Handle:
    """An opaque driver handle that converts to int, like cuda-python's CUstream etc."""

    def __init__(self, value: int, device: int) -> None:
        self._value = value
        self.device = device

    def __int__(self) -> int:
        return self._value

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._value:#x}>"


class CUdevice(_Handle):
    pass


class CUcontext(_Handle):
    pass


class CUstream(_Handle):
    pass


class CUevent(_Handle):
    """An event; ``timing`` unless created with CU_EVENT_DISABLE_TIMING, ``recorded_at`` in host ns."""

    def __init__(self, value: int, device: int, timing: bool = False) -> None:
        super().__init__(value, device)
        self.timing = timing
        self.recorded_at: int | None = None


class CUdeviceptr(_Handle):
    pass


@dataclass
class _Allocation:
    base: int
    device: int
    data: np.ndarray


@dataclass
class _Device:
    index: int
    name: str
    capability: tuple[int, int]
    memory: int
    used: int = 0
    next_address: int = 0
    retained: int = 0
    bases: list[int] = field(default_factory=list)


class FakeDriver:
    """A fake ``cuda.bindings.driver`` with ``gpus`` devices of ``memory`` bytes each.

    ``memory`` may be one int for all devices or a list with one per device.
    :meth:`view` is the fake's own window into device memory (for the fake
    TensorRT); everything else mirrors the real binding.
    """

    # Type aliases, so the annotations below can name them inside the class body too.
    CUresult: TypeAlias = CUresult
    CUdevice_attribute: TypeAlias = CUdevice_attribute

    def __init__(
        self,
        gpus: int = 1,
        memory: int | list[int] = 16 << 30,
        *,
        name: str = "Fake GPU",
        capability: tuple[int, int] = (8, 9),
    ) -> None:
        sizes = list(memory) if isinstance(memory, (list, tuple)) else [memory] * gpus
        if len(sizes) != gpus:
            raise ValueError(f"memory lists {len(sizes)} sizes for {gpus} GPUs")
        self._devices = [
            _Device(i, f"{name} {i}", capability, size, next_address=(i + 1) << 40)
            for i, size in enumerate(sizes)
        ]
        self._allocations: dict[int, _Allocation] = {}
        self._streams: dict[int, CUstream] = {}
        self._events: dict[int, CUevent] = {}
        self._next_handle = 0x1000
        self._initialized = False
        self._local = threading.local()
        self._lock = threading.RLock()

    # -- fake-only helpers -------------------------------------------------
    @property
    def gpus(self) -> int:
        """Number of simulated devices."""
        return len(self._devices)

    def memory_used(self, device: int) -> int:
        """Bytes currently allocated on ``device``."""
        return self._devices[device].used

    def free_memory(self, device: int) -> int:
        """Bytes still free on ``device``."""
        dev = self._devices[device]
        return dev.memory - dev.used

    def live_allocations(self, device: int | None = None) -> int:
        """Number of live allocations (on ``device``, or on all)."""
        return sum(1 for a in self._allocations.values() if device is None or a.device == device)

    def current_device(self) -> int | None:
        """The device of this thread's current context, or None."""
        ctx = getattr(self._local, "ctx", None)
        return None if ctx is None else ctx.device

    def view(self, ptr: int, nbytes: int, device: int) -> np.ndarray | None:
        """Writable uint8 view of ``[ptr, ptr + nbytes)`` on ``device``, or None if invalid."""
        with self._lock:
            found = self._find(int(ptr), nbytes)
        if found is None or found[0].device != device:
            return None
        alloc, offset = found
        return alloc.data[offset : offset + nbytes]

    def owner(self, ptr: int) -> int | None:
        """The device that owns address ``ptr``, or None."""
        with self._lock:
            found = self._find(int(ptr), 0)
        return None if found is None else found[0].device

    def stream_device(self, stream: int) -> int | None:
        """The device of live stream ``stream`` (0 = legacy default stream: current device)."""
        if int(stream) == 0:
            return self.current_device()
        handle = self._streams.get(int(stream))
        return None if handle is None else handle.device

    def begin_launch(self, stream: int) -> None:
        """An engine launch starts on ``stream`` (the fake's memory is the device's: nothing to do)."""

    def end_launch(self) -> None:
        """An engine launch has written its outputs (nothing to copy back on the fake)."""

    def allocate_internal(self, nbytes: int, device: int) -> int | None:
        """Allocate like cuMemAlloc on ``device`` without touching the current context."""
        with self._lock:
            return self._alloc(nbytes, device)

    def free_internal(self, ptr: int) -> None:
        """Free an address from :meth:`allocate_internal` (ignores unknown ones)."""
        with self._lock:
            self._release(int(ptr))

    # -- internals ---------------------------------------------------------
    def _find(self, ptr: int, nbytes: int) -> tuple[_Allocation, int] | None:
        for dev in self._devices:
            i = bisect.bisect_right(dev.bases, ptr) - 1
            if i < 0:
                continue
            alloc = self._allocations[dev.bases[i]]
            offset = ptr - alloc.base
            if offset + nbytes <= alloc.data.nbytes and offset < max(alloc.data.nbytes, 1):
                return alloc, offset
        return None

    def _alloc(self, nbytes: int, device: int) -> int | None:
        dev = self._devices[device]
        if nbytes <= 0 or dev.used + nbytes > dev.memory:
            return None
        if nbytes <= _POISON_LIMIT:
            data = np.full(nbytes, _POISON, dtype=np.uint8)
        else:
            data = np.zeros(nbytes, dtype=np.uint8)
        base = dev.next_address
        dev.next_address += -(-nbytes // _ADDRESS_ALIGN) * _ADDRESS_ALIGN
        dev.used += nbytes
        self._allocations[base] = _Allocation(base, device, data)
        bisect.insort(dev.bases, base)
        return base

    def _release(self, ptr: int) -> bool:
        alloc = self._allocations.pop(ptr, None)
        if alloc is None:
            return False
        dev = self._devices[alloc.device]
        dev.used -= alloc.data.nbytes
        dev.bases.remove(ptr)
        return True

    def _new_handle(self) -> int:
        self._next_handle += 0x10
        return self._next_handle

    def _ready(self) -> CUresult | None:
        """Error code unless cuInit ran and a context is current."""
        if not self._initialized:
            return CUresult.CUDA_ERROR_NOT_INITIALIZED
        if getattr(self._local, "ctx", None) is None:
            return CUresult.CUDA_ERROR_INVALID_CONTEXT
        return None

    def _context_device(self) -> int:
        """The current context's device; callers have checked :meth:`_ready` first."""
        device = self.current_device()
        if device is None:
            raise RuntimeError("fake cuda: no current context (call _ready() first)")
        return device

    def _device_of(self, dev: Any) -> _Device | None:
        if not isinstance(dev, CUdevice):
            return None
        index = int(dev)
        return self._devices[index] if 0 <= index < len(self._devices) else None

    def _span(self, ptr: Any, nbytes: int, device: int | None) -> np.ndarray | None:
        if device is None:
            return None
        return self.view(int(ptr), nbytes, device)

    def _stream_ok(self, stream: Any) -> bool:
        value = int(stream) if stream is not None else 0
        return value == 0 or value in self._streams

    # -- initialization and devices ------------------------------------------
    def cuInit(self, Flags: int) -> tuple[CUresult]:
        if not self._devices:
            return (CUresult.CUDA_ERROR_NO_DEVICE,)
        self._initialized = True
        return (CUresult.CUDA_SUCCESS,)

    def cuDeviceGetCount(self) -> tuple[CUresult, int]:
        if not self._initialized:
            return (CUresult.CUDA_ERROR_NOT_INITIALIZED, 0)
        return (CUresult.CUDA_SUCCESS, len(self._devices))

    def cuDeviceGet(self, ordinal: int) -> tuple[CUresult, CUdevice | None]:
        if not self._initialized:
            return (CUresult.CUDA_ERROR_NOT_INITIALIZED, None)
        if not 0 <= int(ordinal) < len(self._devices):
            return (CUresult.CUDA_ERROR_INVALID_DEVICE, None)
        return (CUresult.CUDA_SUCCESS, CUdevice(int(ordinal), int(ordinal)))

    def cuDeviceGetName(self, length: int, dev: Any) -> tuple[CUresult, bytes | None]:
        device = self._device_of(dev)
        if device is None:
            return (CUresult.CUDA_ERROR_INVALID_DEVICE, None)
        raw = device.name.encode()[: length - 1]
        return (CUresult.CUDA_SUCCESS, raw + b"\0" * (length - len(raw)))

    def cuDeviceGetAttribute(self, attrib: Any, dev: Any) -> tuple[CUresult, int | None]:
        device = self._device_of(dev)
        if device is None:
            return (CUresult.CUDA_ERROR_INVALID_DEVICE, None)
        if int(attrib) == CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
            return (CUresult.CUDA_SUCCESS, device.capability[0])
        if int(attrib) == CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
            return (CUresult.CUDA_SUCCESS, device.capability[1])
        return (CUresult.CUDA_ERROR_INVALID_VALUE, None)

    def cuDeviceTotalMem(self, dev: Any) -> tuple[CUresult, int | None]:
        device = self._device_of(dev)
        if device is None:
            return (CUresult.CUDA_ERROR_INVALID_DEVICE, None)
        return (CUresult.CUDA_SUCCESS, device.memory)

    # -- contexts --------------------------------------------------------------
    def cuDevicePrimaryCtxRetain(self, dev: Any) -> tuple[CUresult, CUcontext | None]:
        device = self._device_of(dev)
        if device is None:
            return (CUresult.CUDA_ERROR_INVALID_DEVICE, None)
        device.retained += 1
        return (CUresult.CUDA_SUCCESS, CUcontext(0xC0000 + device.index, device.index))

    def cuDevicePrimaryCtxRelease(self, dev: Any) -> tuple[CUresult]:
        device = self._device_of(dev)
        if device is None or device.retained == 0:
            return (CUresult.CUDA_ERROR_INVALID_DEVICE,)
        device.retained -= 1
        return (CUresult.CUDA_SUCCESS,)

    def cuCtxSetCurrent(self, ctx: Any) -> tuple[CUresult]:
        if ctx is not None and (
            not isinstance(ctx, CUcontext) or self._devices[ctx.device].retained == 0
        ):
            return (CUresult.CUDA_ERROR_INVALID_CONTEXT,)
        self._local.ctx = ctx
        return (CUresult.CUDA_SUCCESS,)

    def cuCtxGetCurrent(self) -> tuple[CUresult, CUcontext | None]:
        return (CUresult.CUDA_SUCCESS, getattr(self._local, "ctx", None))

    def cuCtxSynchronize(self) -> tuple[CUresult]:
        return (self._ready() or CUresult.CUDA_SUCCESS,)

    # -- memory ----------------------------------------------------------------
    def cuMemGetInfo(self) -> tuple[CUresult, int, int]:
        error = self._ready()
        if error:
            return (error, 0, 0)
        device = self._context_device()
        return (CUresult.CUDA_SUCCESS, self.free_memory(device), self._devices[device].memory)

    def cuMemAlloc(self, bytesize: int) -> tuple[CUresult, CUdeviceptr | None]:
        error = self._ready()
        if error:
            return (error, None)
        if int(bytesize) <= 0:
            return (CUresult.CUDA_ERROR_INVALID_VALUE, None)
        device = self._context_device()
        with self._lock:
            base = self._alloc(int(bytesize), device)
        if base is None:
            return (CUresult.CUDA_ERROR_OUT_OF_MEMORY, None)
        return (CUresult.CUDA_SUCCESS, CUdeviceptr(base, device))

    def cuMemFree(self, dptr: Any) -> tuple[CUresult]:
        error = self._ready()
        if error:
            return (error,)
        with self._lock:
            ok = self._release(int(dptr))
        return (CUresult.CUDA_SUCCESS if ok else CUresult.CUDA_ERROR_INVALID_VALUE,)

    def _copy_in(self, dst: Any, src_host: Any, nbytes: int) -> CUresult:
        error = self._ready()
        if error:
            return error
        target = self._span(dst, nbytes, self.current_device())
        if target is None:
            return CUresult.CUDA_ERROR_INVALID_VALUE
        if isinstance(src_host, int):
            ctypes.memmove(target.ctypes.data, src_host, nbytes)
        else:
            target[:] = np.frombuffer(memoryview(src_host).cast("B")[:nbytes], dtype=np.uint8)
        return CUresult.CUDA_SUCCESS

    def _copy_out(self, dst_host: Any, src: Any, nbytes: int) -> CUresult:
        error = self._ready()
        if error:
            return error
        source = self._span(src, nbytes, self.current_device())
        if source is None:
            return CUresult.CUDA_ERROR_INVALID_VALUE
        if isinstance(dst_host, int):
            ctypes.memmove(dst_host, source.ctypes.data, nbytes)
        else:
            memoryview(dst_host).cast("B")[:nbytes] = source.tobytes()
        return CUresult.CUDA_SUCCESS

    def _copy_dd(self, dst: Any, src: Any, nbytes: int, dst_dev: int | None, src_dev: int | None) -> CUresult:
        error = self._ready()
        if error:
            return error
        target, source = self._span(dst, nbytes, dst_dev), self._span(src, nbytes, src_dev)
        if target is None or source is None:
            return CUresult.CUDA_ERROR_INVALID_VALUE
        target[:] = source.copy()  # copy first: ranges may overlap
        return CUresult.CUDA_SUCCESS

    def cuMemcpyHtoD(self, dstDevice: Any, srcHost: Any, ByteCount: int) -> tuple[CUresult]:
        return (self._copy_in(dstDevice, srcHost, int(ByteCount)),)

    def cuMemcpyDtoH(self, dstHost: Any, srcDevice: Any, ByteCount: int) -> tuple[CUresult]:
        return (self._copy_out(dstHost, srcDevice, int(ByteCount)),)

    def cuMemcpyDtoD(self, dstDevice: Any, srcDevice: Any, ByteCount: int) -> tuple[CUresult]:
        dev = self.current_device()
        return (self._copy_dd(dstDevice, srcDevice, int(ByteCount), dev, dev),)

    def cuMemcpyPeer(
        self, dstDevice: Any, dstContext: Any, srcDevice: Any, srcContext: Any, ByteCount: int
    ) -> tuple[CUresult]:
        if not isinstance(dstContext, CUcontext) or not isinstance(srcContext, CUcontext):
            return (CUresult.CUDA_ERROR_INVALID_CONTEXT,)
        return (self._copy_dd(dstDevice, srcDevice, int(ByteCount), dstContext.device, srcContext.device),)

    def cuMemcpyHtoDAsync(self, dstDevice: Any, srcHost: Any, ByteCount: int, hStream: Any) -> tuple[CUresult]:
        if not self._stream_ok(hStream):
            return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
        return self.cuMemcpyHtoD(dstDevice, srcHost, ByteCount)

    def cuMemcpyDtoHAsync(self, dstHost: Any, srcDevice: Any, ByteCount: int, hStream: Any) -> tuple[CUresult]:
        if not self._stream_ok(hStream):
            return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
        return self.cuMemcpyDtoH(dstHost, srcDevice, ByteCount)

    def cuMemcpyDtoDAsync(self, dstDevice: Any, srcDevice: Any, ByteCount: int, hStream: Any) -> tuple[CUresult]:
        if not self._stream_ok(hStream):
            return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
        return self.cuMemcpyDtoD(dstDevice, srcDevice, ByteCount)

    def cuMemcpyPeerAsync(
        self, dstDevice: Any, dstContext: Any, srcDevice: Any, srcContext: Any, ByteCount: int, hStream: Any
    ) -> tuple[CUresult]:
        if not self._stream_ok(hStream):
            return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
        return self.cuMemcpyPeer(dstDevice, dstContext, srcDevice, srcContext, ByteCount)

    # -- streams and events ------------------------------------------------------
    def cuStreamCreate(self, Flags: int) -> tuple[CUresult, CUstream | None]:
        error = self._ready()
        if error:
            return (error, None)
        handle = CUstream(self._new_handle(), self._context_device())
        self._streams[int(handle)] = handle
        return (CUresult.CUDA_SUCCESS, handle)

    def cuStreamDestroy(self, hStream: Any) -> tuple[CUresult]:
        found = self._streams.pop(int(hStream), None)
        return (CUresult.CUDA_SUCCESS if found is not None else CUresult.CUDA_ERROR_INVALID_HANDLE,)

    def cuStreamSynchronize(self, hStream: Any) -> tuple[CUresult]:
        ok = self._stream_ok(hStream)
        return (CUresult.CUDA_SUCCESS if ok else CUresult.CUDA_ERROR_INVALID_HANDLE,)

    def cuStreamWaitEvent(self, hStream: Any, hEvent: Any, Flags: int) -> tuple[CUresult]:
        ok = self._stream_ok(hStream) and int(hEvent) in self._events
        return (CUresult.CUDA_SUCCESS if ok else CUresult.CUDA_ERROR_INVALID_HANDLE,)

    def cuEventCreate(self, Flags: int) -> tuple[CUresult, CUevent | None]:
        error = self._ready()
        if error:
            return (error, None)
        handle = CUevent(self._new_handle(), self._context_device(), timing=not Flags & _EVENT_DISABLE_TIMING)
        self._events[int(handle)] = handle
        return (CUresult.CUDA_SUCCESS, handle)

    def cuEventRecord(self, hEvent: Any, hStream: Any) -> tuple[CUresult]:
        event = self._events.get(int(hEvent))
        if event is None or not self._stream_ok(hStream):
            return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
        event.recorded_at = time.perf_counter_ns()  # streams run work at once: all earlier work is done
        return (CUresult.CUDA_SUCCESS,)

    def cuEventElapsedTime(self, hStart: Any, hEnd: Any) -> tuple[CUresult, float | None]:
        """Milliseconds between two recorded timing events (host time here: work runs as it is queued)."""
        start, end = self._events.get(int(hStart)), self._events.get(int(hEnd))
        if start is None or end is None or not (start.timing and end.timing):
            return (CUresult.CUDA_ERROR_INVALID_HANDLE, None)
        if start.recorded_at is None or end.recorded_at is None:
            return (CUresult.CUDA_ERROR_INVALID_HANDLE, None)  # as CUDA: an unrecorded event
        return (CUresult.CUDA_SUCCESS, (end.recorded_at - start.recorded_at) / 1e6)

    def cuEventSynchronize(self, hEvent: Any) -> tuple[CUresult]:
        ok = int(hEvent) in self._events
        return (CUresult.CUDA_SUCCESS if ok else CUresult.CUDA_ERROR_INVALID_HANDLE,)

    def cuEventDestroy(self, hEvent: Any) -> tuple[CUresult]:
        found = self._events.pop(int(hEvent), None)
        return (CUresult.CUDA_SUCCESS if found is not None else CUresult.CUDA_ERROR_INVALID_HANDLE,)
