"""Input binding: one setter per method input, built at load, that checks and binds the caller's value.

Planned host inputs are copied into their arena tensors (dynamic ones resized), unplanned ones
bound zero-copy where dtype and layout allow, inputs held in CUDA arenas copied in on the
run's stream after the work that produced them; scalars must equal what the program was
exported with. Every failure is an :class:`~pyrt.errors.InputError` naming the input.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pyrt.checks import is_int
from pyrt.errors import ExecutionError, InputError, PteFormatError, UnsupportedOperatorError
from pyrt.memory.host import NumpyHost, TorchHost
from pyrt.memory.interop import check_dense_torch, device_input, is_torch_tensor
from pyrt.memory.layout import numpy_dtype, scalar_type_of_torch
from pyrt.memory.table import CONSTANT, UNPLANNED, TensorInfo
from pyrt.memory.tensors import DeviceTensor
from pyrt.runtime.plan import MethodPlan
from pyrt.runtime.run_state import RunState, Setter, device_state


def input_failure(method: str, pos: int, x: Any, exc: Exception) -> InputError:
    """The InputError for an untyped failure while binding input ``pos`` (a meta or sparse tensor named as such)."""
    what = f"method {method!r} input {pos}"
    if is_torch_tensor(x):  # the torch fast path copies without looking first
        check_dense_torch(x, what)
    return InputError(f"{what}: {_describe(x)} cannot be used: {type(exc).__name__}: {exc}")


def _describe(x: Any) -> str:
    """A short description of a caller's input for error messages (never raises)."""
    try:
        if is_torch_tensor(x):
            return f"a torch tensor ({x.dtype}, layout {x.layout}, device {x.device})"
        return f"a {type(x).__name__}"
    except Exception:
        return "an input"


def input_setter(plan: MethodPlan, pos: int, i: int) -> Setter:
    table = plan.table
    kind = table.kinds[i]
    what = f"method {plan.name!r} input {pos}"
    if kind == "Tensor":
        info = table.infos[i]
        if info.device is not None:
            return _device_input_setter(plan, info, what)
        if info.storage == UNPLANNED:
            return _bind_input(plan, info, what)
        if info.storage == CONSTANT:
            raise PteFormatError(f"{what} (value {i}) is a constant tensor in the file; inputs come from the caller")
        return _copy_input(plan, info, what)
    expected = table.vals[i]

    def set_scalar(x: Any, state: RunState | None) -> None:
        _check_scalar(x, kind, expected, what)

    return set_scalar


def _check_scalar(x: Any, kind: str, expected: Any, what: str) -> None:
    ok = {
        "Int": is_int(x),
        "Double": is_int(x) or isinstance(x, (float, np.floating)),  # nan and inf too: the file's value decides
        "Bool": isinstance(x, (bool, np.bool_)),
        "String": isinstance(x, str),
        "Null": x is None,
    }.get(kind, False)
    if not ok:
        raise InputError(f"{what} must be a {kind} (the program was exported with {expected!r}), "
                         f"got {type(x).__name__}")
    if kind != "Null" and x != expected:
        raise InputError(f"{what}: the program was exported with the constant {expected!r}; got {x!r} "
                         f"(ExecuTorch specialises non-tensor inputs)")


def _check_tensor(st_dtype: np.dtype, shape: tuple[int, ...], info: TensorInfo, what: str) -> None:
    want = numpy_dtype(info.scalar_type)
    if st_dtype != want:
        raise InputError(f"{what} must be {info.scalar_type.dtype_name}, got {st_dtype}")
    if len(shape) != len(info.sizes):
        raise InputError(f"{what} must have rank {len(info.sizes)} (shape {info.sizes}), got shape {shape}")
    if not info.dynamic:
        if shape != info.sizes:
            raise InputError(f"{what} must have shape {info.sizes}, got {shape}")
    elif math.prod(shape) > info.capacity:
        raise InputError(f"{what}: shape {shape} exceeds the method's upper bound {info.sizes}")


def _np_dtype_of(x: Any) -> np.dtype:
    if isinstance(x, np.ndarray):
        return x.dtype
    st = scalar_type_of_torch(x.dtype)
    if st is None:
        raise InputError(f"torch dtype {x.dtype} is not supported")
    return numpy_dtype(st)


def _copy_input(plan: MethodPlan, info: TensorInfo, what: str) -> Setter:
    """Planned host input: check, then copy into its arena view (resizing dynamic ones)."""
    table, i = plan.table, info.index
    host = table.host
    static = not info.dynamic
    dst: Any = table.vals[i]  # the host's tensor (numpy or torch) this input is copied into
    want_torch = host.dtype(info.scalar_type) if isinstance(host, TorchHost) else None
    try:
        dst_np = host.to_numpy(dst) if static else None  # set exactly when static
        want_np = numpy_dtype(info.scalar_type)
    except UnsupportedOperatorError as exc:
        if want_torch is None:
            raise
        dst_np, want_np = None, None  # bfloat16, float8: only torch tensors can fill it
        no_numpy = f"{what}: a {info.scalar_type.name} input must be a CPU torch tensor ({exc})"
    sizes = info.sizes

    tensor_type = host.torch.Tensor if isinstance(host, TorchHost) else None

    rank, capacity = len(sizes), info.capacity

    def set_input(x: Any, state: RunState | None) -> None:
        if type(x) is tensor_type and not x.is_cuda:
            if static:
                if x.dtype is not want_torch or x.shape != sizes:
                    _check_tensor(_np_dtype_of(x), tuple(x.shape), info, what)
                dst.copy_(x.detach() if x.requires_grad else x)  # never let autograd reach the arena
                return
            if x.dtype is want_torch and x.dim() == rank and x.numel() <= capacity:  # a dynamic torch input
                if dst.shape != x.shape:
                    table.resize(i, x.shape)  # the same tensor object, resized in place
                dst.copy_(x.detach() if x.requires_grad else x)
                return
        if want_np is None:
            raise InputError(no_numpy)
        if isinstance(x, np.ndarray):
            arr = x
        else:
            dev = _caller_device_input(x, what, state)
            if dev is not None:
                arr = _device_to_host(dev, plan, what, state)
            else:
                arr = NumpyHost().from_caller(x, what, want_np)
        if dst_np is not None:
            if arr.dtype != want_np or arr.shape != sizes:
                _check_tensor(arr.dtype, arr.shape, info, what)
            np.copyto(dst_np, arr)
            return
        _check_tensor(arr.dtype, arr.shape, info, what)
        t = table.resize(i, arr.shape)
        np.copyto(host.to_numpy(t), arr)

    return set_input


def _bind_input(plan: MethodPlan, info: TensorInfo, what: str) -> Setter:
    """Unplanned host input: bind the caller's memory (zero-copy when dtype and layout allow)."""
    table, i = plan.table, info.index
    host = table.host
    vals = table.vals

    def bind(x: Any, state: RunState | None) -> None:
        dev = _caller_device_input(x, what, state)
        if dev is not None:
            x = _device_to_host(dev, plan, what, state)
        t: Any = host.from_caller(x, what)  # np.ndarray or torch.Tensor, per the host
        st = host.scalar_type(t)
        _check_tensor(numpy_dtype(st) if st is not None else np.dtype("V1"), tuple(t.shape), info, what)
        if isinstance(host, TorchHost):
            if not t.is_contiguous():
                t = t.contiguous()
        elif not t.flags.c_contiguous:
            t = np.ascontiguousarray(t)
        vals[i] = t

    return bind


def _caller_device_input(x: Any, what: str, state: RunState | None) -> Any:
    """``tensors.device_input`` with this run's CUDA seam and, for DLPack, its consumer stream."""
    if state is None:
        return device_input(x, what)
    consumer = state.ctx.consumer_handle if state.ctx is not None else None
    return device_input(x, what, state.cuda, consumer)


def _device_to_host(dev: Any, plan: MethodPlan, what: str, state: RunState | None) -> np.ndarray:
    """A caller's device input for a host tensor: copied after the work that produced it."""
    if is_torch_tensor(dev.owner):
        return dev.owner.detach().cpu().numpy()  # torch orders it after its own streams
    if state is None or state.cuda is None:
        raise ExecutionError(f"{what}: a device input, but the program was loaded without a CUDA seam")
    seam = state.cuda
    out = np.empty(dev.shape, dtype=numpy_dtype(dev.scalar_type))
    src = seam.borrow(dev.ptr, dev.nbytes, dev.device)
    if state.ctx is None:
        seam.synchronize(dev.device)  # a host-only method: nothing of ours to order against
        seam.memcpy_dtoh(out, src)
        return out
    stream = state.ctx.stream(dev.device)
    if dev.stream is not None:
        state.ctx.wait_for(dev.stream, dev.device, stream)  # the producer first, then the copy out
    seam.memcpy_dtoh(out, src, stream=stream)
    stream.synchronize()  # the host reads the copy next
    return out


def _device_input_setter(plan: MethodPlan, info: TensorInfo, what: str) -> Setter:
    """Input held in a CUDA arena: copy the caller's host or device data into it."""
    table, i = plan.table, info.index

    def set_device(x: Any, run: RunState | None) -> None:
        state = device_state(run)
        dst: DeviceTensor = table.vals[i]  # type: ignore[assignment]  # planned in device memory
        seam = state.ctx.cuda
        stream = state.ctx.stream(dst.device)  # after this method's earlier work on that device
        dev = _caller_device_input(x, what, state)
        if dev is not None:
            if dev.stream is not None:
                state.ctx.wait_for(dev.stream, dev.device, stream)  # the producer first, then the copy in
            _check_tensor(numpy_dtype(dev.scalar_type), dev.shape, info, what)
            if info.dynamic:
                dst.resize(dev.shape, what)
            src = seam.borrow(dev.ptr, dev.nbytes, dev.device)
            state.keepalive.append(dev.owner)
            if dev.device == dst.device:
                seam.memcpy_dtod(dst.allocation, src, dev.nbytes, dst_offset=dst.offset, stream=stream)
            else:
                seam.memcpy_peer(dst.allocation, src, dev.nbytes, dst_offset=dst.offset, stream=stream)
            return
        arr = np.ascontiguousarray(NumpyHost().from_caller(x, what, numpy_dtype(info.scalar_type)))
        _check_tensor(arr.dtype, arr.shape, info, what)
        if info.dynamic:
            dst.resize(arr.shape, what)
        if arr.nbytes:
            state.ctx.copy_to_device(dst.allocation, arr, stream, dst_offset=dst.offset)

    return set_device


__all__ = ["input_failure", "input_setter"]
