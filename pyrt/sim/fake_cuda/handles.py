"""The fake driver's result codes, attribute enums and opaque handles (as cuda-python names them).

Handles convert to int like cuda-python's and carry the device they belong to, which the
fake checks on every call that takes one.
"""

from __future__ import annotations

import enum


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


class CUstreamCaptureStatus(enum.IntEnum):
    """A stream's capture status (same names and values as cuda-python)."""

    CU_STREAM_CAPTURE_STATUS_NONE = 0
    CU_STREAM_CAPTURE_STATUS_ACTIVE = 1
    CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2


class Handle:
    """An opaque driver handle that converts to int, like cuda-python's CUstream etc. (fixed fields, as theirs)."""

    __slots__ = ("_value", "device")

    def __init__(self, value: int, device: int) -> None:
        self._value = value
        self.device = device

    def __int__(self) -> int:
        return self._value

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._value:#x}>"


class CUdevice(Handle):
    __slots__ = ()


class CUcontext(Handle):
    __slots__ = ()


class CUstream(Handle):
    __slots__ = ()


class CUevent(Handle):
    """An event; ``timing`` unless created with CU_EVENT_DISABLE_TIMING, ``recorded_at`` in host ns."""

    __slots__ = ("timing", "recorded_at")

    def __init__(self, value: int, device: int, timing: bool = False) -> None:
        super().__init__(value, device)
        self.timing = timing
        self.recorded_at: int | None = None


class CUdeviceptr(Handle):
    __slots__ = ()


class CUgraph(Handle):
    __slots__ = ()


class CUgraphExec(Handle):
    __slots__ = ()
