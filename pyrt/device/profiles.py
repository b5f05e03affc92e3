"""Optimization profiles: read every profile's input ranges from a TensorRT engine, pick one per run.

An engine built with several profiles (a decoder: one for prefill lengths, one for single-token
decode) accepts an input shape only inside the ranges of the profile its context has active.
pyrt reads each profile's (min, max) per dynamic input once, and each run picks the first
profile whose ranges hold every input shape (``set_optimization_profile_async`` on the run's
stream when it differs from the active one).

>>> ranges = [{"x": ((1, 4), (1, 4))}, {"x": ((2, 4), (64, 4))}]
>>> pick_profile("e", ranges, {"x": (16, 4)}), pick_profile("e", ranges, {"x": (1, 4)})
(1, 0)
>>> pick_profile("e", ranges, {"x": (65, 4)})
Traceback (most recent call last):
...
pyrt.errors.InputError: e: input shapes x (65, 4) fit none of the engine's optimization profiles: \
profile 0: x [(1, 4), (1, 4)]; profile 1: x [(2, 4), (64, 4)]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pyrt.errors import EngineError, InputError

Range = tuple[tuple[int, ...], tuple[int, ...]]


def within(shape: Sequence[int], lo: Sequence[int], hi: Sequence[int]) -> bool:
    """Whether ``shape`` lies in [lo, hi] dimension by dimension (same rank)."""
    return len(shape) == len(lo) and all(a <= d <= b for d, a, b in zip(shape, lo, hi, strict=True))


def dims(value: Any) -> tuple[int, ...] | None:
    """A TensorRT Dims as a tuple, or None for an invalid one (nbDims -1: ``len()`` raises).

    Indexes rather than iterates: iterating an invalid Dims reads past its end in the binding.
    """
    try:
        n = len(value)
    except (TypeError, ValueError):
        return None
    return tuple(int(value[i]) for i in range(n))


def read_range(engine: Any, name: str, shape: tuple[int, ...], index: int, label: str,
               log: Callable[[], str]) -> Range:
    """(min, max) of dynamic input ``name`` under profile ``index``; EngineError when TensorRT gives none."""
    profile = [dims(d) for d in engine.get_tensor_profile_shape(name, index)]  # always three Dims
    lo, hi = (profile[0], profile[2]) if len(profile) == 3 else (None, None)
    if lo is None or hi is None or not len(lo) == len(hi) == len(shape) or not all(
            0 <= a <= b and d in (-1, a) and d in (-1, b) for a, b, d in zip(lo, hi, shape, strict=True)):
        raise EngineError(f"{label}: no usable optimization profile for dynamic input {name!r} of "
                          f"shape {shape}: TensorRT gives min/opt/max {profile} (None: invalid) for profile "
                          f"{index}: {log() or 'no log'}")
    return lo, hi


def read_ranges(engine: Any, name: str, shape: tuple[int, ...], label: str,
                log: Callable[[], str]) -> tuple[Range, ...]:
    """(min, max) of dynamic input ``name`` under every profile of ``engine``."""
    count = max(1, int(engine.num_optimization_profiles))
    return tuple(read_range(engine, name, shape, i, label, log) for i in range(count))


def pick_profile(label: str, profiles: Sequence[Mapping[str, Range]], shapes: Mapping[str, Sequence[int]]) -> int:
    """The first profile whose ranges hold every input shape; InputError listing each profile's ranges."""
    for p, ranges in enumerate(profiles):
        if all(within(shapes[n], lo, hi) for n, (lo, hi) in ranges.items()):
            return p
    shown = "; ".join(f"profile {p}: " + ", ".join(f"{n} [{lo}, {hi}]" for n, (lo, hi) in r.items())
                      for p, r in enumerate(profiles))
    given = ", ".join(f"{n} {tuple(s)}" for n, s in shapes.items())
    raise InputError(f"{label}: input shapes {given} fit none of the engine's optimization profiles: {shown}")
