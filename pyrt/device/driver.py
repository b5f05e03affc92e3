"""The CUDA driver half of :class:`pyrt.cuda.Cuda`: checked driver calls, devices, contexts, frees.

:class:`CudaDriver` holds one driver module with the surface of ``cuda.bindings.driver``
(imported lazily, or a fake from :mod:`pyrt.sim.fake_cuda`), checks every return code
(a failure is a :class:`~pyrt.errors.DeviceError` naming the call and the CUDA error name),
enumerates devices, retains their primary contexts and frees device memory.
:class:`~pyrt.device.memory.DeviceAllocation` and the stream/event handles of
:mod:`pyrt.device.streams` call back into it; :class:`pyrt.cuda.Cuda` adds allocation,
copies, streams and events on top.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from pyrt.checks import is_int
from pyrt.errors import DeviceError

_NAME_LEN = 256  # bytes asked of cuDeviceGetName
_LEGACY_STREAMS = 3  # handles below: the legacy default stream (0, CU_STREAM_LEGACY = 1), the per-thread one (2)


@dataclass(frozen=True)
class DeviceInfo:
    """One CUDA device as the driver reports it."""

    index: int
    name: str
    compute_capability: tuple[int, int]
    total_memory: int

    def __str__(self) -> str:
        major, minor = self.compute_capability
        return f"{self.index}: {self.name} (sm_{major}{minor}, {self.total_memory >> 20} MiB)"


class CudaDriver:
    """Checked calls into one driver module, device queries and primary contexts (see :class:`pyrt.cuda.Cuda`)."""

    def __init__(self, driver: ModuleType | Any | None = None) -> None:
        self._driver = driver
        self._lock = threading.Lock()
        self._initialized = False
        self._count = 0
        self._why_none = ""
        self._devices: list[DeviceInfo] | None = None
        self._handles: dict[int, Any] = {}
        self._contexts: dict[int, Any] = {}
        self._pools: dict[int, bool] = {}

    # -- driver plumbing -------------------------------------------------
    @property
    def driver(self) -> Any:
        """The driver module (imported on first use)."""
        if self._driver is None:
            try:
                from cuda.bindings import driver
            except ImportError as exc:
                raise DeviceError(f"cuda-python is not installed ({exc}); no CUDA devices") from exc
            self._driver = driver
        return self._driver

    def call(self, name: str, *args: Any) -> Any:
        """Call driver function ``name``; raise DeviceError unless it returns CUDA_SUCCESS.

        Returns the call's outputs: None, one value, or a tuple of values.
        """
        driver = self._driver if self._driver is not None else self.driver
        try:
            result = getattr(driver, name)(*args)
        except DeviceError:
            raise
        except Exception as exc:  # the binding raises for a missing driver library, bad types
            raise DeviceError(f"{name} failed: {type(exc).__name__}: {exc}") from exc
        if result[0]:  # CUresult is an int enum: CUDA_SUCCESS is 0
            raise DeviceError(f"{name} failed with {self.error_name(result[0])}")
        n = len(result)
        if n == 1:
            return None
        return result[1] if n == 2 else tuple(result[1:])

    def error_name(self, code: Any) -> str:
        """The CUDA error name for a CUresult (works without a loaded driver library)."""
        try:
            return str(self.driver.CUresult(int(code)).name)
        except Exception:  # an unknown code still gets a readable name
            return f"CUresult {int(code)}"

    def _init(self) -> None:
        with self._lock:
            if self._initialized:
                return
            self._initialized = True
            try:
                self.call("cuInit", 0)
                self._count = int(self.call("cuDeviceGetCount"))
            except DeviceError as exc:
                self._count, self._why_none = 0, str(exc)
            if self._count == 0 and not self._why_none:
                self._why_none = "the driver reports no devices"

    # -- devices ---------------------------------------------------------
    def device_count(self) -> int:
        """Number of CUDA devices; 0 (never an exception) without a driver or GPU."""
        self._init()
        return self._count

    def devices(self) -> list[DeviceInfo]:
        """Every device's name, compute capability and memory."""
        if self._devices is None:
            self._devices = [self._query(i) for i in range(self.device_count())]
        return list(self._devices)

    def _query(self, index: int) -> DeviceInfo:
        dev = self._handle(index)
        raw = self.call("cuDeviceGetName", _NAME_LEN, dev)
        name = bytes(raw).split(b"\0", 1)[0].decode("utf-8", "replace")
        attr = self.driver.CUdevice_attribute
        major = self.call("cuDeviceGetAttribute", attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
        minor = self.call("cuDeviceGetAttribute", attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
        total = self.call("cuDeviceTotalMem", dev)
        return DeviceInfo(index, name, (int(major), int(minor)), int(total))

    def describe_devices(self) -> str:
        """A one-line list of present devices (or why there are none) for error messages."""
        if self.device_count() == 0:
            return f"no CUDA devices are present ({self._why_none}){_simulation_hint()}"
        return "present devices: " + "; ".join(str(d) for d in self.devices())

    def require_device(self, index: int, *, purpose: str = "") -> DeviceInfo:
        """Return device ``index``'s info, or raise DeviceError listing the devices present."""
        if not is_int(index):
            raise DeviceError(f"CUDA device index must be an int, got {index!r}")
        index = int(index)
        count = self.device_count()
        if not 0 <= index < count:
            what = f" (needed for {purpose})" if purpose else ""
            raise DeviceError(f"CUDA device {index} does not exist{what}; {self.describe_devices()}")
        return self.devices()[index]

    def _handle(self, index: int) -> Any:
        if index not in self._handles:
            self._handles[index] = self.call("cuDeviceGet", index)
        return self._handles[index]

    def context(self, index: int) -> Any:
        """The retained primary context of device ``index`` (retained once, kept for life)."""
        ctx = self._contexts.get(index)  # a dict read is atomic: the lock guards creation only
        if ctx is None:
            self.require_device(index)
            ctx = self.call("cuDevicePrimaryCtxRetain", self._handle(index))
            with self._lock:
                self._contexts.setdefault(index, ctx)
                ctx = self._contexts[index]
        return ctx

    def memory_pools(self, index: int) -> bool:
        """Whether device ``index`` has the stream-ordered allocator (``cuMemAllocAsync``; asked once)."""
        found = self._pools.get(index)
        if found is None:
            self.require_device(index)
            attr = self.driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED
            found = self._pools[index] = bool(self.call("cuDeviceGetAttribute", attr, self._handle(index)))
        return found

    def set_device(self, index: int) -> None:
        """Make device ``index``'s primary context current on this thread."""
        self.call("cuCtxSetCurrent", self.context(index))

    def synchronize(self, index: int) -> None:
        """Wait for all work on device ``index``."""
        self.set_device(index)
        self.call("cuCtxSynchronize")

    def mem_info(self, index: int) -> tuple[int, int]:
        """(free, total) bytes of device ``index``."""
        self.set_device(index)
        free, total = self.call("cuMemGetInfo")
        return int(free), int(total)

    # -- memory ----------------------------------------------------------
    def free_memory(self, ptr: int, device: int) -> None:
        """``cuMemFree(ptr)`` with device ``device``'s context current (it synchronises the device)."""
        self.set_device(device)
        self.call("cuMemFree", ptr)

    def free_async(self, ptr: int, device: int, stream: int) -> None:
        """``cuMemFreeAsync(ptr, stream)``: a stream-ordered free of the memory at ``ptr``, no host synchronisation.

        The memory is released when stream handle ``stream`` reaches the free, so work queued on
        it before still reads valid memory; work on other streams must be ordered before it by
        the caller. A stream other than the legacy default ones (handles 0-2) names its own
        context; for those, device ``device``'s context is made current first. The same calls and
        errors as ``set_device`` and ``call``, inlined: this runs once per dropped output of every forward.
        """
        driver = self._driver if self._driver is not None else self.driver
        try:
            if stream < _LEGACY_STREAMS and (result := driver.cuCtxSetCurrent(self.context(device)))[0]:
                raise DeviceError(f"cuCtxSetCurrent failed with {self.error_name(result[0])}")
            result = driver.cuMemFreeAsync(ptr, stream)
        except DeviceError:
            raise
        except Exception as exc:  # the binding raises for a missing driver library, bad types
            raise DeviceError(f"cuMemFreeAsync failed: {type(exc).__name__}: {exc}") from exc
        if result[0]:
            raise DeviceError(f"cuMemFreeAsync failed with {self.error_name(result[0])}")


CPU_EXPORT = ("a file of TensorRT engines (pyrt export's default builder) needs a GPU: for a machine without one, "
              "export with --builder portable (ExecuTorch's CPU kernels, no engines) or --builder reference (pyrt's "
              "reference engines, which run on simulated GPUs)")


def _simulation_hint() -> str:
    """Where no GPU is, what runs without one: a CPU export, and reference-engine programs on simulated GPUs
    (``import pyrt`` reads the variable)."""
    value = os.environ.get("PYRT_SIMULATED_GPUS", "").strip()
    if value and not value.isdigit():
        return f"; PYRT_SIMULATED_GPUS={value!r} is not a whole number of GPUs, so none are simulated"
    if value:
        return ""
    return (f"; {CPU_EXPORT}; to run programs of reference engines, set PYRT_SIMULATED_GPUS=1 before pyrt is "
            "imported, or run inside pyrt.sim.simulated_gpus(1)")
