"""A fake CUDA driver with the surface of ``cuda.bindings.driver`` that pyrt uses.

"Device memory" is host memory (numpy byte arrays) at synthetic addresses:
device ``d`` hands out addresses from ``(d + 1) << 40`` upward, so a host
pointer or another device's pointer used by mistake is caught, not silently
read. Like the real binding, every function returns a tuple whose first item
is a :class:`CUresult`. It is deliberately strict where real CUDA would only
misbehave: a memcpy whose device pointer does not belong to the current
context's device fails with ``CUDA_ERROR_INVALID_VALUE`` (cross-device copies
must use ``cuMemcpyPeer``).

Streams are asynchronous, and adversarially so: work queued on a stream
(``*Async`` copies, engine launches from the fake TensorRT) runs only when
something waits for it -- ``cuStreamSynchronize``, ``cuEventSynchronize`` of
an event recorded after it, ``cuCtxSynchronize``, ``cuMemFree``, or another
stream's queued work that waits on such an event (``cuStreamWaitEvent``).
Work that nothing waits for stays queued, so a missing event between
streams, or a missing sync before the host reads a copy's result, gives a
wrong answer on the fake as it can on a GPU. Synchronous copies do not wait
for non-blocking streams (pyrt's streams are created non-blocking), as in
CUDA. Host memory handed to an asynchronous copy is treated as pinned (the
copy reads or writes it when it runs): if the buffer's owner has been freed
by then, the copy writes poison instead and the hazard is recorded in
:attr:`FakeDriver.hazards`.
Stream-ordered memory (``cuMemAllocAsync`` / ``cuMemFreeAsync``) follows the
same queues: the allocation may be named by work queued after it but touched
only once its stream has reached it, and a free releases (and poisons) the
memory only when its stream reaches it; work that runs on another stream,
unordered, before the allocation or after the free is a hazard too.

>>> drv = FakeDriver(gpus=1, memory=1 << 20)
>>> drv.cuInit(0)[0] == CUresult.CUDA_SUCCESS
True
>>> drv.cuDeviceGet(5)[0].name
'CUDA_ERROR_INVALID_DEVICE'

The package: :mod:`.handles` (result codes, enums, handles), :mod:`.state` (what the driver
holds), :mod:`.queue` (the asynchronous engine), :mod:`.memory`, :mod:`.copies`,
:mod:`.streams` (and events), :mod:`.graphs` (capture), :mod:`.driver` (devices, contexts and
:class:`FakeDriver`), each layer a subclass of the one before. It imports only numpy and the
standard library.
"""

from __future__ import annotations

from pyrt.sim.fake_cuda.driver import FakeDriver
from pyrt.sim.fake_cuda.handles import (
    CUcontext,
    CUdevice,
    CUdevice_attribute,
    CUdeviceptr,
    CUevent,
    CUgraph,
    CUgraphExec,
    CUpointer_attribute,
    CUresult,
    CUstream,
    CUstreamCaptureStatus,
)

__all__ = [
    "FakeDriver", "CUresult", "CUdevice_attribute", "CUpointer_attribute", "CUstreamCaptureStatus", "CUdevice",
    "CUcontext", "CUstream", "CUevent", "CUdeviceptr", "CUgraph", "CUgraphExec",
]
