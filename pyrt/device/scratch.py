"""Activation memory shared by TensorRT engines that never run at the same time.

TensorRT gives each execution context its own activation memory unless the caller
owns it (``ExecutionContextAllocationStrategy.USER_MANAGED``, then
``context.set_device_memory(ptr, size)``). Engines of one method on one device run
one after another on one stream, under the method's lock, so they can use the same
bytes: a :class:`SharedScratch` is one device allocation sized to the largest
``device_memory_size_v2`` of its members (the largest over each engine's
optimization profiles), allocated when the first context binds it and grown (a new
allocation, every live member rebound to it, then the old one freed) when a budget
change makes a member need more. Engines that can run concurrently (different
methods, hence different locks and streams) get different scratches.

>>> from pyrt.sim import simulated_gpus
>>> with simulated_gpus(1) as sim:
...     scratch = SharedScratch(sim.cuda, 0, "forward")
...     scratch.nbytes, scratch.saved_bytes
(0, 0)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from pyrt.errors import DeviceError, EngineError

ALIGN = 256  # TensorRT wants activation memory 256-byte aligned (cuMemAlloc gives at least that)


class Member(Protocol):
    """What a scratch uses of the engines that share it (:class:`pyrt.engine.TensorRTEngine`, built on this module)."""

    name: str
    device: int

    @property
    def activation_bytes(self) -> int: ...

    @property
    def closed(self) -> bool: ...

    @property
    def has_context(self) -> bool: ...

    def bind_activation_memory(self, ptr: int, size: int) -> None: ...


@dataclass(frozen=True)
class ScratchInfo:
    """One shared activation area: ``nbytes`` held, what one area per engine would hold, the difference."""

    label: str
    device: int
    engines: tuple[str, ...]
    nbytes: int
    unshared_bytes: int
    saved_bytes: int


class SharedScratch:
    """One device allocation of activation memory for a group of engines that take turns."""

    def __init__(self, cuda: Any, device: int, label: str) -> None:
        self._cuda = cuda
        self.device = device
        self.label = label
        self._members: list[Member] = []  # in join order
        self._allocation: Any = None

    def join(self, engine: Member) -> None:
        """Add ``engine`` (on this scratch's device) to the group; its contexts will bind this memory."""
        if engine.device != self.device:
            raise DeviceError(f"{engine.name} lives on device {engine.device}; the shared activation memory "
                              f"of {self.label} is on device {self.device}")
        if engine not in self._members:
            self._members.append(engine)

    @property
    def members(self) -> list[Member]:
        return list(self._members)

    @property
    def nbytes(self) -> int:
        """Bytes allocated now (0 until a context needs any)."""
        return 0 if self._allocation is None else int(self._allocation.nbytes)

    def need(self) -> int:
        """Bytes the group needs: the largest member's activation memory, 256-byte rounded."""
        largest = max((e.activation_bytes for e in self._members if not e.closed), default=0)
        return -(-largest // ALIGN) * ALIGN

    @property
    def unshared_bytes(self) -> int:
        """What the members would hold with a static allocation each."""
        return sum(-(-e.activation_bytes // ALIGN) * ALIGN for e in self._members if not e.closed)

    @property
    def saved_bytes(self) -> int:
        """Device bytes sharing saves over one allocation per engine."""
        return max(0, self.unshared_bytes - self.need())

    def reserve(self, engine: Member) -> tuple[int, int]:
        """(address, size) for ``engine``'s new context, growing the allocation first if it is short.

        Growing rebinds every other member's live context to the new memory before the old is
        freed; callers reconfigure with no run in flight (load, ``set_budget``).
        """
        self.join(engine)
        need = self.need()
        if need and need > self.nbytes:
            old = self._allocation
            try:
                self._allocation = self._cuda.alloc(need, self.device)
            except DeviceError as exc:
                raise DeviceError(f"{self.label}: could not allocate {need} bytes of shared activation memory on "
                                  f"device {self.device} for {[e.name for e in self._members]}: {exc}") from exc
            for other in self._members:
                if other is not engine and other.has_context:
                    other.bind_activation_memory(int(self._allocation.ptr), self.nbytes)
            if old is not None:
                old.free()
        if self._allocation is None:
            return 0, 0
        return int(self._allocation.ptr), self.nbytes

    def info(self) -> ScratchInfo:
        return ScratchInfo(self.label, self.device, tuple(e.name for e in self._members if not e.closed),
                           self.nbytes, self.unshared_bytes, self.saved_bytes)

    def close(self) -> None:
        """Free the memory (its members' contexts must be gone or unused from now on)."""
        if self._allocation is not None:
            self._allocation.free()
            self._allocation = None
        self._members.clear()

    def __repr__(self) -> str:
        return (f"SharedScratch({self.label!r}, device={self.device}, {self.nbytes} bytes, "
                f"{len(self._members)} engines, saves {self.saved_bytes})")


def check_bound(engine: Member, error: str) -> None:
    """EngineError naming the engine when TensorRT logged ``error`` while binding activation memory."""
    if error:
        raise EngineError(f"{engine.name}: TensorRT refused the shared activation memory: {error}")
