"""Dynamic shapes for engine builds: the ``{input: {"min", "opt", "max"}}`` spec checked
against the inputs' names and example shapes, and the dims it makes dynamic for ONNX export.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pyrt.checks import is_int
from pyrt.errors import ExportError

ShapeRange = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]  # (min, opt, max)


def parse_dynamic_shapes(
    spec: Mapping[Any, Any] | None,
    names: Sequence[str] | None,
    example_shapes: Sequence[tuple[int, ...]] | None,
) -> dict[int | str, ShapeRange]:
    """Check a ``{input: {"min","opt","max"}}`` spec; keys become positions when ``names`` is given.

    >>> parse_dynamic_shapes({"x": {"min": [1, 4], "opt": [8, 4], "max": [32, 4]}}, ["x"], [(8, 4)])
    {0: ((1, 4), (8, 4), (32, 4))}
    """
    if spec is None:
        return {}
    if not isinstance(spec, Mapping):
        raise ExportError(f"dynamic_shapes must be a dict of {{input: {{'min','opt','max'}}}}, "
                          f"got {type(spec).__name__}")
    out: dict[int | str, ShapeRange] = {}
    for key, value in spec.items():
        slot = _input_slot(key, names)
        rng = _parse_range(key, value)
        if example_shapes is not None:
            # The ignore below: callers that pass example shapes also pass names, which makes slot a position.
            _check_example_in_range(key, rng, example_shapes[slot])  # type: ignore[index]
        if slot in out:
            raise ExportError(f"dynamic_shapes gives input {key!r} twice (by name and by position)")
        out[slot] = rng
    return out


def _input_slot(key: Any, names: Sequence[str] | None) -> int | str:
    if not (is_int(key) or isinstance(key, str)):
        raise ExportError(f"dynamic_shapes key {key!r} must be an input name or position")
    if names is None:
        return key if isinstance(key, str) else int(key)
    if not isinstance(key, str):
        key = int(key)
        if not 0 <= key < len(names):
            raise ExportError(f"dynamic_shapes key {key} is not an input position (the module takes {len(names)})")
        return key
    if key not in names:
        raise ExportError(f"dynamic_shapes key {key!r} is not an input name; the inputs are {list(names)}")
    return list(names).index(key)


def _parse_range(key: Any, value: Any) -> ShapeRange:
    if not isinstance(value, Mapping) or set(value) != {"min", "opt", "max"}:
        got = sorted(map(str, value)) if isinstance(value, Mapping) else type(value).__name__
        raise ExportError(f"dynamic_shapes[{key!r}] must be a dict with exactly 'min', 'opt', 'max'; got {got}")
    lo, opt, hi = (_shape(key, k, value[k]) for k in ("min", "opt", "max"))
    if not len(lo) == len(opt) == len(hi):
        raise ExportError(f"dynamic_shapes[{key!r}]: min {lo}, opt {opt}, max {hi} differ in rank")
    for d, (a, b, c) in enumerate(zip(lo, opt, hi, strict=True)):
        if not 0 <= a <= b <= c:
            raise ExportError(f"dynamic_shapes[{key!r}] dim {d}: need 0 <= min <= opt <= max, got {a}, {b}, {c}")
    return lo, opt, hi


def _shape(key: Any, which: str, value: Any) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not all(
            is_int(d) for d in value):
        raise ExportError(f"dynamic_shapes[{key!r}][{which!r}] must be a list of ints, got {value!r}")
    return tuple(int(d) for d in value)


def _check_example_in_range(key: Any, rng: ShapeRange, example: tuple[int, ...]) -> None:
    lo, _, hi = rng
    if len(lo) != len(example):
        raise ExportError(f"dynamic_shapes[{key!r}] has rank {len(lo)}, its example input has shape {example}")
    for d, size in enumerate(example):
        if not lo[d] <= size <= hi[d] or (lo[d] == hi[d] != size):
            raise ExportError(f"dynamic_shapes[{key!r}] dim {d} spans {lo[d]}..{hi[d]}, but the example "
                              f"input has size {size} there")


def dynamic_dims(rng: ShapeRange | None) -> list[int]:
    return [] if rng is None else [d for d, (a, c) in enumerate(zip(rng[0], rng[2], strict=True)) if a != c]
