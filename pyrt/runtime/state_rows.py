"""A method's state tensors (its KV caches), read and copied by rows between runs: :func:`state_sizes`,
:func:`copy_rows`.

A method's *state* is what persists from one run to the next in memory the program plans: its mutable
buffers (an LLM file's KV caches). pyrt picks them out as the planned, static-shape tensors that are
neither inputs nor outputs, laid out with their first dimension outermost. Every other planned tensor of
that kind is scratch, written in a run before that run reads it (memory planning never lets one overlap a
mutable buffer), so copying rows inside one is harmless; a caller names the tensors by their first
dimension (an LLM slot file's caches: ``slots * kv_heads * (max_seq_len + 1)`` rows, :mod:`pyrt.llm.kv_copy`).

Host tensors (numpy or torch) are copied at once; device tensors by device-to-device copies queued on the
method's own stream of their device, after the last run's work (its end events) and before the next run's
(which waits for an event recorded after the copies), with no host synchronisation. A file whose state lives
inside an opaque engine (a TensorRT engine holding its own cache, no tensor of the method for it) has none
to copy: :func:`state_sizes` does not list it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyrt.errors import InputError
from pyrt.memory.table import PLANNED
from pyrt.memory.tensors import DeviceTensor


def state_tensors(plan: Any) -> list[int]:
    """The value indices of ``plan``'s state candidates (planned, static, not inputs or outputs, rows outermost)."""
    io = set(plan.inputs) | set(plan.outputs)
    return [i for i, info in plan.table.infos.items()
            if info.storage == PLANNED and not info.dynamic and i not in io and info.sizes
            and (not info.dim_order or info.dim_order[0] == 0)]


def state_sizes(plan: Any) -> tuple[int, ...]:
    """The distinct first dimensions of ``plan``'s state candidates, ascending."""
    return tuple(sorted({plan.table.infos[i].sizes[0] for i in state_tensors(plan)}))


def copy_rows(plan: Any, devices: Any, size: int, runs: Sequence[tuple[int, int, int]]) -> int:
    """In each state candidate of ``plan`` whose first dimension is ``size``: rows ``src .. src + count - 1`` copied
    to ``dst ..`` for each ``(src, dst, count)`` of ``runs``, in order; how many tensors it copied in."""
    for src, dst, count in runs:
        if count < 0 or min(src, dst) < 0 or max(src, dst) + count > size:
            raise InputError(f"method {plan.name!r}: rows {src}..{src + count} -> {dst}.. outside {size} rows")
    indices = [i for i in state_tensors(plan) if plan.table.infos[i].sizes[0] == size]
    streams: dict[int, Any] = {}
    for i in indices:
        info, value = plan.table.infos[i], plan.table.vals[i]
        if isinstance(value, DeviceTensor):
            stream = streams.get(value.device)
            if stream is None:
                stream = streams[value.device] = devices.own_stream(value.device)
                for event in devices.last_run:  # the last run may still write the rows copied
                    stream.wait(event)
            row = info.nbytes // size
            for src, dst, count in runs:
                if count:
                    devices.cuda.memcpy_dtod(value.allocation, value.allocation, count * row,
                                             dst_offset=value.offset + dst * row,
                                             src_offset=value.offset + src * row, stream=stream)
        else:
            for src, dst, count in runs:
                value[dst:dst + count] = value[src:src + count]
    if streams:  # the next run's streams start after the copies
        ended = []
        for device, stream in streams.items():
            event = devices.named_event("state rows", device)
            event.record(stream)
            ended.append(event)
        devices.last_run = [*(e for e in devices.last_run if e not in ended), *ended]
    return len(indices)


__all__ = ["state_tensors", "state_sizes", "copy_rows"]
