"""How much memory a .pte may make pyrt allocate, checked from what the file declares before allocating.

A file declares its memory-planned arenas (``non_const_buffer_sizes``) and the
sizes of tensors pyrt allocates itself (unplanned tensors that are not method
inputs). Before any of it is allocated, at load:

* no single arena or tensor may declare more than :data:`MAX_DECLARED_BYTES`
  (2**48 bytes, 256 TiB: the whole user address space of x86-64 and arm64):
  a :class:`~pyrt.errors.PteFormatError` naming the value;
* the host memory all methods need together must fit in
  :func:`available_host_memory` (``MemAvailable + SwapFree`` from
  ``/proc/meminfo``, lowered by a cgroup v2 ``memory.max`` and by the process's
  address-space and data limits, ``RLIMIT_AS`` / ``RLIMIT_DATA`` (``ulimit -v``,
  ``ulimit -d``) less what the process already maps; ``$PYRT_MAX_HOST_BYTES``
  replaces the figure): a :class:`~pyrt.errors.ResourceError` naming the largest
  items and both sizes. Device arenas are left to the CUDA allocator, which
  reports a shortage as a DeviceError.

The figure is an estimate (other threads allocate too), so every host allocation a
load makes runs under :func:`allocating`, which turns a ``MemoryError`` into a
``ResourceError`` naming what was being allocated.

>>> check_declared(1 << 20, "arena 1")
>>> check_declared(1 << 50, "arena 1")
Traceback (most recent call last):
...
pyrt.errors.PteFormatError: arena 1 declares 1125899906842624 bytes, more than pyrt's limit of 2**48 bytes
>>> with allocating("method 'forward' arena 1 (16 bytes)"):
...     raise MemoryError
Traceback (most recent call last):
...
pyrt.errors.ResourceError: method 'forward' arena 1 (16 bytes): the allocation failed (out of memory or over the \
process's limits)
"""

from __future__ import annotations

import contextlib
import os
import resource
from collections.abc import Iterator, Sequence

from pyrt.errors import PteFormatError, ResourceError

MAX_DECLARED_BYTES = 1 << 48
ENV_VAR = "PYRT_MAX_HOST_BYTES"
_MEMINFO = "/proc/meminfo"
_CGROUP = "/sys/fs/cgroup"
_STATUS = "/proc/self/status"
# (limit, /proc/self/status field of what counts against it, how the figure is named)
_RLIMITS = ((resource.RLIMIT_AS, "VmSize", "RLIMIT_AS (ulimit -v) - VmSize"),
            (resource.RLIMIT_DATA, "VmData", "RLIMIT_DATA (ulimit -d) - VmData"))


def check_declared(nbytes: int, what: str) -> None:
    """PteFormatError when one arena or tensor declares more than :data:`MAX_DECLARED_BYTES`."""
    if nbytes > MAX_DECLARED_BYTES:
        raise PteFormatError(f"{what} declares {nbytes} bytes, more than pyrt's limit of 2**48 bytes")


def available_host_memory() -> tuple[int, str] | None:
    """(bytes the process may still allocate, where that figure came from), or None when unknown."""
    override = os.environ.get(ENV_VAR)
    if override:
        if not override.strip().isdigit():
            raise ResourceError(f"${ENV_VAR}={override!r} is not a byte count (a non-negative integer)")
        return int(override), f"${ENV_VAR}"
    found = _meminfo()
    for other in (_cgroup_room(), *_rlimit_rooms()):
        if other is not None and (found is None or other[0] < found[0]):
            found = other
    if found is None:
        try:
            found = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "sysconf(SC_AVPHYS_PAGES)"
        except (AttributeError, ValueError, OSError):
            return None
    return found


def _meminfo() -> tuple[int, str] | None:
    try:
        with open(_MEMINFO, encoding="ascii") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        kib = int(fields["MemAvailable"].split()[0]) + int(fields.get("SwapFree", "0 kB").split()[0])
    except (OSError, KeyError, ValueError, IndexError):
        return None
    return kib * 1024, "MemAvailable + SwapFree in /proc/meminfo"


def _cgroup_room() -> tuple[int, str] | None:
    try:
        with open(f"{_CGROUP}/memory.max", encoding="ascii") as f:
            limit = f.read().strip()
        if limit == "max":
            return None
        with open(f"{_CGROUP}/memory.current", encoding="ascii") as f:
            current = int(f.read().strip())
        return max(int(limit) - current, 0), "the cgroup's memory.max - memory.current"
    except (OSError, ValueError):
        return None


def _rlimit_rooms() -> list[tuple[int, str]]:
    """Room left under each finite address-space or data limit of this process."""
    rooms = []
    status: dict[str, str] | None = None
    for which, field, named in _RLIMITS:
        soft, _ = resource.getrlimit(which)
        if soft == resource.RLIM_INFINITY:
            continue
        if status is None:
            try:
                with open(_STATUS, encoding="ascii") as f:
                    status = dict(line.split(":", 1) for line in f if ":" in line)
            except OSError:
                status = {}
        try:
            used = int(status[field].split()[0]) * 1024
        except (KeyError, ValueError, IndexError):
            used = 0
        rooms.append((max(soft - used, 0), named))
    return rooms


# torch's CPU allocator reports a failed allocation as a RuntimeError with this text (c10's alloc_cpu.cpp);
# torch.OutOfMemoryError (a RuntimeError) is the device allocators' counterpart.
_TORCH_NO_MEMORY = ("can't allocate memory", "out of memory")


@contextlib.contextmanager
def allocating(what: str) -> Iterator[None]:
    """Turn a failed allocation inside the block into a ResourceError naming ``what`` was being allocated.

    A failed allocation is a ``MemoryError`` (numpy, Python) or torch's allocator's ``RuntimeError``
    ("DefaultCPUAllocator: can't allocate memory", ``torch.OutOfMemoryError``).
    """
    try:
        yield
    except MemoryError as exc:
        if isinstance(exc, ResourceError):
            raise
        raise ResourceError(f"{what}: the allocation failed (out of memory or over the process's limits)") from exc
    except RuntimeError as exc:
        if type(exc).__name__ != "OutOfMemoryError" and not any(t in str(exc) for t in _TORCH_NO_MEMORY):
            raise
        raise ResourceError(f"{what}: the allocation failed (out of memory or over the process's limits): "
                            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from exc


def check_host_memory(source: str, items: Sequence[tuple[str, int]]) -> None:
    """ResourceError when the host memory ``items`` ((what, bytes) pairs) need exceeds what is available."""
    total = sum(n for _, n in items)
    if total == 0:
        return
    room = available_host_memory()
    if room is None or total <= room[0]:
        return
    largest = sorted(items, key=lambda item: -item[1])[:3]
    named = "; ".join(f"{what}: {n} bytes" for what, n in largest)
    raise ResourceError(f"{source}: loading needs {total} bytes of host memory (largest: {named}), more than the "
                        f"{room[0]} bytes available ({room[1]}); set ${ENV_VAR} to override the figure")


__all__ = ["MAX_DECLARED_BYTES", "allocating", "check_declared", "check_host_memory", "available_host_memory"]
