"""Host backends: numpy or torch host tensors as zero-copy views of byte arenas and the file.

Host tensors live in one of two *host backends*: :class:`TorchHost` (torch
tensors, used when torch kernels run) or :class:`NumpyHost` (numpy arrays).
Both build zero-copy views into byte arenas and into the file's mmap
(constants are read-only), and turn caller inputs into their kind;
:func:`host_output` copies a host result back in the caller's kind.
Nothing here imports torch unless the torch host backend was chosen.

>>> import numpy as np
>>> host = NumpyHost()
>>> arena = host.arena(64)
>>> v = host.view(arena, 16, ScalarType.FLOAT, (2, 2), (0, 1))
>>> v[:] = 1.5; float(np.frombuffer(arena, np.float32)[4])
1.5
"""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from pyrt.errors import InputError, UnsupportedOperatorError
from pyrt.format.dtypes import ScalarType
from pyrt.memory.interop import NUMPY, TORCH, check_dense_torch, is_torch_tensor
from pyrt.memory.layout import (
    Constant,
    Window,
    dim_order_strides,
    is_contiguous_order,
    numpy_dtype,
    scalar_type_of_numpy,
    scalar_type_of_torch,
    strides_of,
    torch_dtype,
)


def _whole_elements(arena: Any, itemsize: int) -> Any:
    """The arena's leading bytes that hold whole ``itemsize``-byte elements (a view)."""
    n = len(arena)
    return arena[: n - n % itemsize] if n % itemsize else arena


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
    """``t.numpy()`` (shared memory; bfloat16 as ml_dtypes' when it is installed); a dtype numpy cannot
    hold is an UnsupportedOperatorError."""
    try:
        return t.numpy()
    except (TypeError, RuntimeError) as exc:
        torch = sys.modules["torch"]
        if t.dtype == torch.bfloat16:
            try:
                return t.view(torch.int16).numpy().view(numpy_dtype(ScalarType.BFLOAT16))  # the same bits
            except UnsupportedOperatorError:
                pass  # no ml_dtypes
        raise UnsupportedOperatorError(f"{t.dtype} tensors have no numpy equivalent ({exc}); "
                                       f"call with torch tensors to get torch outputs") from None
