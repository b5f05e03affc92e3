"""Caller interop: what kind of tensor a caller handed in, device inputs, and device outputs.

Callers hand in numpy arrays, torch tensors, or anything with ``__dlpack__`` /
``__cuda_array_interface__``; :func:`caller_kind` remembers which so outputs go back in
the same kind. :func:`device_input` describes a caller's CUDA buffer (torch CUDA tensor,
CAI v3, or a DLPack capsule read with ctypes) without copying it, and
:func:`device_output` hands a device tensor back. torch is detected through
``sys.modules``: nothing here imports it unless the caller already did.
"""

from __future__ import annotations

import ctypes
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import pyrt.cuda as cuda_seam
from pyrt.errors import DeviceError, InputError, PyrtError
from pyrt.format.dtypes import ScalarType
from pyrt.memory.layout import c_strides, scalar_type_of_numpy, scalar_type_of_torch
from pyrt.memory.tensors import DeviceTensor

TORCH, NUMPY, DLPACK, CAI = "torch", "numpy", "dlpack", "cai"
_KDL_CPU, _KDL_CUDA, _KDL_CUDA_HOST = 1, 2, 3


def is_torch_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def caller_kind(x: Any) -> str | None:
    """"torch", "numpy", "dlpack", "cai" (device interface) or None for non-tensors."""
    if isinstance(x, np.ndarray):
        return NUMPY
    if is_torch_tensor(x):
        return TORCH
    if isinstance(x, DeviceTensor) or hasattr(x, "__cuda_array_interface__"):
        return CAI
    if hasattr(x, "__dlpack__"):
        return DLPACK
    return None


def check_dense_torch(x: Any, what: str) -> None:
    """InputError for a torch tensor without host-readable dense data (meta, sparse, mkldnn, ...)."""
    if x.is_meta:
        raise InputError(f"{what}: a meta tensor has no data")
    if x.layout is not sys.modules["torch"].strided:
        raise InputError(f"{what}: a {x.layout} tensor is not supported; pass a dense one (x.to_dense())")


@dataclass(frozen=True)
class DeviceInput:
    """A caller's device buffer: address, device, dtype and shape (C-contiguous).

    ``stream``: a stream whose queued work produces the buffer (the ``"stream"`` of a
    ``__cuda_array_interface__``, a torch tensor's current stream when pyrt runs on
    another one); pyrt's work on it waits for that stream first. None: nothing to wait for
    (DLPack producers order their work before the consumer's stream themselves).
    """

    ptr: int
    device: int
    scalar_type: ScalarType
    shape: tuple[int, ...]
    owner: Any  # keeps the caller's object (or DLPack capsule) alive during the run
    stream: int | None = None

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.scalar_type.itemsize


ConsumerStream = Callable[[int], int]  # device -> the stream handle pyrt will read the input on


def device_input(x: Any, what: str, cuda: Any = None, consumer: ConsumerStream | None = None) -> DeviceInput | None:
    """Describe ``x`` if it lives in CUDA memory (torch CUDA tensor, CAI, DLPack on CUDA), else None.

    ``cuda``: the CUDA seam that asks the driver which device owns a CAI pointer;
    ``consumer``: the stream pyrt reads on, passed to ``__dlpack__(stream=...)`` so the
    producer orders its pending work before it (DLPack: 1 is the legacy default stream).
    """
    if isinstance(x, DeviceTensor):
        return DeviceInput(x.ptr, x.device, x.scalar_type, x.shape, x, x.stream)
    if is_torch_tensor(x):
        if not x.is_cuda:
            return None
        if not x.is_contiguous():
            x = x.contiguous()
        st = scalar_type_of_torch(x.dtype)
        if st is None:
            raise InputError(f"{what}: torch dtype {x.dtype} is not supported")
        device = int(x.device.index or 0)
        producer = None
        if consumer is not None:  # torch's pending work is on its current stream
            import torch

            producer = int(torch.cuda.current_stream(device).cuda_stream)
            reader = consumer(device)
            if producer == reader:
                producer = None
            else:  # torch's allocator must not hand the memory out again before pyrt's stream has read it
                x.record_stream(torch.cuda.ExternalStream(reader, device=x.device))
        return DeviceInput(int(x.data_ptr()), device, st, tuple(x.shape), x, producer)
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is not None:
        return _from_cai(cai, x, what, cuda)
    dl = getattr(x, "__dlpack_device__", None)
    if dl is not None:
        try:
            dev_type, dev_id = x.__dlpack_device__()
            on_cuda = int(dev_type) == _KDL_CUDA
            capsule = None
            if on_cuda:
                device = int(dev_id)
                if consumer is None:
                    capsule = x.__dlpack__()
                else:
                    handle = consumer(device)
                    capsule = x.__dlpack__(stream=handle if handle else 1)
        except PyrtError:
            raise
        except Exception as exc:  # the producer's methods may raise anything
            raise InputError(f"{what}: DLPack input could not be read: {type(exc).__name__}: {exc}") from None
        if on_cuda:
            return _from_dlpack_capsule(capsule, int(dev_id), what)
    return None


def _from_cai(cai: dict[str, Any], owner: Any, what: str, cuda: Any) -> DeviceInput:
    try:
        shape = tuple(int(d) for d in cai["shape"])
        dtype = np.dtype(cai["typestr"])
        ptr = int(cai["data"][0])
        stream = cai.get("stream")
        stream = None if stream is None else int(stream)
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{what}: malformed __cuda_array_interface__: {exc}") from None
    if stream == 0:
        raise InputError(f"{what}: __cuda_array_interface__ stream 0 is ambiguous (CAI v3: use 1 or 2)")
    strides = cai.get("strides")
    if strides is not None and tuple(strides) != c_strides(shape, dtype.itemsize):
        raise InputError(f"{what}: __cuda_array_interface__ input must be C-contiguous (strides {strides})")
    st = scalar_type_of_numpy(dtype)
    if st is None:
        raise InputError(f"{what}: dtype {dtype} is not supported")
    device = _device_of_pointer(cuda, ptr, what)
    return DeviceInput(ptr, device, st, shape, owner, stream)


def _device_of_pointer(cuda: Any, ptr: int, what: str) -> int:
    """The CUDA device owning ``ptr``, asked of the driver (InputError if it is not device memory)."""
    seam = cuda if cuda is not None else cuda_seam.current()
    try:
        attr = seam.driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
        return int(seam.call("cuPointerGetAttribute", attr, ptr))
    except DeviceError as exc:
        raise InputError(f"{what}: {ptr:#x} is not CUDA device memory the driver knows ({exc})") from None


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_DL_CODES = {(0, 8): "int8", (0, 16): "int16", (0, 32): "int32", (0, 64): "int64", (1, 8): "uint8",
             (1, 16): "uint16", (1, 32): "uint32", (1, 64): "uint64", (2, 16): "float16", (2, 32): "float32",
             (2, 64): "float64", (4, 16): "bfloat16", (6, 8): "bool"}


def _from_dlpack_capsule(capsule: Any, device: int, what: str) -> DeviceInput:
    """Read a (not consumed) ``dltensor`` capsule; the capsule stays alive as the owner."""
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    try:
        addr = get(capsule, b"dltensor")
    except ValueError as exc:
        raise InputError(f"{what}: __dlpack__ did not return a dltensor capsule: {exc}") from None
    t = _DLTensor.from_address(addr)  # DLManagedTensor starts with its DLTensor
    shape = tuple(t.shape[i] for i in range(t.ndim))
    name = _DL_CODES.get((t.dtype.code, t.dtype.bits))
    st = None if name is None else ScalarType.BFLOAT16 if name == "bfloat16" else scalar_type_of_numpy(np.dtype(name))
    if st is None or t.dtype.lanes != 1:
        raise InputError(f"{what}: DLPack dtype code {t.dtype.code} bits {t.dtype.bits} is not supported")
    if t.strides and tuple(t.strides[i] for i in range(t.ndim)) != c_strides(shape, 1):
        raise InputError(f"{what}: DLPack input must be C-contiguous")
    return DeviceInput(int(t.data or 0) + int(t.byte_offset), device, st, shape, capsule)


def device_output(t: DeviceTensor, kind: str) -> Any:
    """Hand a device tensor the caller now owns back as a torch CUDA tensor or itself."""
    if kind == TORCH:
        torch = sys.modules["torch"]
        return torch.as_tensor(t, device=f"cuda:{t.device}")
    return t
