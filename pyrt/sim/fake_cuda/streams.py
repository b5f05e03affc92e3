"""The fake driver's streams and events: creating and destroying them, synchronising, waiting across
streams, and timing events by the host clock at which their stream reaches them.
"""

from __future__ import annotations

import time
from typing import Any

from pyrt.sim.fake_cuda.copies import CopyDriver
from pyrt.sim.fake_cuda.handles import (
    CUevent,
    CUresult,
    CUstream,
)
from pyrt.sim.fake_cuda.state import (
    EVENT_DISABLE_TIMING,
    Queue,
)


class StreamDriver(CopyDriver):
    """cuStream* and cuEvent*: the synchronisation points that run queued work."""

    def cuStreamCreate(self, Flags: int) -> tuple[CUresult, CUstream | None]:
        error = self._ready()
        if error:
            return (error, None)
        handle = CUstream(self._new_handle(), self._context_device())
        self._streams[int(handle)] = handle
        self._queues[int(handle)] = Queue(handle.device)
        return (CUresult.CUDA_SUCCESS, handle)

    def cuStreamDestroy(self, hStream: Any) -> tuple[CUresult]:
        found = self._streams.pop(int(hStream), None)
        if found is None:
            return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
        queue = self._queues.pop(int(hStream))
        self._note(self._drain(queue), "work on a destroyed stream")  # queued work still completes
        return (CUresult.CUDA_SUCCESS,)

    def cuStreamSynchronize(self, hStream: Any) -> tuple[CUresult]:
        if not self._stream_ok(hStream):
            return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
        if self._capturing():
            return (self._invalidate_captures(CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED),)
        queue = self._queue_of(hStream)
        return (CUresult.CUDA_SUCCESS if queue is None else self._drain(queue),)

    def cuStreamWaitEvent(self, hStream: Any, hEvent: Any, Flags: int) -> tuple[CUresult]:
        if not self._stream_ok(hStream) or int(hEvent) not in self._events:
            return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
        mark = self._event_marks.get(int(hEvent))
        if mark is not None:
            return (self._enqueue(hStream, lambda: CUresult.CUDA_SUCCESS, "cuStreamWaitEvent", after=mark),)
        return (CUresult.CUDA_SUCCESS,)

    def cuEventCreate(self, Flags: int) -> tuple[CUresult, CUevent | None]:
        error = self._ready()
        if error:
            return (error, None)
        handle = CUevent(self._new_handle(), self._context_device(), timing=not Flags & EVENT_DISABLE_TIMING)
        self._events[int(handle)] = handle
        self._event_marks[int(handle)] = None
        return (CUresult.CUDA_SUCCESS, handle)

    def cuEventRecord(self, hEvent: Any, hStream: Any) -> tuple[CUresult]:
        event = self._events.get(int(hEvent))
        if event is None or not self._stream_ok(hStream):
            return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
        if event.timing:
            event.recorded_at = None

            def stamp() -> CUresult:  # the time at which the stream reaches the event
                event.recorded_at = time.perf_counter_ns()
                return CUresult.CUDA_SUCCESS

            code = self._enqueue(hStream, stamp, "cuEventRecord")
            if code:
                return (code,)
        queue = self._queue_of(hStream)
        self._event_marks[int(hEvent)] = None if queue is None else (queue, queue.enqueued)
        return (CUresult.CUDA_SUCCESS,)

    def cuEventElapsedTime(self, hStart: Any, hEnd: Any) -> tuple[CUresult, float | None]:
        """Milliseconds between two timing events, by the host clock when the simulated streams reached them."""
        start, end = self._events.get(int(hStart)), self._events.get(int(hEnd))
        if start is None or end is None or not (start.timing and end.timing):
            return (CUresult.CUDA_ERROR_INVALID_HANDLE, None)
        if start.recorded_at is None or end.recorded_at is None:
            return (CUresult.CUDA_ERROR_NOT_READY, None)  # as CUDA: recorded work not yet done (or never recorded)
        return (CUresult.CUDA_SUCCESS, (end.recorded_at - start.recorded_at) / 1e6)

    def cuEventSynchronize(self, hEvent: Any) -> tuple[CUresult]:
        if int(hEvent) not in self._events:
            return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
        if self._capturing():
            return (self._invalidate_captures(CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED),)
        mark = self._event_marks.get(int(hEvent))
        return (CUresult.CUDA_SUCCESS if mark is None else self._drain(*mark),)

    def cuEventDestroy(self, hEvent: Any) -> tuple[CUresult]:
        found = self._events.pop(int(hEvent), None)
        self._event_marks.pop(int(hEvent), None)
        return (CUresult.CUDA_SUCCESS if found is not None else CUresult.CUDA_ERROR_INVALID_HANDLE,)
