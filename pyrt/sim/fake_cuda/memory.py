"""The fake driver's device memory: allocations at synthetic addresses (host numpy bytes), poisoned
when fresh or freed, synchronous and stream-ordered (cuMemAllocAsync / cuMemFreeAsync).
"""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np

from pyrt.sim.fake_cuda.handles import (
    CUdeviceptr,
    CUpointer_attribute,
    CUresult,
)
from pyrt.sim.fake_cuda.queue import QueueDriver
from pyrt.sim.fake_cuda.state import (
    ADDRESS_ALIGN,
    FREED_REMEMBERED,
    LEGACY,
    POISON,
    POISON_LIMIT,
    Allocation,
)


class MemoryDriver(QueueDriver):
    """Device memory: views into it for the fake TensorRT, allocation and free (also stream-ordered)."""

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

    def allocate_internal(self, nbytes: int, device: int) -> int | None:
        """Allocate like cuMemAlloc on ``device`` without touching the current context."""
        with self._lock:
            return self._alloc(nbytes, device)

    def free_internal(self, ptr: int) -> None:
        """Free an address from :meth:`allocate_internal` (ignores unknown ones)."""
        with self._lock:
            self._release(int(ptr))

    def _find(self, ptr: int, nbytes: int) -> tuple[Allocation, int] | None:
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
        if nbytes <= POISON_LIMIT:
            data = np.full(nbytes, POISON, dtype=np.uint8)
        else:
            data = np.zeros(nbytes, dtype=np.uint8)
        base = dev.next_address
        dev.next_address += -(-nbytes // ADDRESS_ALIGN) * ADDRESS_ALIGN
        dev.used += nbytes
        self._allocations[base] = Allocation(base, device, data)
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

    def _span(self, ptr: Any, nbytes: int, device: int | None) -> np.ndarray | None:
        if device is None:
            return None
        return self.view(int(ptr), nbytes, device)

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
            alloc.data[:] = POISON
            with self._lock:
                self._release(alloc.base)
                if len(self._freed_async) >= FREED_REMEMBERED:  # the oldest first (dicts keep insertion order)
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
        if handle in LEGACY:
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
