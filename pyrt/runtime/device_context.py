"""The streams, events and staging buffers one method's device work runs on (:class:`DeviceContext`).

Each device a method touches gets one stream per run: the caller's when given, else torch's
current stream for torch CUDA callers, else a pyrt stream. Inputs or outputs of a delegate
that live elsewhere (host arenas, another GPU) go through device staging buffers allocated
at load: host copies synchronise only when the host needs the result; cross-device copies
are ordered by events, never by a host sync. The delegate steps that use it are
:mod:`pyrt.runtime.delegate_steps`'; kernels see it through
:class:`pyrt.memory.table.DeviceStreams`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

import pyrt.cuda as cuda_seam
from pyrt.checks import is_int
from pyrt.errors import InputError
from pyrt.memory.tensors import DeviceTensor


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
    if is_int(stream):
        return {primary: cuda.borrowed_stream(int(stream), primary)}

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
