"""Run a planned method: bind inputs, walk the instruction chain, hand outputs back.

The hot loop is a ``for`` over precomputed step closures (straight-line
chains) or a program counter over the same steps when the chain jumps
(``JumpFalseCall``). Inputs are copied into their memory-planned tensors (or
bound zero-copy when the file did not plan them); outputs are copied out in
the kind the caller used (torch in -> torch out, numpy in -> numpy out) and
arranged like the method's pytree output when that is a plain tuple/list.

>>> runner = MethodRunner(plan, default_kind="numpy")          # doctest: +SKIP
>>> runner((x, y), stream=None)                                 # doctest: +SKIP
"""

from __future__ import annotations

import math
import operator
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import numpy as np

from pyrt.cuda import DeviceAllocation
from pyrt.errors import (
    ExecutionError,
    InputError,
    ProgramClosedError,
    PteFormatError,
    PyrtError,
    UnsupportedOperatorError,
)
from pyrt.format.pytree import input_flattener, output_builder
from pyrt.kernels.base import noop
from pyrt.memory.host import NumpyHost, TorchHost, host_output, torch_to_numpy
from pyrt.memory.interop import (
    CAI,
    NUMPY,
    TORCH,
    caller_kind,
    check_dense_torch,
    device_input,
    device_output,
    is_torch_tensor,
)
from pyrt.memory.layout import numpy_dtype, scalar_type_of_torch
from pyrt.memory.table import CONSTANT, PLANNED, UNPLANNED, TensorInfo
from pyrt.memory.tensors import DeviceTensor, OwnedDeviceTensor
from pyrt.runtime.cuda_graphs import Segment, segment_steps
from pyrt.runtime.graph_forward import graph_forward
from pyrt.runtime.plan import Instr, MethodPlan
from pyrt.runtime.steady import shape_key, steady_chain

Setter = Callable[[Any, "RunState | None"], None]
Getter = Callable[[str, "RunState | None"], Any]


class RunState:
    """Per-run facts for device work: the caller's stream, streams in use, objects to keep alive.

    ``device_caller``: some input lives in CUDA memory, so device outputs stay on the device.
    """

    __slots__ = ("stream", "keepalive", "streams", "device_caller", "ctx", "cuda")

    def __init__(self, stream: Any = None, inputs: Sequence[Any] = (), ctx: Any = None, cuda: Any = None) -> None:
        self.stream = stream
        self.ctx = ctx  # pyrt.runtime.delegates.DeviceContext: stream(device) orders every copy of the run
        self.cuda = ctx.cuda if ctx is not None else cuda  # the CUDA seam the program was loaded with
        self.keepalive: list[Any] = []
        self.streams: dict[int, Any] = {}
        self.device_caller = any(caller_kind(x) == CAI or (is_torch_tensor(x) and x.is_cuda) for x in inputs)


class MethodRunner:
    """Callable that runs one planned method; not re-entrant: runs take turns on ``_lock``.

    ``closed`` is set (under the lock) when the Program is closed; a run that was
    waiting for the lock then raises ProgramClosedError instead of touching freed memory.
    """

    def __init__(self, plan: MethodPlan, *, default_kind: str, devices: Any = None, cuda: Any = None,
                 cuda_graphs: bool = False, graph_outputs: str = "copy") -> None:
        self.plan = plan
        self.cuda = devices.cuda if devices is not None else cuda  # for device inputs of host-only methods
        self.name = plan.name
        self.default_kind = default_kind
        self.devices = devices  # pyrt.runtime.delegates.DeviceContext when the method touches CUDA
        self._lock = threading.Lock()
        self.closed = False
        table = plan.table
        self._vals = table.vals
        self._setters = [_input_setter(plan, pos, i) for pos, i in enumerate(plan.inputs)]
        self._getters = [_output_getter(plan, pos, i) for pos, i in enumerate(plan.outputs)]
        in_spec, out_spec = plan.io_specs
        self._flatten = input_flattener(in_spec, len(plan.inputs), plan.name)
        self._build = output_builder(out_spec, len(plan.outputs))
        self._straight = not plan.has_jumps
        # One step per instruction, None for JumpFalseCall (straight chains hold none).
        self._plain: list[list[Any]] = [[ins.step for ins in chain] for chain in plan.chains]
        self._segments: list[Segment] = []
        # Straight chains run without their no-op steps (folded calls, frees of planned memory);
        # _pcs maps a position in such a list back to its instruction (for error messages).
        self._pcs: list[list[int]] = [list(range(len(steps))) for steps in self._plain]
        self._fast: list[list[Any]] = self._plain
        if self._straight:
            self._pcs = [[pc for pc, step in enumerate(steps) if step is not noop] for steps in self._plain]
            self._fast = [[steps[pc] for pc in pcs] for steps, pcs in zip(self._plain, self._pcs, strict=True)]
        if cuda_graphs and devices is not None and self._straight:  # device-only runs replay as CUDA graphs
            self._fast = []
            self._pcs = [list(range(len(steps))) for steps in self._plain]
            for steps in self._plain:
                grouped, segments = segment_steps(steps, devices)
                self._fast.append(grouped)
                self._segments.extend(segments)
        self._steps = self._fast
        self._step_pcs = self._pcs
        # Dynamic shapes: the chain to run when the inputs' shapes repeat the last run's (pyrt.runtime.steady).
        self._steady = None if cuda_graphs else steady_chain(plan)
        self._last_key: tuple[Any, ...] | None = None  # shapes of the last run that completed
        # device inputs and outputs around one graph: replayed with the least host work (pyrt.runtime.graph_forward)
        self._graph_forward = graph_forward(plan, self._fast, devices, self._flatten, graph_outputs) \
            if self._segments else None
        self.observer: Any = None  # see observe(); None: runs execute the plain steps, nothing else
        # the context every run enters when a step asks for one (numpy steps: floating-point events silent)
        self._context: Callable[[], AbstractContextManager[Any]] | None = next(
            (c for steps in self._plain for s in steps if (c := getattr(s, "run_context", None)) is not None), None)

    def reset_graphs(self) -> None:
        """Drop captured CUDA graphs (after execution contexts were recreated); they are captured again."""
        for segment in self._segments:
            segment.reset()

    def observe(self, observer: Any) -> None:
        """Install a run/step observer (``None`` removes it); :mod:`pyrt.runtime.profile` is the one user.

        ``observer.wrap(runner, chain, pc, step) -> step`` is asked once per instruction here,
        so the instruction loop is the same with or without an observer; each run goes through
        ``observer.run(runner, call, inputs, stream)``, which must call ``call(inputs, stream)``.
        An observed method runs instruction by instruction (CUDA graphs are not replayed meanwhile).
        """
        with self._lock:
            self.observer = observer
            self._last_key = None
            self._step_pcs = self._pcs if observer is None else [list(range(len(c))) for c in self._plain]
            self._steps = self._fast if observer is None else [
                [None if step is None else observer.wrap(self, ci, pc, step) for pc, step in enumerate(chain)]
                for ci, chain in enumerate(self._plain)]

    # -- running ---------------------------------------------------------------------------
    def __call__(self, inputs: Sequence[Any], stream: Any = None) -> Any:
        if self.observer is not None:
            return self.observer.run(self, self._call, inputs, stream)
        forward = self._graph_forward
        if forward is not None:  # None back: not captured yet, or not device inputs of the planned shapes
            with self._lock:
                outs = None if self.closed else forward(inputs, stream)
            if outs is not None:
                return self._build(outs)
        return self._call(inputs, stream)

    def _call(self, inputs: Sequence[Any], stream: Any) -> Any:
        try:
            flat = self._flatten(inputs)
            kind = self._kind(flat)
            if self.devices is not None:
                state: RunState | None = RunState(stream, flat, self.devices)
            else:  # no device work: a stream, if given, has nothing to order
                state = RunState(None, (), None, self.cuda) if self.cuda is not None else None
        except PyrtError:
            raise
        except Exception as exc:  # a caller object whose attributes raise
            raise InputError(f"method {self.name!r}: cannot read the inputs: {type(exc).__name__}: {exc}") from exc
        with self._lock:
            if self.closed:
                raise ProgramClosedError(f"method {self.name!r}: the program was closed while this run waited")
            if self.devices is not None and state is not None:  # device work: order it on the run's streams
                self.devices.begin(state, flat)
            try:
                pos = 0  # anything but a PyrtError from a setter becomes an InputError naming the input
                try:
                    for setter, x in zip(self._setters, flat, strict=True):
                        setter(x, state)
                        pos += 1
                except PyrtError:
                    raise
                except Exception as exc:
                    raise _input_failure(self.name, pos, flat[pos], exc) from exc
                run = self._execute_keyed if self._steady is not None and self.observer is None else self._execute
                if self._context is None:
                    run(state)
                else:
                    with self._context():
                        run(state)
                try:
                    outs = [get(kind, state) for get in self._getters]
                except PyrtError:
                    raise
                except Exception as exc:
                    raise ExecutionError(f"method {self.name!r}: handing an output back failed: "
                                         f"{type(exc).__name__}: {exc}") from exc
            finally:
                if self.devices is not None and state is not None:
                    self.devices.end(state)
        return self._build(outs)

    def _kind(self, flat: Sequence[Any]) -> str:
        for x in flat:
            k = caller_kind(x)
            if k is not None:
                return k
        return self.default_kind

    def _execute(self, state: RunState | None) -> None:
        for ci, steps in enumerate(self._steps):
            if self._straight:
                self._run_straight(ci, steps, self._step_pcs[ci])
            else:
                self._run_jumping(ci, self.plan.chains[ci], steps)

    def _execute_keyed(self, state: RunState | None) -> None:
        """A dynamic-shape run: the steady chain when every input shape repeats the last completed run's."""
        key = shape_key(self._vals, self.plan.inputs)
        last, self._last_key = self._last_key, None  # a run that fails leaves no trusted shapes
        if key != last or self._steady is None:
            self._execute(state)
        else:
            self._run_straight(0, *self._steady)
        self._last_key = key

    def _run_straight(self, ci: int, steps: Sequence[Callable[[], Any]], pcs: Sequence[int]) -> None:
        """Run chain ``ci``'s straight-line ``steps``; a failure names instruction ``pcs[i]`` of step i."""
        it = iter(steps)
        try:
            for step in it:  # no enumerate on the hot path: the failing position follows from what is left
                step()
        except PyrtError:
            raise
        except Exception as exc:
            raise self._failure(ci, pcs[len(steps) - operator.length_hint(it) - 1], exc) from exc

    def _run_jumping(self, ci: int, chain: list[Instr], steps: list[Any]) -> None:
        vals, pc, n = self._vals, 0, len(chain)
        while pc < n:
            step = steps[pc]
            try:
                if step is None:
                    ins = chain[pc]
                    pc = pc + 1 if _truthy(vals[ins.cond]) else ins.target
                    continue
                step()
            except PyrtError:
                raise
            except Exception as exc:
                raise self._failure(ci, pc, exc) from exc
            pc += 1

    def _failure(self, chain: int, pc: int, exc: Exception) -> PyrtError:
        """A kernel raised something untyped (bad data for it, typically): name the instruction."""
        what = self.plan.chains[chain][pc].what if pc < len(self.plan.chains[chain]) else "?"
        return ExecutionError(f"method {self.name!r} instruction {pc} ({what}) failed: {type(exc).__name__}: {exc}")


def _input_failure(method: str, pos: int, x: Any, exc: Exception) -> InputError:
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


def _truthy(v: Any) -> bool:
    if isinstance(v, (bool, int, float)):
        return bool(v)
    if isinstance(v, np.ndarray) or is_torch_tensor(v):
        return bool(v.all())
    raise InputError(f"JumpFalseCall condition is a {type(v).__name__}, not a bool or tensor")


# -- inputs ------------------------------------------------------------------------------------------


def _input_setter(plan: MethodPlan, pos: int, i: int) -> Setter:
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
        "Int": isinstance(x, (int, np.integer)) and not isinstance(x, bool),
        "Double": isinstance(x, (int, float, np.floating, np.integer)) and not isinstance(x, bool),
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
        state = _device_state(run)
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


# -- outputs -----------------------------------------------------------------------------------------


def _output_getter(plan: MethodPlan, pos: int, i: int) -> Getter:
    table = plan.table
    vals = table.vals
    info = table.infos.get(i)
    if info is not None and info.device is None and table.is_const(i) and not info.dynamic:
        return _static_host_getter(table.host, vals[i])

    def get(kind: str, state: RunState | None) -> Any:
        return _export(vals[i], kind, state)

    return get


def _static_host_getter(host: Any, t: Any) -> Getter:
    """Copy-out of a host tensor whose object and shape never change."""
    if isinstance(host, TorchHost):
        try:
            view = torch_to_numpy(t)
        except UnsupportedOperatorError:
            return lambda kind, state: host_output(t, kind)  # torch callers only: numpy ones get the error

        def get_torch_host(kind: str, state: Any) -> Any:
            return t.clone() if kind == TORCH else view.copy()

        return get_torch_host

    def get_numpy_host(kind: str, state: Any) -> Any:
        return host_output(t, kind) if kind == TORCH else t.copy()

    return get_numpy_host


def _export(v: Any, kind: str, state: RunState | None) -> Any:
    if isinstance(v, DeviceTensor):
        return _device_copy(v, kind, state)
    if isinstance(v, list):
        return [_export(x, kind, state) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    host_kind = TORCH if kind == TORCH else NUMPY
    if kind == TORCH and isinstance(v, np.ndarray) and not _torch_loaded():
        host_kind = NUMPY
    return host_output(v, host_kind)


def _torch_loaded() -> bool:
    import sys

    return "torch" in sys.modules


def _device_state(state: RunState | None) -> RunState:
    """The run state of device work (MethodRunner makes one whenever the method touches CUDA)."""
    if state is None or state.ctx is None:
        raise ExecutionError("internal error: device work without a run state")
    return state


def _device_copy(t: DeviceTensor, kind: str, run: RunState | None) -> Any:
    """Device output: a fresh device buffer the caller owns (or a host copy for host callers)."""
    state = _device_state(run)
    seam = state.ctx.cuda
    stream = state.streams.get(t.device)
    if not state.device_caller:  # host callers get host results: the one place a run synchronises
        out = np.empty(t.shape, dtype=numpy_dtype(t.scalar_type))
        seam.memcpy_dtoh(out, t.allocation, src_offset=t.offset, stream=stream)
        if stream is not None:
            stream.synchronize()  # the caller gets the host copy next
        return host_output(out, kind) if kind == TORCH else out
    if stream is None or not seam.memory_pools(t.device):
        alloc: DeviceAllocation = seam.alloc(max(t.nbytes, 1), t.device)
    else:  # stream-ordered: dropping it frees it on the stream the caller gets it on, with no sync
        alloc = seam.alloc_async(t.nbytes, stream, state.ctx.ready_handle(t.device))
    out_t = OwnedDeviceTensor(alloc, 0, t.scalar_type, t.shape, math.prod(t.shape), t.dim_order)
    if t.nbytes:
        seam.memcpy_dtod(alloc, t.allocation, t.nbytes, src_offset=t.offset, stream=stream)
    out_t.stream = None if stream is None else stream.handle  # consumers order on it (CAI v3 "stream")
    return device_output(out_t, kind)


__all__ = ["MethodRunner", "RunState", "output_builder", "input_flattener", "PLANNED"]
