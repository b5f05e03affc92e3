"""Output handling: one getter per method output, built at load, that hands a result back in the caller's kind.

Host results are copied out (torch in -> torch out, numpy in -> numpy out; a static host
tensor through a getter made once); device results become a fresh device buffer the caller
owns, stream-ordered where memory pools allow, or a host copy for host callers (the one place
a run synchronises).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pyrt.cuda import DeviceAllocation
from pyrt.errors import UnsupportedOperatorError
from pyrt.memory.host import TorchHost, host_output, torch_to_numpy
from pyrt.memory.interop import NUMPY, TORCH, device_output
from pyrt.memory.layout import numpy_dtype
from pyrt.memory.tensors import DeviceTensor, OwnedDeviceTensor
from pyrt.runtime.plan import MethodPlan
from pyrt.runtime.run_state import Getter, RunState, device_state


def output_getter(plan: MethodPlan, pos: int, i: int) -> Getter:
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


def _device_copy(t: DeviceTensor, kind: str, run: RunState | None) -> Any:
    """Device output: a fresh device buffer the caller owns (or a host copy for host callers)."""
    state = device_state(run)
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


__all__ = ["output_getter"]
