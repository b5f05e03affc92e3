"""A whole method replayed as one CUDA graph, device inputs in and device outputs out: the serving path.

A method qualifies (with ``Program(..., cuda_graphs=True)``) when its one
instruction chain is a single graph :class:`~pyrt.runtime.cuda_graphs.Segment` (static
TensorRT delegates on one device, reading and writing that device's memory)
and every input and output is a static tensor planned in that device's memory.
Its first two runs take the general path (run eagerly, then captured). After
that, a call whose inputs are all CUDA buffers on that device (torch CUDA
tensors, pyrt DeviceTensors, ``__cuda_array_interface__`` or DLPack objects)
with the planned dtypes and shapes -- the graph's one shape key -- runs as::

    wait for the inputs' producers (events) -> cuMemcpyDtoDAsync of each input into
    its planned buffer -> cuGraphLaunch -> outputs -> an event for the next run

on the run's stream: the caller's ``stream``, else torch's current stream for
torch inputs, else pyrt's stream of the device (ordered after the legacy default
stream at the start and before it at the end, as the general path does). Nothing
synchronises the host. Every other call (host inputs, another device, other
shapes or dtypes, a profiler attached, a graph not captured yet or dropped by
``set_budget``) takes the general path, which warms up, captures again, or raises
the typed error; so do calls whose inputs are not what the planned buffers hold.

Outputs, chosen at load by ``graph_outputs``:

* ``"copy"`` (default): each output is a fresh device buffer the caller owns,
  filled on the run's stream from the planned output buffer; later runs never
  touch it. The buffers come from CUDA's stream-ordered allocator
  (``cuMemAllocAsync`` on the run's stream) and dropping an output frees it
  with ``cuMemFreeAsync`` -- no host or device synchronisation -- on the stream
  the outputs are ready on: the caller's ``stream``, torch's current stream,
  or the legacy default stream when pyrt used its own. This is the contract of
  torch's caching allocator: work queued on that stream before the drop still
  reads valid memory; a consumer on another stream must order that stream
  before the drop (an event the output's stream waits for, or a sync), as
  ``Tensor.record_stream`` does for torch. Keep that stream alive until its
  outputs are dropped (a free whose stream is gone falls back to
  ``cuMemFree``, which synchronises the device). A device without the
  stream-ordered allocator gets ``cuMemAlloc`` buffers, freed by ``cuMemFree``.
* ``"static"``: each output is the same view of the method's planned output
  buffer on every run, as ``torch.cuda.graphs`` hands out static outputs: the
  next run of the method overwrites it, and it is valid only while the program
  is open. Copy what you need to keep before running the method again.

>>> GRAPH_OUTPUTS
('copy', 'static')
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from pyrt.cuda import DeviceAllocation, StreamAllocation
from pyrt.errors import DeviceError, InputError
from pyrt.memory.interop import TORCH, device_input, device_output
from pyrt.memory.tensors import DeviceTensor, OutputTensor
from pyrt.runtime.cuda_graphs import Segment

GRAPH_OUTPUTS = ("copy", "static")


def check_graph_outputs(value: Any) -> str:
    """``value`` if it names an output policy, else an InputError."""
    if value not in GRAPH_OUTPUTS:
        raise InputError(f"graph_outputs={value!r} must be one of {list(GRAPH_OUTPUTS)}")
    return str(value)


def graph_forward(plan: Any, steps: Sequence[Sequence[Any]], ctx: Any, flatten: Callable[[Sequence[Any]], Any],
                  outputs: str) -> GraphForward | None:
    """The fast path of a method whose grouped ``steps`` are one segment with device-resident I/O, else None."""
    if ctx is None or len(steps) != 1 or len(steps[0]) != 1 or not isinstance(steps[0][0], Segment):
        return None
    segment = steps[0][0]
    table = plan.table

    def on_device(i: int) -> bool:
        info = table.infos.get(i)
        return (table.kinds[i] == "Tensor" and info is not None and info.device == segment.device
                and not info.dynamic and isinstance(table.vals[i], DeviceTensor))

    if not plan.inputs or not all(on_device(i) for i in (*plan.inputs, *plan.outputs)):
        return None
    return GraphForward([table.vals[i] for i in plan.inputs], [table.vals[i] for i in plan.outputs], segment, ctx,
                        flatten, outputs, plan.name)


class GraphForward:
    """Replays one method's graph for device callers; ``__call__`` returns None where it does not apply."""

    def __init__(self, inputs: list[DeviceTensor], outputs: list[DeviceTensor], segment: Segment, ctx: Any,
                 flatten: Callable[[Sequence[Any]], Any], policy: str, method: str) -> None:
        self.segment = segment
        self.device = segment.device
        self.ctx = ctx
        self.static = check_graph_outputs(policy) == "static"
        self.method = method
        self._flatten = flatten
        # per input: planned address, bytes, dtype, shape, dim order -- the shape key is fixed at load
        self._in = [(t.ptr, t.nbytes, t.scalar_type, t.shape, t.dim_order) for t in inputs]
        # per output: planned address, bytes, bytes a fresh copy allocates (never 0), and its layout
        self._out = [(t.ptr, t.nbytes, max(t.nbytes, 1), t.scalar_type, t.shape, t.capacity, t.dim_order)
                     for t in outputs]
        self._views = [DeviceTensor(t.allocation, t.offset, t.scalar_type, t.shape, t.capacity, t.dim_order)
                       for t in outputs]
        cuda = self.cuda = ctx.cuda
        self._cu_ctx = cuda.context(self.device)
        driver = cuda.driver  # looked up once: each call below is checked where it is made
        self._set_ctx, self._copy, self._launch = driver.cuCtxSetCurrent, driver.cuMemcpyDtoDAsync, driver.cuGraphLaunch
        self._record, self._wait = driver.cuEventRecord, driver.cuStreamWaitEvent
        self._owned: Callable[[Any, int, int, int, int], DeviceAllocation]
        if cuda.memory_pools(self.device):  # stream-ordered outputs: StreamAllocation(cuda, ptr, size, device, free_on)
            self._alloc, self._owned, self._alloc_name = driver.cuMemAllocAsync, StreamAllocation, "cuMemAllocAsync"
        else:  # a device without the stream-ordered allocator: cuMemAlloc, and cuMemFree (a device sync) on drop
            self._alloc, self._owned, self._alloc_name = _sync_alloc(driver), _sync_owned, "cuMemAlloc"
        self._ends: list[Any] = []  # [end event]: what this path last set as the context's last run
        self._end_handle: int | None = None  # the stream that run used
        self._arg: Any = None  # the last ``stream`` argument and its (raw, handle)
        self._arg_stream: tuple[Any, int] | None = None
        self._ev_in: Any = None
        self._ev_end: Any = None

    def __call__(self, inputs: Sequence[Any], stream: Any) -> list[Any] | None:
        graph = self.segment.graph_exec
        if graph is None:  # not captured yet, or dropped (set_budget)
            return None
        flat = self._flatten(inputs)
        if len(flat) != len(self._in):
            return None
        torch_out = not isinstance(flat[0], DeviceTensor) and _is_torch(flat[0])
        if stream is not None and stream is self._arg:  # the caller's stream, as last time
            raw, handle = self._arg_stream  # type: ignore[misc]
            own = False
        else:
            run = self._stream(stream, torch_out)
            if run is None:
                return None
            raw, handle, own = run
        device = self.device
        sources = []
        for x, spec in zip(flat, self._in, strict=True):  # all read and checked before any work is queued
            if (isinstance(x, DeviceTensor) and x.scalar_type is spec[2] and x.shape == spec[3]
                    and x.dim_order == spec[4] and (a := x.allocation).device == device and not a.freed):
                sources.append((a.ptr + x.offset, x.stream))
                continue
            source = self._foreign(x, spec, handle)
            if source is None:
                return None
            sources.append(source)
        if self._ev_end is None:  # events of the context (closed with it), made on first use
            self._ends = [self.ctx.named_event("graph forward end", device)]
            self._ev_in = self.ctx.named_event("graph forward inputs", device).raw
            self._ev_end = self._ends[0].raw
        try:
            outs = self._enqueue(graph, sources, raw, handle, own)
        except DeviceError:
            raise
        except Exception as exc:  # the driver binding raises for bad types
            raise DeviceError(f"method {self.method!r}: graph replay failed: {type(exc).__name__}: {exc}") from exc
        self.ctx.last_run, self._end_handle = self._ends, handle
        if torch_out:
            return [device_output(t, TORCH) for t in outs]
        return outs

    def _enqueue(self, graph: Any, sources: list[tuple[int, int | None]], raw: Any, handle: int,
                 own: bool) -> list[DeviceTensor]:
        """Everything a forward queues on the run's stream: ordering after what it must follow, the input
        copies, the graph, the outputs (fresh buffers filled from the planned ones, or those), the end event."""
        record, wait, copy, ev_in, ev_end = self._record, self._wait, self._copy, self._ev_in, self._ev_end
        if (r := self._set_ctx(self._cu_ctx))[0]:
            raise _error("cuCtxSetCurrent", r)
        if own:  # device callers that name no stream may still be producing on the legacy stream
            if (r := record(ev_in, 0))[0] or (r := wait(raw, ev_in, 0))[0]:
                raise _error("ordering after the legacy stream", r)
        last = self.ctx.last_run
        if last and (last is not self._ends or handle != self._end_handle):
            for event in last:  # the last run may still read the planned buffers this run writes
                if (r := wait(raw, event.raw, 0))[0]:
                    raise _error("cuStreamWaitEvent", r)
        for (src, producer), spec in zip(sources, self._in, strict=True):
            if producer is not None and producer != handle:  # the producer's queued work first
                if (r := record(ev_in, producer))[0] or (r := wait(raw, ev_in, 0))[0]:
                    raise _error(f"ordering after producer stream {producer:#x}", r)
            if spec[1] and (r := copy(spec[0], src, spec[1], raw))[0]:
                raise _error("cuMemcpyDtoDAsync", r)
        if (r := self._launch(graph, raw))[0]:
            raise _error("cuGraphLaunch", r)
        stream_out = handle or None  # CAI v3 "stream" of the outputs (none for the legacy stream's 0)
        if self.static:
            outs = list(self._views)
            for t in outs:
                t.stream = stream_out
        else:  # fresh stream-ordered buffers, freed on the stream the caller gets them on (see the module doc)
            outs = []
            alloc, owned, cuda, device = self._alloc, self._owned, self.cuda, self.device
            free_on = 0 if own else handle  # the legacy stream where pyrt used its own
            for src, nbytes, size, scalar_type, shape, capacity, dim_order in self._out:
                if (r := alloc(size, raw))[0]:
                    raise _error(self._alloc_name, r)
                ptr = int(r[1])
                outs.append(OutputTensor(owned(cuda, ptr, size, device, free_on), scalar_type, shape, capacity,
                                         dim_order, stream_out))
                if nbytes and (r := copy(ptr, src, nbytes, raw))[0]:
                    raise _error("cuMemcpyDtoDAsync", r)
        if (r := record(ev_end, raw))[0]:  # the next run, on another stream, waits for it
            raise _error("cuEventRecord", r)
        if own and (r := wait(0, ev_end, 0))[0]:  # results ready on the legacy stream
            raise _error("cuStreamWaitEvent", r)
        return outs

    def _stream(self, stream: Any, torch_in: bool) -> tuple[Any, int, bool] | None:
        """(raw stream, handle, is pyrt's own) of this run, or None: the stream is another device's."""
        if stream is None:
            if torch_in:  # torch's current stream, as the general path uses
                torch = sys.modules["torch"]
                handle = int(torch.cuda.current_stream(self.device).cuda_stream)
                return handle, handle, False
            s = self.ctx.own_stream(self.device)
            return s.raw, s.handle, True
        if stream is not self._arg:
            s = self.ctx.caller_stream(stream, self.device)
            if s is None:
                return None
            self._arg, self._arg_stream = stream, (s.raw, s.handle)
        raw, handle = self._arg_stream  # type: ignore[misc]
        return raw, handle, False

    def _foreign(self, x: Any, spec: tuple[Any, ...], handle: int) -> tuple[int, int | None] | None:
        """(address, producer stream) of a torch CUDA tensor, CAI or DLPack input, or None if it does not fit."""
        try:  # the caller keeps it alive; its producer is ordered before ``handle``'s stream
            dev = device_input(x, "input", self.cuda, lambda device: handle)
        except Exception:  # the general path reads it again and names what is wrong
            return None
        if dev is None or dev.device != self.device or dev.scalar_type is not spec[2] or dev.shape != spec[3]:
            return None
        return dev.ptr, dev.stream


def _sync_alloc(driver: Any) -> Callable[[int, Any], Any]:
    """``cuMemAlloc`` with ``cuMemAllocAsync``'s arguments (the stream is not used)."""
    def alloc(size: int, stream: Any) -> Any:
        return driver.cuMemAlloc(size)

    return alloc


def _sync_owned(cuda: Any, ptr: int, size: int, device: int, free_on: int) -> DeviceAllocation:
    """An owned ``cuMemAlloc`` allocation, freed by ``cuMemFree`` (``free_on`` is not used)."""
    return DeviceAllocation(cuda, ptr, size, device, owned=True)


def _error(name: str, result: Any) -> DeviceError:
    """The error of a driver call that did not return CUDA_SUCCESS (0: CUresult is an int enum)."""
    return DeviceError(f"{name} failed with {result[0]!r} (CUresult {int(result[0])})")


def _is_torch(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)
