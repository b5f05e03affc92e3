"""CUDA graphs: a method's device-only work captured once, then replayed with one launch.

A *segment* is a run of consecutive instruction steps that enqueue device work
only, on one device's stream, with shapes fixed at load: static TensorRT
delegates whose inputs and outputs all live in that device's memory. A segment
runs eagerly on its first run (TensorRT's first enqueue may allocate, and pyrt
checks shapes then), is captured on its second (``cuStreamBeginCapture`` ...
``cuGraphInstantiate``), and is replayed after that (``cuGraphLaunch``).
Everything else -- host kernels, host<->device copies, dynamic-shape engines --
runs eagerly between segments on the same stream, so stream order keeps it
correct. A budget change recreates execution contexts, so :meth:`reset` drops
every graph and the next runs capture again. A capture that the driver or
TensorRT refuses leaves that segment eager for good (logged once). A method that is
one segment with its inputs and outputs in device memory is replayed whole for
device callers, with the least host work per call: see :mod:`pyrt.runtime.graph_forward`.

>>> seg = Segment([], device=0)
>>> seg.state
'eager'
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from pyrt.errors import DeviceError
from pyrt.runtime.device_context import DeviceContext

_log = logging.getLogger("pyrt.runtime.cuda_graphs")
_CAPTURE_MODE_THREAD_LOCAL = 1  # CU_STREAM_CAPTURE_MODE_THREAD_LOCAL


def graph_device(step: Callable[[], None]) -> int | None:
    """The device a step's work is confined to, when it may be captured (else None)."""
    return getattr(step, "graph_device", None)


def mark_capturable(step: Callable[[], None], device: int) -> None:
    """Declare that ``step`` only enqueues work on ``device``'s stream, with fixed shapes and addresses."""
    setattr(step, "graph_device", device)  # noqa: B010 - an attribute of a closure


def refuse_capture(step: Callable[[], None], reason: str | None) -> None:
    """Say why ``step`` may never be captured (logged when CUDA graphs are on); None: nothing to say."""
    if reason:
        setattr(step, "graph_refusal", reason)  # noqa: B010 - an attribute of a closure


def data_dependent_refusal(engine: str, bindings: Sequence[Any]) -> str | None:
    """Why an engine whose outputs have data-dependent shapes is never captured, or None for another engine.

    Such an output is -1 in a dim while every input is static: TensorRT learns its size while
    running (through the output allocator, ``pyrt.device.output_allocator``) and the host must
    resize the output before the next step reads it, which a replayed graph cannot do.
    """
    if any(-1 in b.shape for b in bindings if b.is_input):
        return None
    outs = [b.name for b in bindings if not b.is_input and -1 in b.shape]
    if not outs:
        return None
    return (f"{engine}: outputs {outs} have data-dependent shapes (TensorRT reports them while running, through "
            "its output allocator, and pyrt resizes them on the host), so it is not captured in a CUDA graph "
            "and runs eagerly")


class Segment:
    """Steps replayed as one CUDA graph; ``state`` is "eager", "warm", "graph" or "refused"."""

    def __init__(self, steps: Sequence[Callable[[], None]], *, device: int,
                 devices: DeviceContext | None = None) -> None:
        self.steps = list(steps)
        self.device = device
        self.devices = devices
        self.state = "eager"
        self._graph: Any = None
        self._exec: Any = None

    @property
    def _ctx(self) -> DeviceContext:
        assert self.devices is not None, "a segment of device steps runs on its method's device context"
        return self.devices

    @property
    def graph_exec(self) -> Any:
        """The instantiated graph (``cuGraphLaunch`` it on any stream of the device), or None before capture."""
        return self._exec if self.state == "graph" else None

    def __call__(self) -> None:
        if self.state == "graph":
            stream = self._ctx.stream(self.device)
            self._ctx.cuda.call("cuGraphLaunch", self._exec, stream.raw)
            return
        if self.state == "warm":
            self._capture()
            if self.state == "graph":
                stream = self._ctx.stream(self.device)
                self._ctx.cuda.call("cuGraphLaunch", self._exec, stream.raw)
                return
        for step in self.steps:
            step()
        if self.state == "eager":
            self.state = "warm"

    def _capture(self) -> None:
        cuda, stream = self._ctx.cuda, self._ctx.stream(self.device)
        cuda.set_device(self.device)
        try:
            cuda.call("cuStreamBeginCapture", stream.raw, _CAPTURE_MODE_THREAD_LOCAL)
        except DeviceError as exc:
            self._refuse(f"cuStreamBeginCapture: {exc}")
            return
        failure = None
        try:
            for step in self.steps:
                step()
        except Exception as exc:  # a refused call inside the capture: the capture is void, nothing ran
            failure = f"{type(exc).__name__}: {exc}"
        try:
            graph = cuda.call("cuStreamEndCapture", stream.raw)
        except DeviceError as exc:
            self._refuse(failure or str(exc))
            return
        if failure is not None:
            cuda.call("cuGraphDestroy", graph)
            self._refuse(failure)
            return
        self._graph = graph
        self._exec = cuda.call("cuGraphInstantiate", graph, 0)
        self.state = "graph"

    def _refuse(self, why: str) -> None:
        _log.warning("CUDA graph capture of %d step(s) on device %d refused, running them eagerly: %s",
                     len(self.steps), self.device, why)
        self.state = "refused"

    def reset(self) -> None:
        """Drop the graph (contexts were recreated): the next runs warm up and capture again."""
        cuda = self.devices.cuda if self.devices is not None else None
        if cuda is not None:
            if self._exec is not None:
                cuda.call("cuGraphExecDestroy", self._exec)
            if self._graph is not None:
                cuda.call("cuGraphDestroy", self._graph)
        self._graph = self._exec = None
        if self.state != "refused":
            self.state = "eager"


def segment_steps(steps: Sequence[Callable[[], None]],
                  devices: DeviceContext | None) -> tuple[list[Callable[[], None]], list[Segment]]:
    """Group consecutive capturable steps on one device into segments; other steps stay as they are."""
    out: list[Callable[[], None]] = []
    segments: list[Segment] = []
    run: list[Callable[[], None]] = []
    run_device: int | None = None

    def flush() -> None:
        nonlocal run, run_device
        if run and run_device is not None:
            seg = Segment(run, device=run_device, devices=devices)
            segments.append(seg)
            out.append(seg)
        run, run_device = [], None

    for step in steps:
        device = graph_device(step)
        refusal = getattr(step, "graph_refusal", None)
        if refusal:
            _log.info("CUDA graphs: %s", refusal)
        if device is None or (run_device is not None and device != run_device):
            flush()
        if device is None:
            out.append(step)
        else:
            run.append(step)
            run_device = device
    flush()
    return out, segments
