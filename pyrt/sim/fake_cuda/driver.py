"""The fake driver itself: :class:`FakeDriver`, the layers above put together, with the
initialisation, device and context calls.
"""

from __future__ import annotations

from typing import Any, TypeAlias

from pyrt.sim.fake_cuda.graphs import GraphDriver
from pyrt.sim.fake_cuda.handles import (
    CUcontext,
    CUdevice,
    CUdevice_attribute,
    CUpointer_attribute,
    CUresult,
    CUstreamCaptureStatus,
)


class FakeDriver(GraphDriver):
    """A fake ``cuda.bindings.driver`` with ``gpus`` devices of ``memory`` bytes each.

    ``memory`` may be one int for all devices or a list with one per device.
    :meth:`view` is the fake's own window into device memory (for the fake
    TensorRT); everything else mirrors the real binding.
    """

    # Type aliases, so the annotations below can name them inside the class body too.
    CUresult: TypeAlias = CUresult
    CUdevice_attribute: TypeAlias = CUdevice_attribute
    CUpointer_attribute: TypeAlias = CUpointer_attribute
    CUstreamCaptureStatus: TypeAlias = CUstreamCaptureStatus

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
