"""TensorRT delegates of a method: blobs -> engines -> delegate steps; streams and staging.

Loading (:func:`draft_delegates`, :func:`load_engines`) parses each
``TensorRTBackend`` blob zero-copy, picks its device from the ``target_device``
compile spec (else the blob's ``device_id``) remapped through ``device_map``,
deserializes the engine there and applies the weight-streaming budget
(:mod:`pyrt.streaming`) before the execution context exists.

Running (:class:`DeviceContext`): each device a method touches gets one stream
(the caller's when given, else torch's current stream for torch CUDA callers,
else a pyrt stream). A delegate step checks its inputs, sets input shapes,
resizes outputs to the inferred shapes and enqueues the engine. Inputs or
outputs that live elsewhere (host arenas, another GPU) go through device
staging buffers allocated at load: host copies synchronise only when the host
needs the result; cross-device copies are ordered by events, never by a host sync.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np

from pyrt import cuda as cuda_seam
from pyrt.device.names import parse_device, remap_device
from pyrt.engine import Engine
from pyrt.errors import EngineError, InputError, PteFormatError, UnsupportedOperatorError
from pyrt.format.trt_blob import BACKEND_ID, parse_blob
from pyrt.kernels.base import Step
from pyrt.memory.host import TorchHost
from pyrt.memory.layout import numpy_dtype
from pyrt.memory.tensors import DeviceTensor
from pyrt.pte_reader import BackendDelegate, DelegateCall, ExecutionPlan
from pyrt.runtime.cuda_graphs import data_dependent_refusal, mark_capturable, refuse_capture
from pyrt.runtime.memory_plan import close_engines, share_scratch
from pyrt.streaming import BudgetSource, EngineStreamingInfo, find_baked_budget, resolve_budgets

TARGET_DEVICE = "target_device"


@dataclass
class DelegateDraft:
    """One TensorRT delegate before and after its engine is loaded."""

    method: str
    index: int
    delegate: BackendDelegate
    blob: Any  # pyrt.format.trt_blob.TensorRTBlob
    device: int
    baked: int | None
    source: str
    engine: Any = None
    resolved: Any = None  # pyrt.streaming.ResolvedBudget
    global_index: int = -1

    @property
    def name(self) -> str:
        return f"{self.method}/delegate{self.index}"


def draft_delegates(xplan: ExecutionPlan, device_map: Any) -> list[DelegateDraft]:
    """Parse every delegate blob of a method and decide its device (imports no TensorRT)."""
    program = xplan.program
    out = []
    for i, d in enumerate(xplan.delegates):
        where = f"{program.pte.source}: method {xplan.name!r} delegate {i}"
        if d.id != BACKEND_ID:
            raise UnsupportedOperatorError(f"{where} uses backend {d.id!r}; pyrt runs only {BACKEND_ID} delegates")
        blob = parse_blob(program.delegate_data(d), source=where)
        spec = d.spec(TARGET_DEVICE)
        if spec is not None:
            try:
                text = spec.decode("ascii")
            except UnicodeDecodeError:
                raise PteFormatError(f"{where}: compile spec {TARGET_DEVICE} {spec!r} is not ASCII") from None
            device = parse_device(text, f"{where} compile spec {TARGET_DEVICE}")
        else:
            device = blob.device_id
        baked = find_baked_budget([(c.key, c.value) for c in d.compile_specs], source=where)
        out.append(DelegateDraft(xplan.name, i, d, blob, remap_device(device, device_map), baked, where))
    return out


def load_engines(drafts: Sequence[DelegateDraft], *, trt: Any, cuda: Any, budget: Any,
                 share_activations: bool = True, planner: Callable[[Sequence[DelegateDraft]], Any] | None = None,
                 label: str | None = None) -> None:
    """Deserialize every engine, then resolve and apply budgets (engine index = position in ``drafts``).

    ``share_activations``: engines of one method on one device share one activation scratch
    (:mod:`pyrt.device.scratch`); they run one after another on the method's stream under its lock.
    ``planner(drafts)``, called once the engines are deserialized and before any context exists,
    returns the budget to apply (``budget`` is not used then); ``label`` replaces the budgets' source.
    """
    try:
        for i, d in enumerate(drafts):
            d.global_index = i
            d.engine = Engine.load(d.blob.engine, device=d.device, io_bindings=d.blob.io_bindings,
                                   trt=trt, cuda=cuda, name=d.name)
        if share_activations:
            share_scratch(drafts, cuda_seam.resolve(cuda))
        if planner is not None:
            budget = planner(drafts)
        apply_budgets(drafts, budget, source="load-time budget", label=label)
    except BaseException:
        close_engines(drafts)
        raise


def apply_budgets(drafts: Sequence[DelegateDraft], budget: Any, *, source: str, label: str | None = None) -> None:
    """Resolve budgets for all engines (validated first), then configure each one.

    ``label`` ("fit") names where explicit budgets came from instead of "load-time".
    """
    infos = [EngineStreamingInfo(d.global_index, d.engine.streamable_weights_size, d.baked) for d in drafts]
    resolved = resolve_budgets(infos, budget, source=source)
    for d, r in zip(drafts, resolved, strict=True):
        if label is not None and r.source == "load-time":
            r = replace(r, source=cast(BudgetSource, label))
        d.engine.configure(r.budget, r.source)
        d.resolved = r


# -- run-time ----------------------------------------------------------------------------------------


def _caller_streams(stream: Any, cuda: Any, primary: int) -> dict[int, Any]:
    """device -> pyrt Stream wrapping the caller's stream (never closed by pyrt)."""
    if stream is None:
        return {}

    if isinstance(stream, cuda_seam.Stream):
        return {stream.device: stream}
    if hasattr(stream, "cuda_stream"):  # torch.cuda.Stream
        index = getattr(getattr(stream, "device", None), "index", None)
        device = primary if index is None else int(index)
        return {device: cuda.borrowed_stream(int(stream.cuda_stream), device)}
    if hasattr(stream, "__cuda_stream__"):
        _, handle = stream.__cuda_stream__()
        return {primary: cuda.borrowed_stream(int(handle), primary)}
    if isinstance(stream, int) and not isinstance(stream, bool):
        return {primary: cuda.borrowed_stream(stream, primary)}

    raise InputError(f"stream must be a pyrt.cuda.Stream, a torch.cuda.Stream, an object with "
                     f"__cuda_stream__ or an int handle; got {type(stream).__name__}")


class DeviceContext:
    """Streams, events and staging buffers of one method, and the CUDA seam its run uses.

    Streams of a run, per device: the caller's (``run(stream=...)``), else torch's
    current stream when torch CUDA tensors came in, else a pyrt stream. Work on a
    pyrt stream is ordered after the legacy default stream's queued work when device
    inputs came in (they may still be being produced there), and device outputs are
    made ready on it at the end (event waits, no host synchronisation), so callers that
    give no stream may use results on the legacy default stream at once.
    """

    def __init__(self, cuda: Any, devices: set[int]) -> None:
        self.cuda = cuda
        self.devices = sorted(devices)
        self.primary = self.devices[0] if self.devices else 0
        self._own: dict[int, Any] = {}
        self._events: dict[int, Any] = {}
        self._staging: list[Any] = []
        self._active: dict[int, Any] = {}
        self._torch_caller = False
        self._device_caller = False
        self._own_used: list[int] = []
        self._keep: list[Any] = []  # private host copies read by this run's queued copies
        self._retired: list[Any] = []  # the previous run's, until its copy events pass
        self._copy_events: dict[int, Any] = {}
        self._copy_marks: dict[int, Any] = {}  # device -> event recorded after its last host -> device copy
        self._end_events: dict[int, Any] = {}
        # events recorded at the end of the last run's streams: a run's first work on a stream waits for them
        self.last_run: list[Any] = []
        self._named: dict[tuple[str, int], Any] = {}  # see named_event()

    # streams
    def begin(self, state: Any, inputs: Sequence[Any] = ()) -> None:
        if self._copy_marks:
            self._retire_copies()
        self._active = _caller_streams(state.stream, self.cuda, self.primary)
        torch = sys.modules.get("torch")
        self._torch_caller = state.stream is None and torch is not None and any(
            isinstance(x, torch.Tensor) and x.is_cuda for x in inputs)
        self._device_caller = bool(getattr(state, "device_caller", False))
        self._own_used = []
        state.streams = self._active

    def stream(self, device: int) -> Any:
        s = self._active.get(device)
        if s is None:
            s = self._torch_stream(device) if self._torch_caller else None
            if s is None:
                s = self.own_stream(device)
                if self._device_caller:  # caller data may still be produced on the legacy stream
                    self._order_streams(self.cuda.borrowed_stream(0, device), s)
                self._own_used.append(device)
            for event in self.last_run:  # the last run may still read arenas this run will write
                s.wait(event)
            self._active[device] = s
        return s

    def ready_handle(self, device: int) -> int:
        """The handle of the stream this run's device outputs on ``device`` are ready on for the caller: the
        run's stream, or the legacy default stream (0) where that is pyrt's own (``end`` orders it after)."""
        return 0 if device in self._own_used else int(self.stream(device).handle)

    def caller_stream(self, stream: Any, device: int) -> Any:
        """The caller's ``stream`` argument as a pyrt Stream, or None when it names another device."""
        return _caller_streams(stream, self.cuda, self.primary).get(device)

    def own_stream(self, device: int) -> Any:
        """pyrt's stream of ``device``, for runs whose caller gives none (created once, closed with the context)."""
        s = self._own.get(device)
        if s is None:
            s = self._own[device] = self.cuda.stream(device)
        return s

    def consumer_handle(self, device: int) -> int:
        """The handle of the stream this run reads caller data on (DLPack's ``stream=``)."""
        return int(self.stream(device).handle)

    def wait_for(self, producer: int, producer_device: int, consumer: Any) -> None:
        """Make ``consumer`` (a stream) wait for the work queued on stream handle ``producer``."""
        if producer == consumer.handle:
            return
        self._order_streams(self.cuda.borrowed_stream(producer, producer_device), consumer)

    def _order_streams(self, before: Any, after: Any) -> None:
        event = self._event(self._events, before.device)
        event.record(before)
        after.wait(event)

    def _event(self, pool: dict[int, Any], device: int) -> Any:
        """The event of ``pool`` for ``device`` (created once, reused: each use records it anew)."""
        event = pool.get(device)
        if event is None:
            event = pool[device] = self.cuda.event(device)
        return event

    def named_event(self, name: str, device: int) -> Any:
        """An event of ``device`` kept under ``name`` for reuse (each use records it anew), closed with the context."""
        event = self._named.get((name, device))
        if event is None:
            event = self._named[name, device] = self.cuda.event(device)
        return event

    def _torch_stream(self, device: int) -> Any:
        torch = sys.modules["torch"]
        return self.cuda.borrowed_stream(int(torch.cuda.current_stream(device).cuda_stream), device)

    def order(self, src: int, dst: int) -> None:
        """Make work queued next on ``dst``'s stream wait for what ``src``'s stream has queued."""
        if src == dst:
            return
        self._order_streams(self.stream(src), self.stream(dst))

    def copy_to_device(self, dst: Any, src: np.ndarray, stream: Any, *, dst_offset: int = 0) -> None:
        """Queue a host -> device copy of ``src`` on ``stream`` from a private copy of it.

        The copy runs later (for pinned memory, truly later), while the host goes on: memory
        planning may hand ``src``'s arena bytes to a host kernel that runs before the copy, and
        a caller may reuse its array. The private copy is held until an event recorded right
        after the copy has passed (checked at the next run's start, or at close).
        """
        private = np.array(src, copy=True, order="C")
        self._keep.append(private)  # read by a queued copy: freed only after its event
        self.cuda.memcpy_htod(dst, private, dst_offset=dst_offset, stream=stream)
        event = self._event(self._copy_events, stream.device)
        event.record(stream)
        self._copy_marks[stream.device] = event

    def _retire_copies(self) -> None:
        """Wait for the last run's host -> device copies (long done, normally) and free their buffers."""
        for event in self._copy_marks.values():
            event.synchronize()
        self._copy_marks.clear()
        self._retired.clear()

    def end(self, state: Any) -> None:
        """Finish a run: device results become ready on the legacy stream for callers without one."""
        try:
            if self._device_caller:
                for device in self._own_used:
                    self._order_streams(self._own[device], self.cuda.borrowed_stream(0, device))
            self.last_run = []
            for device, stream in self._active.items():  # the next run's streams start after these
                event = self._event(self._end_events, device)
                event.record(stream)
                self.last_run.append(event)
        finally:
            self._active = {}
            self._retired.extend(self._keep)  # freed once their copies' events have passed
            self._keep = []

    def staging(self, device: int, info: Any) -> DeviceTensor:
        alloc = self.cuda.alloc(max(info.nbytes, 1), device)
        self._staging.append(alloc)
        return DeviceTensor(alloc, 0, info.scalar_type, info.sizes, info.capacity, info.dim_order)

    def close(self) -> None:
        self._retire_copies()
        for s in self._own.values():
            s.close()
        for e in [*self._events.values(), *self._copy_events.values(), *self._end_events.values(),
                  *self._named.values()]:
            e.close()
        self._named.clear()
        self._copy_events.clear()
        self._end_events.clear()
        self.last_run = []
        for a in self._staging:
            a.free()
        self._own.clear()
        self._events.clear()
        self._staging.clear()

    # delegate steps
    def step_factory(self, draft: Any, table: Any) -> Callable[[int, DelegateCall, int], Step]:
        def make(pc: int, ins: DelegateCall, pos: int) -> Step:
            return _delegate_step(self, draft.delegates[ins.delegate_index], ins, table)

        return make


@dataclass
class _Port:
    index: int  # value index
    get: Callable[[], Any]
    dtype: str
    staging: DeviceTensor | None = None
    host: bool = False
    device: int | None = None
    dynamic: bool = False
    sizes: tuple[int, ...] = field(default_factory=tuple)


def _flat_args(table: Any, args: Sequence[int]) -> list[int]:
    out: list[int] = []
    for a in args:
        if table.kinds[a] == "TensorList":
            out.extend(table.items[a])
        else:
            out.append(a)
    return out


def _ports(ctx: DeviceContext, d: DelegateDraft, table: Any, idxs: Sequence[int],
           bindings: Sequence[Any]) -> list[_Port]:
    ports = []
    for j, b in zip(idxs, bindings, strict=True):
        info = table.infos.get(j)
        if info is None:
            raise PteFormatError(f"{d.source}: delegate argument value {j} ({table.kinds[j]}) is not a tensor")
        if info.scalar_type.dtype_name != b.dtype:
            raise PteFormatError(f"{d.source}: binding {b.name!r} is {b.dtype} but value {j} is "
                                 f"{info.scalar_type.dtype_name}")
        port = _Port(j, table.getter(j), b.dtype, dynamic=info.dynamic, sizes=info.sizes, device=info.device)
        if info.device != d.device:
            port.staging = ctx.staging(d.device, info)
            port.host = info.device is None
        ports.append(port)
    return ports


def _delegate_step(ctx: DeviceContext, d: DelegateDraft, ins: DelegateCall, table: Any) -> Step:
    engine = d.engine
    flat = _flat_args(table, ins.args)
    n_in, n_out = len(engine.input_names), len(engine.output_names)
    if len(flat) != n_in + n_out:
        raise PteFormatError(f"{d.source}: the call passes {len(flat)} tensors, the engine has {n_in} inputs "
                             f"and {n_out} outputs")
    written = [j for j in flat[n_in:] if j in table.read_only]
    if written:
        raise PteFormatError(f"{d.source}: the call writes value {written[0]}, which holds constant data from the "
                             f"file (read-only)")
    bindings = [b for b in d.blob.io_bindings if b.is_input]
    out_bindings = {b.name: b for b in d.blob.io_bindings if not b.is_input}
    ins_ = _ports(ctx, d, table, flat[:n_in], bindings)
    outs = _ports(ctx, d, table, flat[n_in:], [out_bindings[n] for n in engine.output_names])
    torch_host = isinstance(table.host, TorchHost)
    dynamic = any(p.dynamic for p in ins_)
    device = d.device
    static_shapes: list[tuple[int, ...]] = []
    if not dynamic and not any(p.dynamic for p in outs):
        return _static_delegate_step(ctx, engine, ins_, outs, device, table, torch_host)

    def step() -> None:  # dynamic shapes, or outputs whose shape only the run decides (pyrt.device.output_allocator)
        stream = ctx.stream(device)
        shapes = [_stage_in(ctx, p, device, stream, torch_host) for p in ins_]
        engine.check_inputs([(s, p.dtype) for s, p in zip(shapes, ins_, strict=True)])
        engine.use_profile(stream.handle)
        if dynamic or not static_shapes:
            out_shapes = engine.infer_output_shapes(shapes)
            if not dynamic:
                static_shapes[:] = out_shapes
        else:
            out_shapes = static_shapes
        targets = [_out_target(p, s, table) for p, s in zip(outs, out_shapes, strict=True)]
        in_ptrs = [(p.staging if p.staging is not None else p.get()).ptr for p in ins_]
        engine.execute(in_ptrs, [t.ptr for t in targets], stream.handle, [t.nbytes for t in targets])
        for k, name in enumerate(engine.output_names):  # data-dependent: the shape TensorRT reported, before
            if name in engine.data_dependent:           # any later step (or the copy below) reads the output
                targets[k] = _out_target(outs[k], engine.reported_shape(name), table)
        for p, t in zip(outs, targets, strict=True):
            if p.staging is not None:
                _stage_out(ctx, p, t, device, stream, table, torch_host)

    refuse_capture(step, data_dependent_refusal(d.name, d.blob.io_bindings))
    return step


def _static_delegate_step(ctx: DeviceContext, engine: Any, ins_: list[_Port], outs: list[_Port], device: int,
                          table: Any, torch_host: bool) -> Step:
    """A delegate whose shapes are all planned: checked on the first run, then only copies and the launch.

    Addresses are those of memory-planned arenas and staging buffers, fixed for the
    program's life, so the first run's checks (input shapes against the engine's profile,
    output shapes against the plan) hold for every later run.
    """
    ptrs: list[int] = []
    staged_in = [p for p in ins_ if p.staging is not None]
    staged_out = [p for p in outs if p.staging is not None]

    def first() -> list[int]:
        shapes = [tuple(p.get().shape) if p.staging is None else p.sizes for p in ins_]
        engine.check_inputs([(s, p.dtype) for s, p in zip(shapes, ins_, strict=True)])
        out_shapes = engine.infer_output_shapes(shapes)
        targets = [_out_target(p, s, table) for p, s in zip(outs, out_shapes, strict=True)]
        return [int((p.staging if p.staging is not None else p.get()).ptr) for p in ins_] + \
            [int(t.ptr) for t in targets]

    def step() -> None:
        stream = ctx.stream(device)
        for p in staged_in:
            _stage_in(ctx, p, device, stream, torch_host)
        if not ptrs:
            ptrs.extend(first())
        engine.enqueue(ptrs, stream.handle)
        for p in staged_out:
            _stage_out(ctx, p, p.staging, device, stream, table, torch_host)  # type: ignore[arg-type]

    if not staged_in and not staged_out:  # device memory of its own device only: one launch, capturable
        mark_capturable(step, device)
    return step


def _stage_in(ctx: DeviceContext, p: _Port, device: int, stream: Any, torch_host: bool) -> tuple[int, ...]:
    src = p.get()
    if p.staging is None:
        return tuple(src.shape)
    shape = tuple(int(s) for s in src.shape)
    p.staging.resize(shape, f"delegate input value {p.index}")
    if p.host:
        arr = src.numpy() if torch_host else src
        if arr.nbytes:
            ctx.copy_to_device(p.staging.allocation, arr, stream)
    elif src.nbytes:
        ctx.order(src.device, device)
        ctx.cuda.memcpy_peer(p.staging.allocation, src.allocation, src.nbytes, src_offset=src.offset, stream=stream)
    return shape


def _out_target(p: _Port, shape: tuple[int, ...], table: Any) -> DeviceTensor:
    if min(shape, default=0) < 0:  # data-dependent: the planned buffer at its bound until TensorRT reports the shape
        shape = p.sizes
    if not p.dynamic and shape != p.sizes:
        raise EngineError(f"engine output for value {p.index} has shape {shape}, the program planned {p.sizes}")
    if p.staging is not None:
        p.staging.resize(shape, f"delegate output value {p.index}")
        return p.staging
    t = p.get()
    if p.dynamic and tuple(t.shape) != shape:
        t = table.resize(p.index, shape)
    return t


def _stage_out(ctx: DeviceContext, p: _Port, staged: DeviceTensor, device: int, stream: Any, table: Any,
               torch_host: bool) -> None:
    shape = staged.shape
    dst = p.get()
    if p.dynamic and tuple(dst.shape) != shape:
        dst = table.resize(p.index, shape)
    if p.host:
        arr = dst.numpy() if torch_host else dst
        if arr.dtype != numpy_dtype(staged.scalar_type) or not arr.flags.c_contiguous:
            raise EngineError(f"delegate output value {p.index} needs a contiguous {staged.dtype} host tensor")
        if staged.nbytes:
            ctx.cuda.memcpy_dtoh(arr, staged.allocation, stream=stream)
            stream.synchronize()  # host kernels read it next
        return
    if staged.nbytes:
        ctx.order(device, dst.device)
        ctx.cuda.memcpy_peer(dst.allocation, staged.allocation, staged.nbytes, dst_offset=dst.offset,
                             stream=ctx.stream(dst.device))
