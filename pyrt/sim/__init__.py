"""pyrt's simulated GPU: a CUDA driver and a TensorRT that run reference engines on the CPU, or on a real GPU.

Product code, not test help: ``builder="reference"`` exports (:mod:`pyrt.sim.refengine`, the
engines' format and interpreter), ``PYRT_SIMULATED_GPUS=n`` (:func:`install_from_environment`,
which ``import pyrt`` calls), ``pyrt serve`` without a GPU (:func:`simulated_devices` in each
replica) and reference engines over the real CUDA driver (:mod:`pyrt.sim.gpu_reference`) all
run on it. :func:`simulated_gpus` installs a fake CUDA driver (:mod:`pyrt.sim.fake_cuda`)
and a fake TensorRT (:mod:`pyrt.sim.fake_tensorrt`) together at pyrt's two lowest seams;
everything above the seams (engines, programs) runs unchanged and computes real results
for reference engines. Importing this package imports neither torch nor TensorRT.

May import: every layer below it (base, format, device, memory, kernels, runtime); never
imported by them (the runtime is handed its seams, it does not look for fakes).

>>> import pyrt.cuda
>>> with simulated_gpus(2, memory=[1 << 30, 2 << 30]) as sim:
...     [d.total_memory >> 30 for d in pyrt.cuda.devices()]
[1, 2]
>>> pyrt.cuda.current() is not sim.cuda
True

A slow GPU, for tests of timeouts and overload: ``$PYRT_SIMULATED_SECONDS_PER_ROW`` (read by
:func:`simulated_devices`, so also by ``pyrt serve``'s replicas on simulated GPUs, whose processes
inherit it) makes every engine launch take that many seconds per row of its first input.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pyrt.cuda as cuda_seam
from pyrt.device import tensorrt_seam
from pyrt.errors import InputError
from pyrt.sim.fake_cuda import FakeDriver
from pyrt.sim.fake_tensorrt import FakeTensorRT
from pyrt.sim.refengine import DType, Ref, RefEngine, RefNode, RefProfile, RefTensor, RefWeight

SIMULATED_GPUS_ENV = "PYRT_SIMULATED_GPUS"
_PROCESS_WIDE: list[contextlib.ExitStack] = []  # the simulated GPUs install_from_environment() put in place
_PROCESS_LOCK = threading.Lock()

__all__ = [
    "SimulatedGPUs", "simulated_gpus", "simulated_devices", "gpus_from_environment", "install_from_environment",
    "SECONDS_PER_ROW_ENV", "seconds_per_row_from_env",
    "FakeDriver", "FakeTensorRT",
    "RefEngine", "RefProfile", "RefTensor", "RefNode", "RefWeight", "Ref", "DType",
]


@dataclass(frozen=True)
class SimulatedGPUs:
    """What :func:`simulated_gpus` installed: the fake driver, the fake TensorRT, the CUDA seam."""

    driver: FakeDriver
    tensorrt: FakeTensorRT
    cuda: cuda_seam.Cuda


@contextlib.contextmanager
def simulated_gpus(
    n: int = 1,
    memory: int | list[int] = 16 << 30,
    *,
    name: str = "Fake GPU",
    capability: tuple[int, int] = (8, 9),
) -> Iterator[SimulatedGPUs]:
    """Swap in ``n`` fake GPUs (``memory`` bytes each, or one size per GPU) and a fake TensorRT.

    Inside the block ``pyrt.cuda`` talks to the fake driver and
    ``pyrt.device.tensorrt_seam.load_tensorrt()`` returns the fake TensorRT; both
    are restored on exit. ``n=0`` simulates a machine with a driver but no GPU.
    """
    sim = simulated_devices(n, memory, name=name, capability=capability)
    with cuda_seam.use_driver(sim.cuda), tensorrt_seam.use_tensorrt(sim.tensorrt):
        yield sim


def simulated_devices(
    n: int = 1,
    memory: int | list[int] = 16 << 30,
    *,
    name: str = "Fake GPU",
    capability: tuple[int, int] = (8, 9),
) -> SimulatedGPUs:
    """``n`` fake GPUs and a fake TensorRT to pass explicitly (``Program(path, devices=sim)``).

    Unlike :func:`simulated_gpus`, nothing process-wide changes.

    >>> import pyrt.cuda
    >>> sim = simulated_devices(2)
    >>> sim.cuda.device_count(), pyrt.cuda.current() is sim.cuda
    (2, False)
    """
    driver = FakeDriver(n, memory, name=name, capability=capability)
    trt = FakeTensorRT(driver)
    trt.seconds_per_row = seconds_per_row_from_env()
    return SimulatedGPUs(driver, trt, cuda_seam.Cuda(driver))


SECONDS_PER_ROW_ENV = "PYRT_SIMULATED_SECONDS_PER_ROW"


def seconds_per_row_from_env() -> float:
    """``$PYRT_SIMULATED_SECONDS_PER_ROW`` (0 when unset): how slow simulated engine launches are made.

    >>> seconds_per_row_from_env() >= 0
    True
    """
    value = os.environ.get(SECONDS_PER_ROW_ENV, "").strip()
    try:
        seconds = float(value) if value else 0.0
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise InputError(f"{SECONDS_PER_ROW_ENV}={value!r}: expected a number of seconds >= 0")
    return seconds


def gpus_from_environment() -> int | None:
    """``$PYRT_SIMULATED_GPUS`` as a count of GPUs (None when unset); InputError naming a bad value."""
    value = os.environ.get(SIMULATED_GPUS_ENV, "").strip()
    if not value:
        return None
    if not value.isdigit():
        raise InputError(f"{SIMULATED_GPUS_ENV}={value!r}: expected a whole number of GPUs")
    return int(value)


def install_from_environment() -> bool:
    """``$PYRT_SIMULATED_GPUS`` simulated GPUs for the rest of the process (once); True when installed.

    ``import pyrt`` calls this when the variable is set, so ``PYRT_SIMULATED_GPUS=1 python app.py``
    runs ``app.py``'s Programs on simulated GPUs, as ``PYRT_SIMULATED_GPUS=1 pyrt run ...`` does.
    """
    count = gpus_from_environment()
    if count is None:
        return False
    with _PROCESS_LOCK:
        if not _PROCESS_WIDE:
            stack = contextlib.ExitStack()
            stack.enter_context(simulated_gpus(count))
            _PROCESS_WIDE.append(stack)  # never closed: the process keeps its simulated GPUs
    return True
