"""The reference executor's tensor libraries: torch.ops.aten when torch imports, else a numpy
core set that refuses every other operator by name.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from pyrt.errors import PyrtError, UnsupportedOperatorError
from pyrt.sim.refengine.model import (
    RefEngineExecutionError,
    RefWeight,
)


class Backend:
    """What the executor needs from a tensor library (torch or numpy)."""

    name = ""

    def call(self, target: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        raise NotImplementedError

    def dtype(self, value: Any) -> str:
        raise NotImplementedError

    def dtype_object(self, name: str) -> Any:
        raise NotImplementedError

    def memory_format(self, name: str) -> Any:
        return None  # numpy arrays are always contiguous copies

    def tensor(self, value: Any) -> Any:
        raise NotImplementedError

    def from_raw(self, raw: np.ndarray, dtype: str, shape: Sequence[int]) -> Any:
        raise NotImplementedError

    def to_raw(self, value: Any) -> tuple[np.ndarray, tuple[int, ...]]:
        raise NotImplementedError

    def weight(self, w: RefWeight, *, meta: bool = False) -> Any:
        raise NotImplementedError

    def empty(self, shape: tuple[int, ...], dtype: str, *, meta: bool) -> Any:
        raise NotImplementedError


_TORCH_LOCK = threading.Lock()
_TORCH: list[Backend | ImportError] = []  # the one torch backend of the process, or why torch did not import


def _torch_backend() -> Backend:
    """The process's torch backend, made once: torch's first import runs under a lock.

    Runs on several threads (a served Program's replicas, the fake GPU's worker) may ask for
    it at the same moment; only one thread imports torch, the others wait for the finished module.
    """
    if not _TORCH:
        with _TORCH_LOCK:
            if not _TORCH:
                try:
                    _TORCH.append(_TorchBackend())
                except ImportError as exc:
                    _TORCH.append(exc)
    found = _TORCH[0]
    if isinstance(found, ImportError):
        raise found
    return found


def pick_backend(choice: str) -> Backend:
    if choice not in ("auto", "torch", "numpy"):
        raise PyrtError(f"reference executor backend must be 'auto', 'torch' or 'numpy', got {choice!r}")
    if choice in ("auto", "torch"):
        try:
            return _torch_backend()
        except ImportError:
            if choice == "torch":
                raise
    return _NumpyBackend()


def split_target(target: str) -> tuple[str, str, str]:
    namespace, _, rest = target.partition("::")
    op, _, overload = rest.partition(".")
    return namespace, op, overload or "default"


class _TorchBackend(Backend):
    name = "torch"

    def __init__(self) -> None:
        import torch

        self.torch = torch

    def dtype_object(self, name: str) -> Any:
        return getattr(self.torch, name)

    def memory_format(self, name: str) -> Any:
        return getattr(self.torch, name)

    def dtype(self, value: Any) -> str:
        return str(value.dtype).removeprefix("torch.")

    def tensor(self, value: Any) -> Any:
        return value if isinstance(value, self.torch.Tensor) else self.torch.from_numpy(np.asarray(value))

    def from_raw(self, raw: np.ndarray, dtype: str, shape: Sequence[int]) -> Any:
        if not np.size(raw):  # an empty tensor (nonzero found nothing): a 0-byte view cannot change dtype
            return self.torch.empty(tuple(shape), dtype=self.dtype_object(dtype))
        flat = self.torch.from_numpy(np.array(raw, dtype=np.uint8, copy=True))
        return flat.view(self.dtype_object(dtype)).reshape(tuple(shape))

    def to_raw(self, value: Any) -> tuple[np.ndarray, tuple[int, ...]]:
        t = value.detach().contiguous()
        return t.reshape(-1).view(self.torch.uint8).numpy(), tuple(t.shape)

    def weight(self, w: RefWeight, *, meta: bool = False) -> Any:
        if meta:
            return self.empty(w.shape, w.dtype, meta=True)
        return self.from_raw(np.frombuffer(w.data, dtype=np.uint8), w.dtype, w.shape)

    def empty(self, shape: tuple[int, ...], dtype: str, *, meta: bool) -> Any:
        device = "meta" if meta else "cpu"
        return self.torch.zeros(shape, dtype=self.dtype_object(dtype), device=device)

    def call(self, target: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        namespace, op, overload = split_target(target)
        try:
            fn = getattr(getattr(getattr(self.torch.ops, namespace), op), overload)
        except (AttributeError, RuntimeError) as exc:
            raise UnsupportedOperatorError(f"reference executor: torch has no operator {target!r}") from exc
        try:
            return fn(*args, **kwargs)
        except (RuntimeError, TypeError, ValueError, IndexError) as exc:
            raise RefEngineExecutionError(f"{target} failed: {exc}") from exc


def _binary(fn: Any) -> Any:
    def run(a: Any, b: Any, alpha: Any = 1) -> Any:
        return fn(a, b if alpha == 1 else b * alpha)

    return run


def _reduce(fn: Any) -> Any:
    def run(x: Any, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Any:
        axis = tuple(dim) if isinstance(dim, list) and dim else (None if dim in (None, []) else dim)
        out = fn(x, axis=axis, keepdims=keepdim)
        return np.asarray(out, dtype=dtype or (x.dtype if x.dtype.kind == "f" else None))

    return run


def _scaled(x: Any, factor: Any) -> Any:
    return x if factor == 1 else x * factor


def _true_div(a: Any, b: Any) -> Any:
    out = np.true_divide(a, b)
    kinds = {np.asarray(v).dtype.kind for v in (a, b)}
    return out.astype(np.float32) if kinds <= {"i", "u", "b"} else out


NUMPY_OPS: dict[str, Any] = {
    "add.Tensor": _binary(np.add), "add.Scalar": _binary(np.add),
    "sub.Tensor": lambda a, b, alpha=1: np.subtract(a, b if alpha == 1 else b * alpha),
    "sub.Scalar": lambda a, b, alpha=1: np.subtract(a, b if alpha == 1 else b * alpha),
    "mul.Tensor": np.multiply, "mul.Scalar": np.multiply,
    "div.Tensor": _true_div, "div.Scalar": _true_div,
    "relu.default": lambda x: np.maximum(x, np.zeros((), x.dtype)),
    "sigmoid.default": lambda x: (1 / (1 + np.exp(-x))).astype(x.dtype),
    "tanh.default": np.tanh,
    "mm.default": np.matmul, "matmul.default": np.matmul, "bmm.default": np.matmul,
    "addmm.default": lambda bias, a, b, beta=1, alpha=1: _scaled(bias, beta) + _scaled(a @ b, alpha),
    "linear.default": lambda x, w, b=None: x @ w.T if b is None else x @ w.T + b,
    "permute.default": lambda x, dims: np.transpose(x, dims),
    "t.default": lambda x: x.T,
    "transpose.int": lambda x, a, b: np.swapaxes(x, a, b),
    "view.default": lambda x, shape: np.reshape(x, shape),
    "reshape.default": lambda x, shape: np.reshape(x, shape),
    "_unsafe_view.default": lambda x, shape: np.reshape(x, shape),
    "cat.default": lambda tensors, dim=0: np.concatenate(tensors, axis=dim),
    "sum.default": lambda x, dtype=None: _reduce(np.sum)(x, None, False, dtype),
    "sum.dim_IntList": _reduce(np.sum),
    "mean.default": lambda x, dtype=None: _reduce(np.mean)(x, None, False, dtype),
    "mean.dim": _reduce(np.mean),
    "clone.default": lambda x, memory_format=None: np.array(x, copy=True),
    "slice.Tensor": lambda x, dim=0, start=None, end=None, step=1: x[
        (slice(None),) * (dim % x.ndim) + (slice(start, end, step),)],  # a view: big weights stay untouched
    "sym_size.int": lambda x, dim: int(np.shape(x)[dim]),
}


class _NumpyBackend(Backend):
    """The numpy core set, for machines without torch; refuses anything else by name."""

    name = "numpy"

    def dtype_object(self, name: str) -> Any:
        return np.dtype(self._np_name(name))

    @staticmethod
    def _np_name(dtype: str) -> str:
        if dtype == "bfloat16":
            raise UnsupportedOperatorError("reference executor: numpy cannot hold bfloat16 (install torch)")
        return dtype

    def dtype(self, value: Any) -> str:
        return np.asarray(value).dtype.name

    def tensor(self, value: Any) -> Any:
        return np.asarray(value)

    def from_raw(self, raw: np.ndarray, dtype: str, shape: Sequence[int]) -> Any:
        return np.frombuffer(bytes(raw), dtype=self._np_name(dtype)).reshape(tuple(shape))

    def to_raw(self, value: Any) -> tuple[np.ndarray, tuple[int, ...]]:
        arr = np.asarray(value, order="C")
        return arr.reshape(-1).view(np.uint8), tuple(arr.shape)

    def weight(self, w: RefWeight, *, meta: bool = False) -> Any:
        return np.frombuffer(w.data, dtype=self._np_name(w.dtype)).reshape(w.shape)

    def empty(self, shape: tuple[int, ...], dtype: str, *, meta: bool) -> Any:
        return np.zeros(shape, dtype=self._np_name(dtype))

    def call(self, target: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        namespace, op, overload = split_target(target)
        fn = NUMPY_OPS.get(f"{op}.{overload}") if namespace == "aten" else None
        if fn is None:
            raise UnsupportedOperatorError(
                f"reference executor (numpy, torch not installed) cannot run {target!r}; "
                f"it runs aten::{{{', '.join(sorted(NUMPY_OPS))}}}"
            )
        try:
            out = fn(*args, **kwargs)
            return out if isinstance(out, int) else np.asarray(out)
        except (ValueError, TypeError, IndexError) as exc:
            raise RefEngineExecutionError(f"{target} failed: {exc}") from exc
