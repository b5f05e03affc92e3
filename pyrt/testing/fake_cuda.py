"""A fake CUDA driver with the surface of ``cuda.bindings.driver`` that pyrt uses.

"Device memory" is host memory (numpy byte arrays) at synthetic addresses:
device ``d`` hands out addresses from ``(d + 1) << 40`` upward, so a host
pointer or another device's pointer used by mistake is caught, not silently
read. Like the real binding, every function returns a tuple whose first item
is a :class:`CUresult`. It is deliberately strict where real CUDA would only
misbehave: a memcpy whose device pointer does not belong to the current
context's device fails with ``CUDA_ERROR_INVALID_VALUE`` (cross-device copies
must use ``cuMemcpyPeer``).

Streams are asynchronous, and adversarially so: work queued on a stream
(``*Async`` copies, engine launches from the fake TensorRT) runs only when
something waits for it -- ``cuStreamSynchronize``, ``cuEventSynchronize`` of
an event recorded after it, ``cuCtxSynchronize``, ``cuMemFree``, or another
stream's queued work that waits on such an event (``cuStreamWaitEvent``).
Work that nothing waits for stays queued, so a missing event between
streams, or a missing sync before the host reads a copy's result, gives a
wrong answer on the fake as it can on a GPU. Synchronous copies do not wait
for non-blocking streams (pyrt's streams are created non-blocking), as in
CUDA. Host memory handed to an asynchronous copy is treated as pinned (the
copy reads or writes it when it runs): if the buffer's owner has been freed
by then, the copy writes poison instead and the hazard is recorded in
:attr:`FakeDriver.hazards`.
Stream-ordered memory (``cuMemAllocAsync`` / ``cuMemFreeAsync``) follows the
same queues: the allocation may be named by work queued after it but touched
only once its stream has reached it, and a free releases (and poisons) the
memory only when its stream reaches it; work that runs on another stream,
unordered, before the allocation or after the free is a hazard too.

>>> drv = FakeDriver(gpus=1, memory=1 << 20)
>>> drv.cuInit(0)[0] == CUresult.CUDA_SUCCESS
True
>>> drv.cuDeviceGet(5)[0].name
'CUDA_ERROR_INVALID_DEVICE'
"""

from __future__ import annotations

import bisect
import collections
import ctypes
import enum
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np

_ADDRESS_ALIGN = 256  # cuMemAlloc returns 256-byte aligned pointers
_POISON = 0xCD  # fresh allocations are filled with this, never zeros: reads of unset memory show
_LEGACY = (0, 1, 2)  # 0 and CU_STREAM_LEGACY (1): the legacy default stream; 2: per-thread (modelled alike)
_POISON_LIMIT = 16 << 20  # larger allocations stay lazily zeroed to spare host memory
_EVENT_DISABLE_TIMING = 2  # CU_EVENT_DISABLE_TIMING
_FREED_REMEMBERED = 1 << 16  # stream-ordered frees whose later use is still named as such (older: "no allocation")


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
    CUDA_ERROR_ILLEGAL_STATE = 401
    CUDA_ERROR_NOT_READY = 600
    CUDA_ERROR_ILLEGAL_ADDRESS = 700
    CUDA_ERROR_NOT_SUPPORTED = 801
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901
    CUDA_ERROR_STREAM_CAPTURE_ISOLATION = 905


class CUdevice_attribute(enum.IntEnum):
    """The device attributes the fake answers (same values as cuda-python)."""

    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
    CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED = 115


class CUpointer_attribute(enum.IntEnum):
    """The pointer attributes the fake answers (same values as cuda-python)."""

    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9


class _Handle:
    """An opaque driver handle that converts to int, like cuda-python's CUstream etc. (fixed fields, as theirs)."""

    __slots__ = ("_value", "device")

    def __init__(self, value: int, device: int) -> None:
        self._value = value
        self.device = device

    def __int__(self) -> int:
        return self._value

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._value:#x}>"


class CUdevice(_Handle):
    __slots__ = ()


class CUcontext(_Handle):
    __slots__ = ()


class CUstream(_Handle):
    __slots__ = ()


class CUevent(_Handle):
    """An event; ``timing`` unless created with CU_EVENT_DISABLE_TIMING, ``recorded_at`` in host ns."""

    __slots__ = ("timing", "recorded_at")

    def __init__(self, value: int, device: int, timing: bool = False) -> None:
        super().__init__(value, device)
        self.timing = timing
        self.recorded_at: int | None = None


class CUdeviceptr(_Handle):
    __slots__ = ()


class CUgraph(_Handle):
    __slots__ = ()


class CUgraphExec(_Handle):
    __slots__ = ()


@dataclass
class _Op:
    fn: Callable[[], CUresult]
    what: str
    after: tuple[_Queue, int] | None  # run that queue up to that many operations first


@dataclass
class _Queue:
    device: int
    ops: collections.deque[_Op] = field(default_factory=collections.deque)
    enqueued: int = 0
    done: int = 0
    fault: CUresult = CUresult.CUDA_SUCCESS
    capture: list[_Op] | None = None  # operations recorded by stream capture (None: not capturing)
    capture_error: CUresult = CUresult.CUDA_SUCCESS  # what invalidated the capture


def _owner_ref(buf: Any) -> Callable[[], bool]:
    """``alive()`` for the object that owns ``buf``'s memory (followed through views and memoryviews).

    Owners that take no weak reference (bytes, bytearray) are held strongly: always alive.
    """
    owner = buf
    for _ in range(64):  # views of views: follow to the object that owns the memory
        if isinstance(owner, memoryview):
            owner = owner.obj
        elif isinstance(owner, np.ndarray) and owner.base is not None:
            owner = owner.base
        else:
            break
    try:
        ref = weakref.ref(owner)
    except TypeError:
        return lambda: owner is not None
    return lambda: ref() is not None


@dataclass
class _Allocation:
    base: int
    device: int
    data: np.ndarray
    ready: bool = True  # False until its stream reaches a stream-ordered allocation (cuMemAllocAsync)
    freeing: bool = False  # a stream-ordered free (cuMemFreeAsync) is queued: no new work may use it


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
    CUpointer_attribute: TypeAlias = CUpointer_attribute

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
        self._queues: dict[int, _Queue] = {}  # stream handle -> its pending work
        self._event_marks: dict[int, tuple[_Queue, int] | None] = {}  # event -> (queue, ops before it)
        self._graphs: dict[int, list[_Op]] = {}
        self._graph_execs: dict[int, tuple[_Op, ...]] = {}
        self.graph_launches = 0  # cuGraphLaunch calls that succeeded
        self.memory_pools = True  # False: devices without the stream-ordered allocator (cuMemAllocAsync and
        # cuMemFreeAsync fail with CUDA_ERROR_NOT_SUPPORTED, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED is 0)
        self.hazards: list[str] = []  # use-after-free of host memory, async faults: empty in correct code
        # base -> bytes of the latest allocations a stream-ordered free released (addresses are never reused)
        self._freed_async: dict[int, int] = {}
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
        """Writable uint8 view of ``[ptr, ptr + nbytes)`` on ``device``, or None if invalid.

        Stream-ordered memory: work being queued may name an allocation its stream has not
        reached yet, but not one whose free is queued; work running may not touch memory
        whose allocation has not run yet (a hazard) or that a stream-ordered free released.
        """
        with self._lock:
            found = self._find(int(ptr), nbytes)
        if found is None or found[0].device != device:
            if found is None and self._is_running():
                self._note_freed(int(ptr))
            return None
        alloc, offset = found
        running = self._is_running()
        if running and not alloc.ready:
            self.hazards.append(f"memory at {alloc.base:#x} used before its stream reached cuMemAllocAsync")
            return None
        if not running and alloc.freeing:
            return None
        return alloc.data[offset : offset + nbytes]

    def _is_running(self) -> int:
        """How deep this thread is in running queued work (0: it is queueing, or outside the driver)."""
        return getattr(self._local, "running", 0)

    def _note_freed(self, ptr: int) -> None:
        """Record a hazard if running work touches memory that a stream-ordered free released."""
        for base, nbytes in self._freed_async.items():
            if base <= ptr < base + max(nbytes, 1):
                self.hazards.append(f"memory at {base:#x} used after its stream reached cuMemFreeAsync")
                return

    def owner(self, ptr: int) -> int | None:
        """The device that owns address ``ptr``, or None."""
        with self._lock:
            found = self._find(int(ptr), 0)
        return None if found is None else found[0].device

    def stream_device(self, stream: int) -> int | None:
        """The device of live stream ``stream`` (0 = legacy default stream: current device)."""
        if int(stream) in _LEGACY:
            return self.current_device()
        handle = self._streams.get(int(stream))
        return None if handle is None else handle.device

    def launch(self, stream: int, work: Callable[[], str | None], what: str) -> bool:
        """Queue ``work`` (an engine launch of the fake TensorRT) on ``stream``; False for a dead stream.

        ``work`` returns None, or an error message, which becomes an asynchronous fault
        reported by the next synchronisation (and recorded in :attr:`hazards`).
        """
        if not self._stream_ok(stream):
            return False

        def run() -> CUresult:
            message = work()
            if message is None:
                return CUresult.CUDA_SUCCESS
            self.hazards.append(f"{what}: {message}")
            return CUresult.CUDA_ERROR_ILLEGAL_ADDRESS

        return self._enqueue(stream, run, what) == CUresult.CUDA_SUCCESS

    def pending(self, stream: int | None = None) -> int:
        """Operations queued and not yet run (on ``stream``, or on all streams)."""
        queues = self._queues.values() if stream is None else [self._queues.get(int(stream))]
        return sum(len(q.ops) for q in queues if q is not None)

    # -- the asynchronous engine -----------------------------------------------
    def _enqueue(self, stream: Any, fn: Callable[[], CUresult], what: str,
                 after: tuple[_Queue, int] | None = None) -> CUresult:
        handle = int(stream) if stream is not None else 0
        if handle in _LEGACY:  # the legacy (or per-thread) default stream: pyrt's own streams never synchronise with it
            if self._capturing():
                return self._invalidate_captures(CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
            if after is not None:
                self._drain(*after)
            self._local.running = self._is_running() + 1
            try:
                self._note(fn(), what)
            finally:
                self._local.running -= 1
            return CUresult.CUDA_SUCCESS
        queue = self._queues[handle]
        if queue.capture is not None:
            if after is not None and after[0] is not queue:  # an event from outside the capture
                return self._invalidate(queue, CUresult.CUDA_ERROR_STREAM_CAPTURE_ISOLATION)
            queue.capture.append(_Op(fn, what, None))
            return CUresult.CUDA_SUCCESS
        queue.ops.append(_Op(fn, what, after))
        queue.enqueued += 1
        return CUresult.CUDA_SUCCESS

    def _capturing(self) -> bool:
        return any(q.capture is not None for q in self._queues.values())

    def _invalidate(self, queue: _Queue, code: CUresult) -> CUresult:
        queue.capture_error = queue.capture_error or code
        return code

    def _invalidate_captures(self, code: CUresult) -> CUresult:
        """An unsafe call while a capture is under way (thread-local mode): it fails the capture."""
        for queue in self._queues.values():
            if queue.capture is not None:
                self._invalidate(queue, code)
        return code

    def _drain(self, queue: _Queue, upto: int | None = None) -> CUresult:
        """Run ``queue``'s work up to its ``upto``-th operation (all of it when None)."""
        target = queue.enqueued if upto is None else upto
        result = CUresult.CUDA_SUCCESS
        while queue.done < target and queue.ops:
            op = queue.ops.popleft()
            queue.done += 1
            if op.after is not None:
                self._drain(*op.after)
            self._local.running = self._is_running() + 1
            try:
                code = op.fn()
            finally:
                self._local.running -= 1
            if code != CUresult.CUDA_SUCCESS:
                queue.fault = queue.fault or code
        if queue.fault:
            result, queue.fault = queue.fault, CUresult.CUDA_SUCCESS
        return result

    def _drain_device(self, device: int) -> CUresult:
        result = CUresult.CUDA_SUCCESS
        for handle in list(self._queues):
            queue = self._queues.get(handle)
            if queue is not None and queue.device == device:
                code = self._drain(queue)
                result = result if result != CUresult.CUDA_SUCCESS else code
        return result

    def _note(self, code: CUresult, what: str) -> None:
        if code != CUresult.CUDA_SUCCESS:
            self.hazards.append(f"{what}: {code.name}")

    def _host_source(self, host: Any, nbytes: int, what: str) -> Callable[[], np.ndarray | None]:
        """A reader of host buffer ``host`` for later: None if its owner is gone by then."""
        if isinstance(host, int):
            address = host  # a bare address: nothing to watch (pyrt passes buffers)
            return lambda: np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address)).copy()
        view = memoryview(host).cast("B")
        address = np.frombuffer(view, dtype=np.uint8).ctypes.data if nbytes else 0
        alive = _owner_ref(host)
        del view

        def read() -> np.ndarray | None:
            if not alive():
                self.hazards.append(f"{what}: host buffer freed before the copy ran")
                return None
            return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address)).copy()

        return read

    def _host_target(self, host: Any, nbytes: int, what: str) -> Callable[[np.ndarray], None]:
        """A writer into host buffer ``host`` for later: skipped (a hazard) if its owner is gone."""
        if isinstance(host, int):
            address = host

            def write_address(data: np.ndarray) -> None:
                ctypes.memmove(address, data.ctypes.data, nbytes)

            return write_address
        view = memoryview(host).cast("B")
        if view.readonly:
            raise ValueError("fake cuda: destination host buffer is read-only")
        address = np.frombuffer(view, dtype=np.uint8).ctypes.data if nbytes else 0
        alive = _owner_ref(host)
        del view

        def write(data: np.ndarray) -> None:
            if not alive():
                self.hazards.append(f"{what}: host buffer freed before the copy ran")
                return
            ctypes.memmove(address, data.ctypes.data, nbytes)

        return write

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
        return value in _LEGACY or value in self._streams

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
        if int(attrib) == CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
            return (CUresult.CUDA_SUCCESS, int(self.memory_pools))
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
        error = self._ready()
        if error:
            return (error,)
        if self._capturing():
            return (self._invalidate_captures(CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED),)
        return (self._drain_device(self._context_device()),)

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
        if self._capturing():  # it synchronises the device: unsafe while a capture is under way
            return (self._invalidate_captures(CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED),)
        found = self._allocations.get(int(dptr))
        if found is not None and found.freeing:  # a stream-ordered free of it is queued: a double free
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
        self._note(self._drain_device(self._context_device()), "work before cuMemFree")  # it synchronises
        with self._lock:
            ok = self._release(int(dptr))
        return (CUresult.CUDA_SUCCESS if ok else CUresult.CUDA_ERROR_INVALID_VALUE,)

    def cuMemAllocAsync(self, bytesize: int, hStream: Any) -> tuple[CUresult, CUdeviceptr | None]:
        """Stream-ordered allocation: the address now, usable by work that ``hStream``'s order puts after it."""
        device = self._ordered_device(hStream)
        if isinstance(device, CUresult):
            return (device, None)
        if int(bytesize) <= 0:
            return (CUresult.CUDA_ERROR_INVALID_VALUE, None)
        if self._captured(hStream):  # graph memory nodes are not modelled: the capture fails
            return (self._invalidate(self._queues[int(hStream)], CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED), None)
        with self._lock:
            base = self._alloc(int(bytesize), device)
        if base is None:
            return (CUresult.CUDA_ERROR_OUT_OF_MEMORY, None)
        alloc = self._allocations[base]
        alloc.ready = False

        def run() -> CUresult:  # the stream reaches the allocation: its (poisoned) memory is usable
            alloc.ready = True
            return CUresult.CUDA_SUCCESS

        code = self._enqueue(hStream, run, "cuMemAllocAsync")
        if code:  # the legacy stream while a capture is under way
            with self._lock:
                self._release(base)
            return (code, None)
        return (CUresult.CUDA_SUCCESS, CUdeviceptr(base, device))

    def cuMemFreeAsync(self, dptr: Any, hStream: Any) -> tuple[CUresult]:
        """Stream-ordered free: the memory stays valid until ``hStream`` reaches the free, then is poisoned
        and released (its bytes count as free again); no new work may use it from now on."""
        device = self._ordered_device(hStream)
        if isinstance(device, CUresult):
            return (device,)
        alloc = self._allocations.get(int(dptr))
        if alloc is None or alloc.freeing:  # unknown, already freed, or a free already queued
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
        if self._captured(hStream):
            return (self._invalidate(self._queues[int(hStream)], CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED),)
        alloc.freeing = True

        def run() -> CUresult:
            alloc.data[:] = _POISON
            with self._lock:
                self._release(alloc.base)
                if len(self._freed_async) >= _FREED_REMEMBERED:  # the oldest first (dicts keep insertion order)
                    del self._freed_async[next(iter(self._freed_async))]
                self._freed_async[alloc.base] = alloc.data.nbytes
            return CUresult.CUDA_SUCCESS

        code = self._enqueue(hStream, run, "cuMemFreeAsync")
        if code:
            alloc.freeing = False
        return (code,)

    def _ordered_device(self, stream: Any) -> int | CUresult:
        """The device of a stream-ordered memory call on ``stream``, or its error: the legacy stream needs a
        current context, another stream must be live (its own context is used)."""
        if not self._initialized:
            return CUresult.CUDA_ERROR_NOT_INITIALIZED
        if not self.memory_pools:
            return CUresult.CUDA_ERROR_NOT_SUPPORTED
        handle = int(stream) if stream is not None else 0
        if handle in _LEGACY:
            return self._ready() or self._context_device()
        found = self._streams.get(handle)
        return CUresult.CUDA_ERROR_INVALID_HANDLE if found is None else found.device

    def _captured(self, stream: Any) -> bool:
        queue = self._queues.get(int(stream) if stream is not None else 0)
        return queue is not None and queue.capture is not None

    def cuPointerGetAttribute(self, attribute: Any, ptr: Any) -> tuple[CUresult, int | None]:
        if int(attribute) != CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
            return (CUresult.CUDA_ERROR_INVALID_VALUE, None)
        if not self._initialized:
            return (CUresult.CUDA_ERROR_NOT_INITIALIZED, None)
        device = self.owner(int(ptr))
        return (CUresult.CUDA_ERROR_INVALID_VALUE, None) if device is None else (CUresult.CUDA_SUCCESS, device)

    def _copy_in(self, dst: Any, src_host: Any, nbytes: int, stream: Any = None) -> CUresult:
        error = self._ready()
        if error:
            return error
        device = self.current_device()
        if self._span(dst, nbytes, device) is None:
            return CUresult.CUDA_ERROR_INVALID_VALUE
        try:
            read = self._host_source(src_host, nbytes, "cuMemcpyHtoDAsync")
        except (TypeError, ValueError):
            return CUresult.CUDA_ERROR_INVALID_VALUE

        def run() -> CUresult:
            target = self._span(dst, nbytes, device)
            if target is None:
                return CUresult.CUDA_ERROR_ILLEGAL_ADDRESS
            data = read()
            target[:] = _POISON if data is None else data
            return CUresult.CUDA_SUCCESS

        return self._enqueue(stream, run, "cuMemcpyHtoD")

    def _copy_out(self, dst_host: Any, src: Any, nbytes: int, stream: Any = None) -> CUresult:
        error = self._ready()
        if error:
            return error
        device = self.current_device()
        if self._span(src, nbytes, device) is None:
            return CUresult.CUDA_ERROR_INVALID_VALUE
        try:
            write = self._host_target(dst_host, nbytes, "cuMemcpyDtoHAsync")
        except (TypeError, ValueError):
            return CUresult.CUDA_ERROR_INVALID_VALUE

        def run() -> CUresult:
            source = self._span(src, nbytes, device)
            if source is None:
                return CUresult.CUDA_ERROR_ILLEGAL_ADDRESS
            write(source.copy())
            return CUresult.CUDA_SUCCESS

        return self._enqueue(stream, run, "cuMemcpyDtoH")

    def _copy_dd(self, dst: Any, src: Any, nbytes: int, dst_dev: int | None, src_dev: int | None,
                 stream: Any = None) -> CUresult:
        error = self._ready()
        if error:
            return error
        if self._span(dst, nbytes, dst_dev) is None or self._span(src, nbytes, src_dev) is None:
            return CUresult.CUDA_ERROR_INVALID_VALUE

        def run() -> CUresult:
            target, source = self._span(dst, nbytes, dst_dev), self._span(src, nbytes, src_dev)
            if target is None or source is None:
                return CUresult.CUDA_ERROR_ILLEGAL_ADDRESS
            target[:] = source.copy()  # copy first: ranges may overlap
            return CUresult.CUDA_SUCCESS

        return self._enqueue(stream, run, "cuMemcpyDtoD")

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
        return (self._copy_in(dstDevice, srcHost, int(ByteCount), hStream),)

    def cuMemcpyDtoHAsync(self, dstHost: Any, srcDevice: Any, ByteCount: int, hStream: Any) -> tuple[CUresult]:
        if not self._stream_ok(hStream):
            return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
        return (self._copy_out(dstHost, srcDevice, int(ByteCount), hStream),)

    def cuMemcpyDtoDAsync(self, dstDevice: Any, srcDevice: Any, ByteCount: int, hStream: Any) -> tuple[CUresult]:
        if not self._stream_ok(hStream):
            return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
        dev = self.current_device()
        return (self._copy_dd(dstDevice, srcDevice, int(ByteCount), dev, dev, hStream),)

    def cuMemcpyPeerAsync(
        self, dstDevice: Any, dstContext: Any, srcDevice: Any, srcContext: Any, ByteCount: int, hStream: Any
    ) -> tuple[CUresult]:
        if not self._stream_ok(hStream):
            return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
        if not isinstance(dstContext, CUcontext) or not isinstance(srcContext, CUcontext):
            return (CUresult.CUDA_ERROR_INVALID_CONTEXT,)
        return (self._copy_dd(dstDevice, srcDevice, int(ByteCount), dstContext.device, srcContext.device,
                              hStream),)

    # -- streams and events ------------------------------------------------------
    def cuStreamCreate(self, Flags: int) -> tuple[CUresult, CUstream | None]:
        error = self._ready()
        if error:
            return (error, None)
        handle = CUstream(self._new_handle(), self._context_device())
        self._streams[int(handle)] = handle
        self._queues[int(handle)] = _Queue(handle.device)
        return (CUresult.CUDA_SUCCESS, handle)

    def cuStreamDestroy(self, hStream: Any) -> tuple[CUresult]:
        found = self._streams.pop(int(hStream), None)
        if found is None:
            return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
        queue = self._queues.pop(int(hStream))
        self._note(self._drain(queue), "work on a destroyed stream")  # queued work still completes
        return (CUresult.CUDA_SUCCESS,)

    def cuStreamSynchronize(self, hStream: Any) -> tuple[CUresult]:
        if not self._stream_ok(hStream):
            return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
        if self._capturing():
            return (self._invalidate_captures(CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED),)
        queue = self._queues.get(int(hStream))
        return (CUresult.CUDA_SUCCESS if queue is None else self._drain(queue),)

    def cuStreamWaitEvent(self, hStream: Any, hEvent: Any, Flags: int) -> tuple[CUresult]:
        if not self._stream_ok(hStream) or int(hEvent) not in self._events:
            return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
        mark = self._event_marks.get(int(hEvent))
        if mark is not None:
            return (self._enqueue(hStream, lambda: CUresult.CUDA_SUCCESS, "cuStreamWaitEvent", after=mark),)
        return (CUresult.CUDA_SUCCESS,)

    # -- stream capture and graphs -----------------------------------------------------
    def cuStreamBeginCapture(self, hStream: Any, mode: Any) -> tuple[CUresult]:
        handle = int(hStream) if hStream is not None else 0
        if handle in _LEGACY:
            return (CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,)
        queue = self._queues.get(handle)
        if queue is None:
            return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
        if queue.capture is not None:
            return (CUresult.CUDA_ERROR_ILLEGAL_STATE,)
        queue.capture, queue.capture_error = [], CUresult.CUDA_SUCCESS
        return (CUresult.CUDA_SUCCESS,)

    def cuStreamEndCapture(self, hStream: Any) -> tuple[CUresult, CUgraph | None]:
        queue = self._queues.get(int(hStream) if hStream is not None else 0)
        if queue is None or queue.capture is None:
            return (CUresult.CUDA_ERROR_ILLEGAL_STATE, None)
        ops, error = queue.capture, queue.capture_error
        queue.capture, queue.capture_error = None, CUresult.CUDA_SUCCESS
        if error:
            return (CUresult.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, None)
        graph = CUgraph(self._new_handle(), queue.device)
        self._graphs[int(graph)] = list(ops)
        return (CUresult.CUDA_SUCCESS, graph)

    def cuGraphInstantiate(self, hGraph: Any, flags: int) -> tuple[CUresult, CUgraphExec | None]:
        ops = self._graphs.get(int(hGraph))
        if ops is None:
            return (CUresult.CUDA_ERROR_INVALID_VALUE, None)
        graph_exec = CUgraphExec(self._new_handle(), hGraph.device if isinstance(hGraph, _Handle) else 0)
        self._graph_execs[int(graph_exec)] = tuple(ops)
        return (CUresult.CUDA_SUCCESS, graph_exec)

    def cuGraphLaunch(self, hGraphExec: Any, hStream: Any) -> tuple[CUresult]:
        ops = self._graph_execs.get(int(hGraphExec))
        if ops is None or not self._stream_ok(hStream):
            return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
        for op in ops:  # the recorded work, queued again: it reads its inputs when it runs
            code = self._enqueue(hStream, op.fn, f"graph: {op.what}")
            if code:
                return (code,)
        self.graph_launches += 1
        return (CUresult.CUDA_SUCCESS,)

    def cuGraphExecDestroy(self, hGraphExec: Any) -> tuple[CUresult]:
        found = self._graph_execs.pop(int(hGraphExec), None)
        return (CUresult.CUDA_SUCCESS if found is not None else CUresult.CUDA_ERROR_INVALID_VALUE,)

    def cuGraphDestroy(self, hGraph: Any) -> tuple[CUresult]:
        found = self._graphs.pop(int(hGraph), None)
        return (CUresult.CUDA_SUCCESS if found is not None else CUresult.CUDA_ERROR_INVALID_VALUE,)

    def cuEventCreate(self, Flags: int) -> tuple[CUresult, CUevent | None]:
        error = self._ready()
        if error:
            return (error, None)
        handle = CUevent(self._new_handle(), self._context_device(), timing=not Flags & _EVENT_DISABLE_TIMING)
        self._events[int(handle)] = handle
        self._event_marks[int(handle)] = None
        return (CUresult.CUDA_SUCCESS, handle)

    def cuEventRecord(self, hEvent: Any, hStream: Any) -> tuple[CUresult]:
        event = self._events.get(int(hEvent))
        if event is None or not self._stream_ok(hStream):
            return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
        if event.timing:
            event.recorded_at = None

            def stamp() -> CUresult:  # the time at which the stream reaches the event
                event.recorded_at = time.perf_counter_ns()
                return CUresult.CUDA_SUCCESS

            code = self._enqueue(hStream, stamp, "cuEventRecord")
            if code:
                return (code,)
        queue = self._queues.get(int(hStream)) if hStream is not None else None  # legacy work has run
        self._event_marks[int(hEvent)] = None if queue is None else (queue, queue.enqueued)
        return (CUresult.CUDA_SUCCESS,)

    def cuEventElapsedTime(self, hStart: Any, hEnd: Any) -> tuple[CUresult, float | None]:
        """Milliseconds between two timing events, by the host clock when the simulated streams reached them."""
        start, end = self._events.get(int(hStart)), self._events.get(int(hEnd))
        if start is None or end is None or not (start.timing and end.timing):
            return (CUresult.CUDA_ERROR_INVALID_HANDLE, None)
        if start.recorded_at is None or end.recorded_at is None:
            return (CUresult.CUDA_ERROR_NOT_READY, None)  # as CUDA: recorded work not yet done (or never recorded)
        return (CUresult.CUDA_SUCCESS, (end.recorded_at - start.recorded_at) / 1e6)

    def cuEventSynchronize(self, hEvent: Any) -> tuple[CUresult]:
        if int(hEvent) not in self._events:
            return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
        if self._capturing():
            return (self._invalidate_captures(CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED),)
        mark = self._event_marks.get(int(hEvent))
        return (CUresult.CUDA_SUCCESS if mark is None else self._drain(*mark),)

    def cuEventDestroy(self, hEvent: Any) -> tuple[CUresult]:
        found = self._events.pop(int(hEvent), None)
        self._event_marks.pop(int(hEvent), None)
        return (CUresult.CUDA_SUCCESS if found is not None else CUresult.CUDA_ERROR_INVALID_HANDLE,)
