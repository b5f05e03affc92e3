"""The CUDA seam as users import it: ``pyrt.cuda.Cuda``, ``pyrt.cuda.use_driver``, ``pyrt.cuda.alloc`` and the rest.

The seam itself is :mod:`pyrt.device.cuda_seam` (inside the device package, so the device
modules use it without an import up to this root module); this module re-exports its public
names, the same objects: ``pyrt.cuda.use_driver(fake)`` routes every pyrt CUDA call.

>>> import pyrt.cuda
>>> from pyrt.device import cuda_seam
>>> pyrt.cuda.current is cuda_seam.current and pyrt.cuda.Cuda is cuda_seam.Cuda
True
"""

from __future__ import annotations

from pyrt.device.cuda_seam import (
    Cuda,
    DeviceAllocation,
    DeviceInfo,
    Event,
    Stream,
    StreamAllocation,
    alloc,
    current,
    device_count,
    devices,
    event,
    memcpy_dtod,
    memcpy_dtoh,
    memcpy_htod,
    memcpy_peer,
    require_device,
    resolve,
    set_device,
    stream,
    synchronize,
    use_driver,
)

__all__ = [
    "Cuda", "DeviceInfo", "DeviceAllocation", "StreamAllocation", "Stream", "Event", "current", "resolve",
    "use_driver", "device_count", "devices", "require_device", "set_device", "synchronize", "alloc",
    "memcpy_htod", "memcpy_dtoh", "memcpy_dtod", "memcpy_peer", "stream", "event",
]
