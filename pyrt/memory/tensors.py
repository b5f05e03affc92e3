"""Tensor representation for the runtime: host backends, device tensors, caller interop.

Host tensors live in one of two *host backends*: :class:`TorchHost` (torch
tensors, used when torch kernels run) or :class:`NumpyHost` (numpy arrays).
Both build zero-copy views into byte arenas and into the file's mmap
(constants are read-only). Device memory is a :class:`DeviceTensor`: a typed
window into a :class:`pyrt.cuda.DeviceAllocation` that exports
``__cuda_array_interface__``.

Callers hand in numpy arrays, torch tensors, or anything with ``__dlpack__`` /
``__cuda_array_interface__``; :func:`caller_kind` remembers which so outputs go
back in the same kind. Nothing here imports torch unless the caller already
did, or the torch host backend was chosen.

>>> import numpy as np
>>> host = NumpyHost()
>>> arena = host.arena(64)
>>> v = host.view(arena, 16, ScalarType.FLOAT, (2, 2), (0, 1))
>>> v[:] = 1.5; float(np.frombuffer(arena, np.float32)[4])
1.5
"""

from __future__ import annotations

import ctypes
import functools
import math
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias, Union

import numpy as np

from pyrt import cuda as cuda_seam
from pyrt.errors import DeviceError, InputError, PyrtError, UnsupportedOperatorError
from pyrt.format.dtypes import ScalarType

if TYPE_CHECKING:  # annotations only: the runtime path never imports torch itself
    import torch

# -- dtypes ----------------------------------------------------------------------------------------

_NUMPY_NAMES = {
    ScalarType.BYTE: "uint8", ScalarType.CHAR: "int8", ScalarType.SHORT: "int16", ScalarType.INT: "int32",
    ScalarType.LONG: "int64", ScalarType.HALF: "float16", ScalarType.FLOAT: "float32",
    ScalarType.DOUBLE: "float64", ScalarType.BOOL: "bool", ScalarType.UINT16: "uint16",
    ScalarType.UINT32: "uint32", ScalarType.UINT64: "uint64",
}
_TORCH_NAMES = {
    ScalarType.BYTE: "uint8", ScalarType.CHAR: "int8", ScalarType.SHORT: "int16", ScalarType.INT: "int32",
    ScalarType.LONG: "int64", ScalarType.HALF: "float16", ScalarType.FLOAT: "float32",
    ScalarType.DOUBLE: "float64", ScalarType.BOOL: "bool", ScalarType.BFLOAT16: "bfloat16",
    ScalarType.UINT16: "uint16", ScalarType.UINT32: "uint32", ScalarType.UINT64: "uint64",
    ScalarType.FLOAT8E5M2: "float8_e5m2", ScalarType.FLOAT8E4M3FN: "float8_e4m3fn",
}


def numpy_dtype(st: ScalarType) -> np.dtype:
    """The numpy dtype of an ExecuTorch scalar type (bfloat16 through ml_dtypes when installed)."""
    name = _NUMPY_NAMES.get(st)
    if name is not None:
        return np.dtype(name)
    if st == ScalarType.BFLOAT16:
        try:
            import ml_dtypes  # noqa: PLC0415 - optional

            return np.dtype(ml_dtypes.bfloat16)
        except ImportError:
            pass
    raise UnsupportedOperatorError(f"scalar type {st.name} has no numpy equivalent")


def scalar_type_of_numpy(dtype: np.dtype) -> ScalarType | None:
    for st, name in _NUMPY_NAMES.items():
        if dtype == np.dtype(name):
            return st
    return ScalarType.BFLOAT16 if dtype.name == "bfloat16" else None


def torch_dtype(st: ScalarType) -> Any:
    import torch

    name = _TORCH_NAMES.get(st)
    dtype = getattr(torch, name, None) if name else None
    if dtype is None:
        raise UnsupportedOperatorError(f"scalar type {st.name} has no torch equivalent")
    return dtype


def scalar_type_of_torch(dtype: Any) -> ScalarType | None:
    name = str(dtype).removeprefix("torch.")
    for st, tname in _TORCH_NAMES.items():
        if tname == name:
            return st
    return None


def dim_order_strides(sizes: Sequence[int], dim_order: Sequence[int]) -> tuple[int, ...]:
    """Element strides of a dense tensor laid out in ``dim_order`` (outermost first).

    >>> dim_order_strides((1, 3, 4, 4), (0, 2, 3, 1))
    (48, 1, 12, 3)
    """
    order = tuple(dim_order) or tuple(range(len(sizes)))
    strides = [0] * len(sizes)
    step = 1
    for d in reversed(order):
        strides[d] = step
        step *= max(sizes[d], 1)
    return tuple(strides)


@functools.lru_cache(maxsize=1024)
def strides_of(sizes: tuple[int, ...], dim_order: tuple[int, ...]) -> tuple[int, ...]:
    """:func:`dim_order_strides` of hashable arguments, remembered (a model repeats a few layouts)."""
    return dim_order_strides(sizes, dim_order)


# One window of a memory arena: (byte offset, scalar type, sizes, dim order), already validated.
Window = tuple[int, ScalarType, tuple[int, ...], tuple[int, ...]]
# One constant: (its bytes in the file, scalar type, sizes, dim order).
Constant = tuple[memoryview, ScalarType, tuple[int, ...], tuple[int, ...]]


def _whole_elements(arena: Any, itemsize: int) -> Any:
    """The arena's leading bytes that hold whole ``itemsize``-byte elements (a view)."""
    n = len(arena)
    return arena[: n - n % itemsize] if n % itemsize else arena


def is_contiguous_order(dim_order: Sequence[int]) -> bool:
    return tuple(dim_order) == tuple(range(len(dim_order)))


# -- device tensors --------------------------------------------------------------------------------


class DeviceTensor:
    """A typed, resizable window ``[offset, offset + capacity bytes)`` of device memory.

    ``shape`` may change between runs within ``capacity`` elements (dynamic
    shapes); ``ptr`` is the device address. Exports ``__cuda_array_interface__``
    (v3), so torch / cupy can wrap it without a copy.
    """

    __slots__ = ("allocation", "offset", "scalar_type", "shape", "capacity", "dim_order", "keepalive", "stream")

    def __init__(self, allocation: Any, offset: int, scalar_type: ScalarType, shape: tuple[int, ...],
                 capacity: int, dim_order: tuple[int, ...] = (), keepalive: Any = None) -> None:
        self.allocation = allocation
        self.offset = offset
        self.scalar_type = scalar_type
        self.shape = tuple(shape)
        self.capacity = capacity
        self.dim_order = dim_order or tuple(range(len(shape)))
        self.keepalive = keepalive
        self.stream: int | None = None  # the stream that last wrote it, when consumers must wait

    @property
    def device(self) -> int:
        return int(self.allocation.device)

    @property
    def ptr(self) -> int:
        return int(self.allocation.ptr) + self.offset

    @property
    def dtype(self) -> str:
        return self.scalar_type.dtype_name

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.scalar_type.itemsize

    def resize(self, shape: Sequence[int], what: str) -> None:
        shape = tuple(int(d) for d in shape)
        if math.prod(shape) > self.capacity:
            raise InputError(f"{what}: shape {shape} needs {math.prod(shape)} elements, "
                             f"more than its memory-planned bound of {self.capacity}")
        self.shape = shape

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        dtype = numpy_dtype(self.scalar_type)
        strides = None
        if not is_contiguous_order(self.dim_order):
            strides = tuple(s * dtype.itemsize for s in dim_order_strides(self.shape, self.dim_order))
        cai = {"shape": self.shape, "typestr": dtype.str, "data": (self.ptr, False), "version": 3,
               "strides": strides}
        if self.stream:
            cai["stream"] = self.stream
        return cai

    def __repr__(self) -> str:
        return f"DeviceTensor(shape={self.shape}, dtype={self.dtype}, device=cuda:{self.device}, ptr={self.ptr:#x})"


class OwnedDeviceTensor(DeviceTensor):
    """A device tensor that owns its allocation and frees it when garbage-collected."""

    __slots__ = ()

    def __del__(self) -> None:
        try:
            self.allocation.free()
        except Exception:  # interpreter shutdown or a closed fake driver: nothing to report to
            pass


class OutputTensor(OwnedDeviceTensor):
    """An owned device tensor made positionally, in one step: one per output per graph replay.

    ``OutputTensor(allocation, scalar_type, shape, capacity, dim_order, stream)`` takes the
    fields as they are (a planned output's, already normalised) at offset 0 of ``allocation``.
    """

    __slots__ = ()

    def __init__(self, allocation: Any, scalar_type: ScalarType, shape: tuple[int, ...],
                 capacity: int, dim_order: tuple[int, ...], stream: int | None) -> None:
        self.allocation = allocation
        self.offset = 0
        self.scalar_type = scalar_type
        self.shape = shape
        self.capacity = capacity
        self.dim_order = dim_order
        self.keepalive = None
        self.stream = stream


# -- what a value slot holds ----------------------------------------------------------------------

# A host tensor: a numpy array, or a torch tensor when torch kernels run (torch named in annotations only).
HostTensor: TypeAlias = Union[np.ndarray, "torch.Tensor"]
# One slot of a method's value table (``ValueTable.vals``): a host or device tensor, a scalar, a
# string, None (unset, or an absent optional), or a list of those (int/bool/double/tensor lists).
Value: TypeAlias = HostTensor | DeviceTensor | int | float | bool | str | None | list["Value"]


# -- caller inputs -----------------------------------------------------------------------------------

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
    if strides is not None and tuple(strides) != _c_strides(shape, dtype.itemsize):
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
    if t.strides and tuple(t.strides[i] for i in range(t.ndim)) != _c_strides(shape, 1):
        raise InputError(f"{what}: DLPack input must be C-contiguous")
    return DeviceInput(int(t.data or 0) + int(t.byte_offset), device, st, shape, capsule)


def _c_strides(shape: Sequence[int], itemsize: int) -> tuple[int, ...]:
    out, step = [], itemsize
    for d in reversed(shape):
        out.append(step)
        step *= max(d, 1)
    return tuple(reversed(out))


# -- host backends ---------------------------------------------------------------------------------


class NumpyHost:
    """Host tensors as numpy arrays."""

    name = NUMPY

    def arena(self, nbytes: int) -> np.ndarray:
        return np.zeros(nbytes, dtype=np.uint8)  # zeroed, like ExecuTorch's planned memory

    def view(self, arena: np.ndarray, offset: int, st: ScalarType, sizes: Sequence[int],
             dim_order: Sequence[int]) -> np.ndarray:
        dtype = numpy_dtype(st)
        n = math.prod(sizes)
        flat = arena[offset: offset + n * dtype.itemsize].view(dtype)
        return _np_layout(flat, sizes, dim_order)

    def views(self, arena: np.ndarray, windows: Sequence[Window]) -> list[np.ndarray]:
        """:meth:`view` of many windows of one arena (validated), each dtype's flat view made once."""
        typed: dict[ScalarType, np.ndarray] = {}
        out = []
        for offset, st, sizes, dim_order in windows:
            flat = typed.get(st)
            if flat is None:
                flat = typed[st] = _whole_elements(arena, st.itemsize).view(numpy_dtype(st))
            start = offset // st.itemsize
            out.append(_np_layout(flat[start: start + math.prod(sizes)], sizes, dim_order))
        return out

    def constant(self, data: memoryview, st: ScalarType, sizes: Sequence[int],
                 dim_order: Sequence[int]) -> np.ndarray:
        flat = np.frombuffer(data, dtype=numpy_dtype(st), count=math.prod(sizes))
        return _np_layout(flat, sizes, dim_order)  # read-only: the mmap is

    def constants(self, items: Sequence[Constant]) -> list[np.ndarray]:
        """:meth:`constant` of each ``(data, scalar type, sizes, dim order)``."""
        return [self.constant(*item) for item in items]

    def empty(self, st: ScalarType, sizes: Sequence[int], dim_order: Sequence[int] = ()) -> np.ndarray:
        return self.view(self.arena(math.prod(sizes) * st.itemsize), 0, st, sizes, dim_order)

    def from_caller(self, x: Any, what: str, dtype: np.dtype | None = None) -> np.ndarray:
        """A host numpy array for caller input ``x`` (zero-copy where possible).

        ``dtype`` applies only to inputs that are not arrays already (lists, scalars).
        """
        if isinstance(x, np.ndarray):
            return x
        if is_torch_tensor(x):
            check_dense_torch(x, what)
            if x.requires_grad:
                x = x.detach()
            try:
                return x.numpy()
            except (TypeError, RuntimeError) as exc:  # bfloat16 and friends
                raise InputError(f"{what}: cannot view torch {x.dtype} as numpy: {exc}") from None
        if hasattr(x, "__dlpack__"):
            try:
                return np.from_dlpack(x)
            except Exception as exc:  # the producer's __dlpack__ may raise anything
                raise InputError(f"{what}: DLPack input could not be read on the host: "
                                 f"{type(exc).__name__}: {exc}") from None
        try:
            return np.asarray(x, dtype=dtype)
        except (TypeError, ValueError) as exc:
            raise InputError(f"{what}: cannot convert {type(x).__name__} to an array: {exc}") from None

    def scalar_type(self, t: np.ndarray) -> ScalarType | None:
        return scalar_type_of_numpy(t.dtype)

    def to_numpy(self, t: np.ndarray) -> np.ndarray:
        return t


class TorchHost:
    """Host tensors as torch tensors sharing memory with numpy byte arenas."""

    name = TORCH

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self._dtypes: dict[ScalarType, Any] = {}

    def dtype(self, st: ScalarType) -> Any:
        d = self._dtypes.get(st)
        if d is None:
            d = self._dtypes[st] = torch_dtype(st)
        return d

    def arena(self, nbytes: int) -> Any:
        # numpy-owned memory: torch cannot grow this storage, so a kernel resizing an
        # out tensor past the arena fails instead of silently detaching it from the plan.
        return self.torch.from_numpy(np.zeros(nbytes, dtype=np.uint8))

    def view(self, arena: Any, offset: int, st: ScalarType, sizes: Sequence[int], dim_order: Sequence[int]) -> Any:
        n = math.prod(sizes)
        flat = arena[offset: offset + n * st.itemsize].view(self.dtype(st))
        return flat.as_strided(tuple(sizes), dim_order_strides(sizes, dim_order))

    def views(self, arena: Any, windows: Sequence[Window]) -> list[Any]:
        """:meth:`view` of many windows of one arena (validated): one ``as_strided`` each."""
        typed: dict[ScalarType, Any] = {}
        out = []
        for offset, st, sizes, dim_order in windows:
            flat = typed.get(st)
            if flat is None:
                flat = typed[st] = _whole_elements(arena, st.itemsize).view(self.dtype(st))
            out.append(flat.as_strided(sizes, strides_of(sizes, dim_order), offset // st.itemsize))
        return out

    def constant(self, data: memoryview, st: ScalarType, sizes: Sequence[int], dim_order: Sequence[int]) -> Any:
        return self.constants([(data, st, tuple(sizes), tuple(dim_order))])[0]

    def constants(self, items: Sequence[Constant]) -> list[Any]:
        """:meth:`constant` of each ``(data, scalar type, sizes, dim order)``, under one warnings filter."""
        out = []
        with warnings.catch_warnings():  # read-only mmap: kernels never write constants
            warnings.simplefilter("ignore")
            for data, st, sizes, dim_order in items:
                n = math.prod(sizes)
                if n == 0:
                    out.append(self.torch.empty(sizes, dtype=self.dtype(st)))
                    continue
                flat = self.torch.frombuffer(data, dtype=self.dtype(st), count=n)
                out.append(flat.as_strided(sizes, strides_of(sizes, dim_order)))
        return out

    def empty(self, st: ScalarType, sizes: Sequence[int], dim_order: Sequence[int] = ()) -> Any:
        t = self.torch.empty(tuple(sizes), dtype=self.dtype(st))
        if dim_order and not is_contiguous_order(dim_order):
            t = t.as_strided(tuple(sizes), dim_order_strides(sizes, dim_order))
        return t

    def from_caller(self, x: Any, what: str) -> Any:
        torch = self.torch
        if isinstance(x, torch.Tensor):
            check_dense_torch(x, what)
            return x.detach() if x.requires_grad else x
        if isinstance(x, np.ndarray):
            return _torch_from_numpy(torch, x, what)
        if hasattr(x, "__dlpack__"):
            try:
                t = torch.from_dlpack(x)
            except Exception as exc:  # the producer's __dlpack__ may raise anything
                raise InputError(f"{what}: DLPack input could not be read: {type(exc).__name__}: {exc}") from None
            check_dense_torch(t, what)
            return t
        return _torch_from_numpy(torch, NumpyHost().from_caller(x, what), what)

    def scalar_type(self, t: Any) -> ScalarType | None:
        return scalar_type_of_torch(t.dtype)

    def to_numpy(self, t: Any) -> np.ndarray:
        return torch_to_numpy(t)


def _torch_from_numpy(torch: Any, x: np.ndarray, what: str) -> Any:
    try:
        with warnings.catch_warnings():  # read-only arrays: pyrt only reads inputs
            warnings.simplefilter("ignore")
            return torch.from_numpy(x)
    except TypeError as exc:
        raise InputError(f"{what}: numpy dtype {x.dtype} is not supported by torch: {exc}") from None


def _np_layout(flat: np.ndarray, sizes: Sequence[int], dim_order: Sequence[int]) -> np.ndarray:
    sizes = tuple(sizes)
    if not dim_order or is_contiguous_order(dim_order):
        return flat.reshape(sizes)
    strides = tuple(s * flat.itemsize for s in dim_order_strides(sizes, dim_order))
    return np.lib.stride_tricks.as_strided(flat, sizes, strides, writeable=flat.flags.writeable)


def host_backend(name: str) -> NumpyHost | TorchHost:
    return TorchHost() if name == TORCH else NumpyHost()


# -- outputs -----------------------------------------------------------------------------------------


def host_output(t: Any, kind: str) -> Any:
    """A copy of host tensor ``t`` in the caller's kind (torch in -> torch out, else numpy)."""
    if isinstance(t, np.ndarray):
        arr = np.array(t, copy=True)
        if kind == TORCH:
            return sys.modules["torch"].from_numpy(arr)
        return arr
    if kind == TORCH:
        return t.clone()
    return np.array(torch_to_numpy(t), copy=True)


def torch_to_numpy(t: Any) -> np.ndarray:
    """``t.numpy()`` (shared memory); a dtype numpy cannot hold is an UnsupportedOperatorError."""
    try:
        return t.numpy()
    except (TypeError, RuntimeError) as exc:
        raise UnsupportedOperatorError(f"{t.dtype} tensors have no numpy equivalent ({exc}); "
                                       f"call with torch tensors to get torch outputs") from None


def device_output(t: DeviceTensor, kind: str) -> Any:
    """Hand a device tensor the caller now owns back as a torch CUDA tensor or itself."""
    if kind == TORCH:
        torch = sys.modules["torch"]
        return torch.as_tensor(t, device=f"cuda:{t.device}")
    return t
