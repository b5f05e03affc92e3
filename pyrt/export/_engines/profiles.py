"""Several optimization profiles for ``to_pte(..., profiles=[...])``.

Each profile gives min/opt/max shapes for the model's dynamic inputs (by name or position):
``[{"x": {"min": [1, 4], "opt": [1, 4], "max": [1, 4]}}, {"x": {"min": [2, 4], "opt": [32, 4],
"max": [64, 4]}}]``. The exported program's dynamic dims are symbols; a profile fixes each
symbol's (min, opt, max), and every engine's inputs get their ranges under that profile by
bounding their size expressions (a partition deep in the graph sees ``2*s0``, not ``s0``).

>>> check_profiles([{"x": {"min": [1], "opt": [2], "max": [4]}}])
({'x': ((1,), (2,), (4,))},)
>>> check_profiles([{"x": {"min": [3], "opt": [2], "max": [4]}}])
Traceback (most recent call last):
...
pyrt.errors.ExportError: profiles[0]['x']: min (3,) <= opt (2,) <= max (4,) must hold in every dimension
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyrt.checks import is_int
from pyrt.errors import ExportError

Bounds = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]


def check_profiles(value: Any) -> tuple[dict[Any, Bounds], ...] | None:
    """Validate ``profiles=``: a non-empty list of {input name or position: {"min", "opt", "max"}}."""
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not value:
        raise ExportError(f"profiles={value!r:.80} must be a non-empty list of {{input: {{'min','opt','max'}}}}")
    out = []
    for i, profile in enumerate(value):
        if not isinstance(profile, dict) or not profile:
            raise ExportError(f"profiles[{i}]={profile!r:.80} must be a non-empty dict of input -> min/opt/max")
        entry: dict[Any, Bounds] = {}
        for key, rng in profile.items():
            where = f"profiles[{i}][{key!r}]"
            if not (is_int(key) or isinstance(key, str)):
                raise ExportError(f"{where}: an input is named by its name (str) or position (int)")
            key = key if isinstance(key, str) else int(key)
            if not isinstance(rng, dict) or set(rng) != {"min", "opt", "max"}:
                raise ExportError(f"{where}={rng!r:.80} must be {{'min': [...], 'opt': [...], 'max': [...]}}")
            lo, opt, hi = (_dims(rng[k], f"{where}[{k!r}]") for k in ("min", "opt", "max"))
            if not len(lo) == len(opt) == len(hi) or not all(a <= b <= c for a, b, c in zip(lo, opt, hi, strict=True)):
                raise ExportError(f"{where}: min {lo} <= opt {opt} <= max {hi} must hold in every dimension")
            entry[key] = (lo, opt, hi)
        out.append(entry)
    return tuple(out)


def _dims(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or not all(
            is_int(d, low=0) for d in value):
        raise ExportError(f"{where}={value!r:.80} must be a list of ints >= 0")
    return tuple(int(d) for d in value)


def symbol_profiles(program: Any, profiles: Sequence[dict[Any, Bounds]]) -> list[dict[Any, tuple[int, int, int]]]:
    """Per profile: each dynamic-dim symbol of ``program``'s user inputs -> (min, opt, max)."""
    user = set(program.graph_signature.user_inputs)
    inputs = [n for n in program.graph.nodes if n.op == "placeholder" and n.name in user]
    out = []
    for i, profile in enumerate(profiles):
        known = {n.name for n in inputs} | set(range(len(inputs)))
        unknown = [k for k in profile if k not in known]
        if unknown:
            raise ExportError(f"profiles[{i}] names {unknown}; the model's inputs are "
                              f"{[n.name for n in inputs]} (or positions 0..{len(inputs) - 1})")
        symbols: dict[Any, tuple[int, int, int]] = {}
        for pos, node in enumerate(inputs):
            shape = tuple(node.meta["val"].shape)
            rng = profile.get(node.name, profile.get(pos))
            if rng is None:
                if any(not isinstance(d, int) for d in shape):
                    raise ExportError(f"profiles[{i}] gives dynamic input {node.name!r} {shape} no min/opt/max")
                continue
            _bind(symbols, shape, rng, f"profiles[{i}][{node.name!r}]")
        out.append(symbols)
    return out


def _bind(symbols: dict[Any, tuple[int, int, int]], shape: tuple[Any, ...], rng: Bounds, where: str) -> None:
    if len(rng[0]) != len(shape):
        raise ExportError(f"{where}: rank {len(rng[0])}, the input has shape {shape}")
    for d, size in enumerate(shape):
        want = (rng[0][d], rng[1][d], rng[2][d])
        if isinstance(size, int):
            if want != (size, size, size):
                raise ExportError(f"{where}: dim {d} is static ({size}) in the exported program, not {want}")
            continue
        expr = size.node.expr
        if not getattr(expr, "is_Symbol", False):
            raise ExportError(f"{where}: dim {d} is {expr}, not a plain dynamic dim; name the input it comes from")
        if symbols.setdefault(expr, want) != want:
            raise ExportError(f"{where}: dim {d} ({expr}) is {want} here and {symbols[expr]} on another input")


def input_bounds(val: Any, symbols: dict[Any, tuple[int, int, int]]) -> Bounds:
    """(min, opt, max) of a partition input's shape under one profile's symbol ranges."""
    dims = [(size, size, size) if isinstance(size, int) else evaluate(size.node.expr, symbols) for size in val.shape]
    return tuple(d[0] for d in dims), tuple(d[1] for d in dims), tuple(d[2] for d in dims)


def evaluate(expr: Any, symbols: dict[Any, tuple[int, int, int]]) -> tuple[int, int, int]:
    """(min, opt, max) of a size expression: bounded over the symbols' ranges, evaluated at their opts."""
    from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

    free: set[Any] = set(getattr(expr, "free_symbols", ()))
    missing = [s for s in free if s not in symbols]
    if missing:
        raise ExportError(f"size {expr} depends on {missing}, which no profile names")
    rng = bound_sympy(expr, {s: ValueRanges(lo, hi) for s, (lo, _, hi) in symbols.items() if s in free})
    opt = expr.subs({s: o for s, (_, o, _) in symbols.items() if s in free}) if free else expr
    return int(rng.lower), int(opt), int(rng.upper)


def activation_bytes(module: Any, symbols: dict[Any, tuple[int, int, int]]) -> int:
    """The bytes every intermediate tensor of ``module`` takes at the profile's largest shapes (no reuse):
    the activation memory a reference engine declares for the profile."""
    total = 0
    for node in module.graph.nodes:
        val = node.meta.get("val") if node.op == "call_function" else None
        vals: list[Any] = list(val) if isinstance(val, (tuple, list)) else [val]
        for v in vals:
            if getattr(v, "shape", None) is None or not hasattr(v, "element_size"):
                continue
            n = 1
            for size in v.shape:
                n *= size if isinstance(size, int) else evaluate(size.node.expr, symbols)[2]
            total += n * v.element_size()
    return total
