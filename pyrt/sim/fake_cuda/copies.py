"""The fake driver's copies: host to device, device to host, device to device and between devices,
synchronous or queued on a stream; host buffers of queued copies are watched for use after free.
"""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from pyrt.sim.fake_cuda.handles import (
    CUcontext,
    CUresult,
)
from pyrt.sim.fake_cuda.memory import MemoryDriver
from pyrt.sim.fake_cuda.state import (
    POISON,
    SYNC,
)


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


class CopyDriver(MemoryDriver):
    """cuMemcpy*: checked against the current context's device, run when their stream reaches them."""

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

    def _copy_in(self, dst: Any, src_host: Any, nbytes: int, stream: Any = SYNC) -> CUresult:
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
            target[:] = POISON if data is None else data
            return CUresult.CUDA_SUCCESS

        return self._enqueue(stream, run, "cuMemcpyHtoD")

    def _copy_out(self, dst_host: Any, src: Any, nbytes: int, stream: Any = SYNC) -> CUresult:
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
                 stream: Any = SYNC) -> CUresult:
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
