"""Reference engines on a real GPU: pyrt's CUDA half, for real, without TensorRT.

:class:`DeviceMemory` gives :class:`~pyrt.sim.fake_tensorrt.FakeTensorRT`
the memory interface it uses on a :class:`~pyrt.sim.fake_cuda.FakeDriver`,
but over the real CUDA driver (through :class:`pyrt.cuda.Cuda`): engine weights
are real ``cuMemAlloc`` allocations, and an engine launch waits for the
launch stream's pending work, copies its inputs to the host, computes them
with the reference interpreter, and copies the outputs back before it
returns. Everything pyrt does around engines (device arenas, ``et_copy``
ops, DLPack and ``__cuda_array_interface__`` inputs, streams, events,
budgets) then runs against real device memory: the test of pyrt's CUDA half on
machines where no TensorRT flavour runs (TensorRT-RTX refuses Hopper GPUs;
docs/hardware.md).

>>> from pyrt.cuda import Cuda
>>> cuda = Cuda()
>>> if cuda.device_count():                               # doctest: +SKIP
...     trt = reference_tensorrt(cuda)                    # pass as Program(path, trt=trt)
"""

from __future__ import annotations

from typing import Any

import numpy as np

import pyrt.cuda as cuda_seam
from pyrt.errors import DeviceError
from pyrt.sim.fake_tensorrt import FakeTensorRT


class DeviceMemory:
    """The FakeDriver memory interface (view, owner, allocate_internal, ...) over real device memory."""

    def __init__(self, cuda: cuda_seam.Cuda) -> None:
        self.cuda = cuda
        self._pending: list[tuple[int, np.ndarray]] = []  # host copies to write back after a launch

    @property
    def gpus(self) -> int:
        return self.cuda.device_count()

    def free_memory(self, device: int) -> int:
        return self.cuda.mem_info(device)[0]

    def current_device(self) -> int | None:
        try:
            return int(self.cuda.call("cuCtxGetDevice"))
        except DeviceError:
            return None

    def owner(self, ptr: int) -> int | None:
        drv = self.cuda.driver
        try:
            return int(self.cuda.call("cuPointerGetAttribute",
                                      drv.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, int(ptr)))
        except DeviceError:
            return None

    def stream_device(self, stream: int) -> int | None:
        if int(stream) == 0:
            return self.current_device()
        try:
            return int(self.cuda.call("cuStreamGetDevice", int(stream)))
        except (DeviceError, AttributeError):
            return None

    def allocate_internal(self, nbytes: int, device: int) -> int | None:
        try:
            self.cuda.set_device(device)
            return int(self.cuda.call("cuMemAlloc", max(1, int(nbytes))))
        except DeviceError:
            return None

    def free_internal(self, ptr: int) -> None:
        try:
            self.cuda.call("cuMemFree", int(ptr))
        except DeviceError:
            pass

    # -- a launch ----------------------------------------------------------------------------
    def launch(self, stream: int, work: Any, what: str) -> bool:
        """Run ``work`` now, after the stream's queued work, on host copies written back after it."""
        self.cuda.call("cuStreamSynchronize", int(stream))
        self._pending.clear()
        try:
            message = work()
            if message is not None:
                raise DeviceError(f"{what}: {message}")
            for ptr, host in self._pending:
                if host.nbytes:
                    self.cuda.call("cuMemcpyHtoD", ptr, host, host.nbytes)
        finally:
            self._pending.clear()
        return True

    def view(self, ptr: int, nbytes: int, device: int) -> np.ndarray | None:
        """A host copy of ``[ptr, ptr + nbytes)``, written back when the launch ends."""
        if self.owner(ptr) != device or (nbytes and self.owner(ptr + nbytes - 1) != device):
            return None
        host = np.empty(nbytes, np.uint8)
        if nbytes:
            self.cuda.call("cuMemcpyDtoH", host, int(ptr), nbytes)
        self._pending.append((int(ptr), host))
        return host


def reference_tensorrt(cuda: cuda_seam.Cuda | None = None) -> Any:
    """A TensorRT module that runs pyrt reference engines on the real GPU behind ``cuda``."""
    return FakeTensorRT(DeviceMemory(cuda or cuda_seam.Cuda()))  # type: ignore[arg-type]
