"""The fake driver's asynchronous engine: per-stream queues of work that runs only when waited for.

Work queued on a stream runs when something synchronises with it (a stream or event sync,
a context sync, cuMemFree, or queued work on another stream that waits on an event);
during stream capture it is recorded instead. The legacy default stream (0) is such a queue
too, one per device: asynchronous work on it waits like any other, and a synchronous call
(cuMemcpyHtoD...) first runs what the legacy stream has queued, as CUDA orders it there.
pyrt's own streams are non-blocking, so only events order them with the legacy stream.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyrt.sim.fake_cuda.handles import (
    CUresult,
)
from pyrt.sim.fake_cuda.state import (
    LEGACY,
    SYNC,
    DriverState,
    Op,
    Queue,
    legacy_key,
)


class QueueDriver(DriverState):
    """Queues work on streams, runs it when waited for, and records it while a stream is captured."""

    def launch(self, stream: int, work: Callable[[], str | None], what: str) -> bool:
        """Queue ``work`` (an engine launch of the fake TensorRT) on ``stream``; False for a dead stream.

        ``work`` returns None, or an error message, which becomes an asynchronous fault
        reported by the next synchronisation (and recorded in :attr:`hazards`).
        """
        if not self._stream_ok(stream):
            return False

        def run() -> CUresult:
            message = work()
            if message is None:
                return CUresult.CUDA_SUCCESS
            self.hazards.append(f"{what}: {message}")
            return CUresult.CUDA_ERROR_ILLEGAL_ADDRESS

        return self._enqueue(stream, run, what) == CUresult.CUDA_SUCCESS

    def pending(self, stream: int | None = None) -> int:
        """Operations queued and not yet run (on ``stream``, or on all streams)."""
        queues = self._queues.values() if stream is None else [self._queue_of(stream)]
        return sum(len(q.ops) for q in queues if q is not None)

    # -- the asynchronous engine -----------------------------------------------
    def _enqueue(self, stream: Any, fn: Callable[[], CUresult], what: str,
                 after: tuple[Queue, int] | None = None) -> CUresult:
        if stream is SYNC:  # a synchronous call: after the legacy stream's queued work, then at once
            if self._capturing():
                return self._invalidate_captures(CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
            self._note(self._drain(self._legacy_queue()), f"legacy-stream work before {what}")
            if after is not None:
                self._drain(*after)
            self._local.running = self._is_running() + 1
            try:
                self._note(fn(), what)
            finally:
                self._local.running -= 1
            return CUresult.CUDA_SUCCESS
        handle = int(stream) if stream is not None else 0
        if handle in LEGACY:  # the legacy (or per-thread) default stream: queued like any other, never captured
            if self._capturing():
                return self._invalidate_captures(CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
            queue = self._legacy_queue()
            queue.ops.append(Op(fn, what, after))
            queue.enqueued += 1
            return CUresult.CUDA_SUCCESS
        queue = self._queues[handle]
        if queue.capture is not None:
            if after is not None and after[0] is not queue:  # an event from outside the capture
                return self._invalidate(queue, CUresult.CUDA_ERROR_STREAM_CAPTURE_ISOLATION)
            queue.capture.append(Op(fn, what, None))
            return CUresult.CUDA_SUCCESS
        queue.ops.append(Op(fn, what, after))
        queue.enqueued += 1
        return CUresult.CUDA_SUCCESS

    def _legacy_queue(self, device: int | None = None) -> Queue:
        """The current (or ``device``'s) context's legacy default stream; pyrt's non-blocking streams never
        synchronise with it implicitly: only events, stream and context synchronisation and synchronous calls do."""
        device = self._context_device() if device is None else device
        key = legacy_key(device)
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = Queue(device)
        return queue

    def _queue_of(self, stream: Any) -> Queue | None:
        """The queue of ``stream`` (0, 1, 2: the current context's legacy stream), None for an unknown one."""
        handle = int(stream) if stream is not None else 0
        if handle not in LEGACY:
            return self._queues.get(handle)
        device = self.current_device()  # no current context: no legacy stream to have queued anything on
        return None if device is None else self._legacy_queue(device)

    def _capturing(self) -> bool:
        return any(q.capture is not None for q in self._queues.values())

    def _invalidate(self, queue: Queue, code: CUresult) -> CUresult:
        queue.capture_error = queue.capture_error or code
        return code

    def _invalidate_captures(self, code: CUresult) -> CUresult:
        """An unsafe call while a capture is under way (thread-local mode): it fails the capture."""
        for queue in self._queues.values():
            if queue.capture is not None:
                self._invalidate(queue, code)
        return code

    def _drain(self, queue: Queue, upto: int | None = None) -> CUresult:
        """Run ``queue``'s work up to its ``upto``-th operation (all of it when None)."""
        target = queue.enqueued if upto is None else upto
        result = CUresult.CUDA_SUCCESS
        while queue.done < target and queue.ops:
            op = queue.ops.popleft()
            queue.done += 1
            if op.after is not None:
                self._drain(*op.after)
            self._local.running = self._is_running() + 1
            try:
                code = op.fn()
            finally:
                self._local.running -= 1
            if code != CUresult.CUDA_SUCCESS:
                queue.fault = queue.fault or code
        if queue.fault:
            result, queue.fault = queue.fault, CUresult.CUDA_SUCCESS
        return result

    def _drain_device(self, device: int) -> CUresult:
        result = CUresult.CUDA_SUCCESS
        for handle in list(self._queues):
            queue = self._queues.get(handle)
            if queue is not None and queue.device == device:
                code = self._drain(queue)
                result = result if result != CUresult.CUDA_SUCCESS else code
        return result

    def _note(self, code: CUresult, what: str) -> None:
        if code != CUresult.CUDA_SUCCESS:
            self.hazards.append(f"{what}: {code.name}")

