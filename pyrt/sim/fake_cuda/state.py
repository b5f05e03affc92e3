"""The fake driver's state: devices, allocations, streams' queues, events and graphs, and the
checks every call starts with (initialised, a current context, a live stream).

:class:`DriverState` is the bottom of the fake driver's layers (state < queue < memory <
copies < streams < graphs < :class:`~pyrt.sim.fake_cuda.driver.FakeDriver`).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pyrt.sim.fake_cuda.handles import (
    CUdevice,
    CUevent,
    CUresult,
    CUstream,
)

ADDRESS_ALIGN = 256  # cuMemAlloc returns 256-byte aligned pointers
POISON = 0xCD  # fresh allocations are filled with this, never zeros: reads of unset memory show
LEGACY = (0, 1, 2)  # 0 and CU_STREAM_LEGACY (1): the legacy default stream; 2: per-thread (modelled alike)


SYNC = object()  # the "stream" of a synchronous call (cuMemcpyHtoD...): ordered after the legacy stream, then run


def legacy_key(device: int) -> int:
    """The key of a device's legacy-stream queue among the stream queues (stream handles are positive)."""
    return -1 - device

POISON_LIMIT = 16 << 20  # larger allocations stay lazily zeroed to spare host memory
EVENT_DISABLE_TIMING = 2  # CU_EVENT_DISABLE_TIMING
FREED_REMEMBERED = 1 << 16  # stream-ordered frees whose later use is still named as such (older: "no allocation")


@dataclass
class Op:
    fn: Callable[[], CUresult]
    what: str
    after: tuple[Queue, int] | None  # run that queue up to that many operations first


@dataclass
class Queue:
    device: int
    ops: collections.deque[Op] = field(default_factory=collections.deque)
    enqueued: int = 0
    done: int = 0
    fault: CUresult = CUresult.CUDA_SUCCESS
    capture: list[Op] | None = None  # operations recorded by stream capture (None: not capturing)
    capture_error: CUresult = CUresult.CUDA_SUCCESS  # what invalidated the capture


@dataclass
class Allocation:
    base: int
    device: int
    data: np.ndarray
    ready: bool = True  # False until its stream reaches a stream-ordered allocation (cuMemAllocAsync)
    freeing: bool = False  # a stream-ordered free (cuMemFreeAsync) is queued: no new work may use it


@dataclass
class _Device:
    index: int
    name: str
    capability: tuple[int, int]
    memory: int
    used: int = 0
    next_address: int = 0
    retained: int = 0
    bases: list[int] = field(default_factory=list)


class DriverState:
    """Everything the fake driver holds, the fake-only read-outs, and the checks calls begin with."""

    def __init__(
        self,
        gpus: int = 1,
        memory: int | list[int] = 16 << 30,
        *,
        name: str = "Fake GPU",
        capability: tuple[int, int] = (8, 9),
    ) -> None:
        sizes = list(memory) if isinstance(memory, (list, tuple)) else [memory] * gpus
        if len(sizes) != gpus:
            raise ValueError(f"memory lists {len(sizes)} sizes for {gpus} GPUs")
        self._devices = [
            _Device(i, f"{name} {i}", capability, size, next_address=(i + 1) << 40)
            for i, size in enumerate(sizes)
        ]
        self._allocations: dict[int, Allocation] = {}
        self._streams: dict[int, CUstream] = {}
        self._queues: dict[int, Queue] = {}  # stream handle -> its pending work
        self._event_marks: dict[int, tuple[Queue, int] | None] = {}  # event -> (queue, ops before it)
        self._graphs: dict[int, list[Op]] = {}
        self._graph_execs: dict[int, tuple[Op, ...]] = {}
        self.graph_launches = 0  # cuGraphLaunch calls that succeeded
        self.memory_pools = True  # False: devices without the stream-ordered allocator (cuMemAllocAsync and
        # cuMemFreeAsync fail with CUDA_ERROR_NOT_SUPPORTED, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED is 0)
        self.hazards: list[str] = []  # use-after-free of host memory, async faults: empty in correct code
        # base -> bytes of the latest allocations a stream-ordered free released (addresses are never reused)
        self._freed_async: dict[int, int] = {}
        self._events: dict[int, CUevent] = {}
        self._next_handle = 0x1000
        self._initialized = False
        self._local = threading.local()
        self._lock = threading.RLock()

    # -- fake-only helpers -------------------------------------------------
    @property
    def gpus(self) -> int:
        """Number of simulated devices."""
        return len(self._devices)

    def memory_used(self, device: int) -> int:
        """Bytes currently allocated on ``device``."""
        return self._devices[device].used

    def free_memory(self, device: int) -> int:
        """Bytes still free on ``device``."""
        dev = self._devices[device]
        return dev.memory - dev.used

    def live_allocations(self, device: int | None = None) -> int:
        """Number of live allocations (on ``device``, or on all)."""
        return sum(1 for a in self._allocations.values() if device is None or a.device == device)

    def current_device(self) -> int | None:
        """The device of this thread's current context, or None."""
        ctx = getattr(self._local, "ctx", None)
        return None if ctx is None else ctx.device


    def _is_running(self) -> int:
        """How deep this thread is in running queued work (0: it is queueing, or outside the driver)."""
        return getattr(self._local, "running", 0)

    def stream_device(self, stream: int) -> int | None:
        """The device of live stream ``stream`` (0 = legacy default stream: current device)."""
        if int(stream) in LEGACY:
            return self.current_device()
        handle = self._streams.get(int(stream))
        return None if handle is None else handle.device

    # -- internals ---------------------------------------------------------
    def _new_handle(self) -> int:
        self._next_handle += 0x10
        return self._next_handle

    def _ready(self) -> CUresult | None:
        """Error code unless cuInit ran and a context is current."""
        if not self._initialized:
            return CUresult.CUDA_ERROR_NOT_INITIALIZED
        if getattr(self._local, "ctx", None) is None:
            return CUresult.CUDA_ERROR_INVALID_CONTEXT
        return None

    def _context_device(self) -> int:
        """The current context's device; callers have checked :meth:`_ready` first."""
        device = self.current_device()
        if device is None:
            raise RuntimeError("fake cuda: no current context (call _ready() first)")
        return device

    def _device_of(self, dev: Any) -> _Device | None:
        if not isinstance(dev, CUdevice):
            return None
        index = int(dev)
        return self._devices[index] if 0 <= index < len(self._devices) else None

    def _stream_ok(self, stream: Any) -> bool:
        value = int(stream) if stream is not None else 0
        return value in LEGACY or value in self._streams
