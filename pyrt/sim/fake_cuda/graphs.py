"""The fake driver's stream capture and CUDA graphs: capture records a stream's work, a launch of
the instantiated graph queues it again (it reads its inputs when it runs).
"""

from __future__ import annotations

from typing import Any

from pyrt.sim.fake_cuda.handles import (
    CUgraph,
    CUgraphExec,
    CUresult,
    CUstreamCaptureStatus,
    Handle,
)
from pyrt.sim.fake_cuda.state import (
    LEGACY,
)
from pyrt.sim.fake_cuda.streams import StreamDriver


class GraphDriver(StreamDriver):
    """cuStreamBeginCapture / cuStreamEndCapture and cuGraph*."""

    def cuStreamBeginCapture(self, hStream: Any, mode: Any) -> tuple[CUresult]:
        handle = int(hStream) if hStream is not None else 0
        if handle in LEGACY:
            return (CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,)
        queue = self._queues.get(handle)
        if queue is None:
            return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
        if queue.capture is not None:
            return (CUresult.CUDA_ERROR_ILLEGAL_STATE,)
        queue.capture, queue.capture_error = [], CUresult.CUDA_SUCCESS
        return (CUresult.CUDA_SUCCESS,)

    def cuStreamIsCapturing(self, hStream: Any) -> tuple[CUresult, CUstreamCaptureStatus | None]:
        handle = int(hStream) if hStream is not None else 0
        queue = self._queues.get(handle)
        if handle in LEGACY or (queue is not None and queue.capture is None):
            return (CUresult.CUDA_SUCCESS, CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE)
        if queue is None:
            return (CUresult.CUDA_ERROR_INVALID_HANDLE, None)
        if queue.capture_error:
            return (CUresult.CUDA_SUCCESS, CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_INVALIDATED)
        return (CUresult.CUDA_SUCCESS, CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE)

    def cuStreamEndCapture(self, hStream: Any) -> tuple[CUresult, CUgraph | None]:
        queue = self._queues.get(int(hStream) if hStream is not None else 0)
        if queue is None or queue.capture is None:
            return (CUresult.CUDA_ERROR_ILLEGAL_STATE, None)
        ops, error = queue.capture, queue.capture_error
        queue.capture, queue.capture_error = None, CUresult.CUDA_SUCCESS
        if error:
            return (CUresult.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, None)
        graph = CUgraph(self._new_handle(), queue.device)
        self._graphs[int(graph)] = list(ops)
        return (CUresult.CUDA_SUCCESS, graph)

    def cuGraphInstantiate(self, hGraph: Any, flags: int) -> tuple[CUresult, CUgraphExec | None]:
        ops = self._graphs.get(int(hGraph))
        if ops is None:
            return (CUresult.CUDA_ERROR_INVALID_VALUE, None)
        graph_exec = CUgraphExec(self._new_handle(), hGraph.device if isinstance(hGraph, Handle) else 0)
        self._graph_execs[int(graph_exec)] = tuple(ops)
        return (CUresult.CUDA_SUCCESS, graph_exec)

    def cuGraphLaunch(self, hGraphExec: Any, hStream: Any) -> tuple[CUresult]:
        ops = self._graph_execs.get(int(hGraphExec))
        if ops is None or not self._stream_ok(hStream):
            return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
        for op in ops:  # the recorded work, queued again: it reads its inputs when it runs
            code = self._enqueue(hStream, op.fn, f"graph: {op.what}")
            if code:
                return (code,)
        self.graph_launches += 1
        return (CUresult.CUDA_SUCCESS,)

    def cuGraphExecDestroy(self, hGraphExec: Any) -> tuple[CUresult]:
        found = self._graph_execs.pop(int(hGraphExec), None)
        return (CUresult.CUDA_SUCCESS if found is not None else CUresult.CUDA_ERROR_INVALID_VALUE,)

    def cuGraphDestroy(self, hGraph: Any) -> tuple[CUresult]:
        found = self._graphs.pop(int(hGraph), None)
        return (CUresult.CUDA_SUCCESS if found is not None else CUresult.CUDA_ERROR_INVALID_VALUE,)
