"""One run's state for device work, and the shapes of the per-input setters and per-output getters.

:class:`RunState` is made by :class:`pyrt.runtime.executor.MethodRunner` for every run that
touches CUDA (the caller's stream, streams in use, objects to keep alive) and handed to the
input setters (:mod:`pyrt.runtime.inputs`), the delegates and the output getters
(:mod:`pyrt.runtime.outputs`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

from pyrt.errors import ExecutionError
from pyrt.memory.interop import CAI, caller_kind, is_torch_tensor
from pyrt.runtime.device_context import DeviceContext

Setter = Callable[[Any, "RunState | None"], None]
Getter = Callable[[str, "RunState | None"], Any]


class RunState:
    """Per-run facts for device work: the caller's stream, streams in use, objects to keep alive.

    ``device_caller``: some input lives in CUDA memory, so device outputs stay on the device.
    """

    __slots__ = ("stream", "keepalive", "streams", "device_caller", "ctx", "cuda")

    def __init__(self, stream: Any = None, inputs: Sequence[Any] = (), ctx: DeviceContext | None = None,
                 cuda: Any = None) -> None:
        self.stream = stream
        self.ctx = ctx  # its stream(device) orders every copy of the run
        self.cuda = ctx.cuda if ctx is not None else cuda  # the CUDA seam the program was loaded with
        self.keepalive: list[Any] = []
        self.streams: dict[int, Any] = {}
        self.device_caller = any(caller_kind(x) == CAI or (is_torch_tensor(x) and x.is_cuda) for x in inputs)


class DeviceRun(RunState):
    """The type of a :class:`RunState` of device work, its ``ctx`` set: what :func:`device_state`
    checks and returns (for the type checker: no instance of it is made)."""

    __slots__ = ()
    ctx: DeviceContext


def device_state(state: RunState | None) -> DeviceRun:
    """The run state of device work (MethodRunner makes one whenever the method touches CUDA)."""
    if state is None or state.ctx is None:
        raise ExecutionError("internal error: device work without a run state")
    return cast(DeviceRun, state)  # its ctx is set: checked above


__all__ = ["DeviceRun", "Getter", "RunState", "Setter", "device_state"]
