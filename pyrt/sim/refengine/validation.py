"""Checks of a reference graph: names defined once and before use, known dtypes, weight sizes,
consistent input profiles, and input shapes within them.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

from pyrt.checks import is_int
from pyrt.sim.refengine import quant
from pyrt.sim.refengine.model import (
    DTYPES,
    DType,
    Ref,
    RefEngineFormatError,
    RefNode,
    RefProfile,
    RefTensor,
)


class _Graph(Protocol):
    """What validation reads of a reference engine."""

    inputs: list[RefTensor]
    outputs: list[RefTensor]
    weights: dict[str, Any]
    nodes: list[RefNode]


def validate_graph(eng: _Graph, where: str) -> None:
    defined: set[str] = set()

    def define(name: Any, what: str) -> None:
        if not isinstance(name, str) or not name:
            raise RefEngineFormatError(f"{where}: {what} name must be a non-empty string, got {name!r}")
        if name in defined:
            raise RefEngineFormatError(f"{where}: name {name!r} ({what}) is defined twice")
        defined.add(name)

    def check_dtype(dtype: str, what: str) -> None:
        if dtype not in DTYPES:
            raise RefEngineFormatError(f"{where}: {what} has unknown dtype {dtype!r}; known: {sorted(DTYPES)}")

    if not eng.outputs:
        raise RefEngineFormatError(f"{where}: an engine needs at least one output")
    for t in eng.inputs:
        define(t.name, "input")
        check_dtype(t.dtype, f"input {t.name!r}")
        _check_profile(t, where)
    for name, w in eng.weights.items():
        define(name, "weight")
        check_dtype(w.dtype, f"weight {name!r}")
        want = math.prod(w.shape) * DTYPES[w.dtype]
        if w.nbytes != want:
            raise RefEngineFormatError(
                f"{where}: weight {name!r} holds {w.nbytes} bytes, but {w.dtype}{list(w.shape)} needs {want}"
            )
    for i, node in enumerate(eng.nodes):
        if not isinstance(node.target, str) or "::" not in node.target:
            raise RefEngineFormatError(f"{where}: nodes[{i}] target {node.target!r} is not 'namespace::op[.overload]'")
        for ref in _names([node.args, list(node.kwargs.values())], Ref):
            if ref not in defined:
                raise RefEngineFormatError(f"{where}: nodes[{i}] ({node.target}) uses {ref!r} before it is defined")
        for dt in _names([node.args, list(node.kwargs.values())], DType):
            check_dtype(dt, f"nodes[{i}] ({node.target}) dtype argument")
        if not node.outputs:
            raise RefEngineFormatError(f"{where}: nodes[{i}] ({node.target}) names no outputs")
        if node.target.startswith(quant.NAMESPACE):
            quant.check(node, eng.weights, f"{where}: nodes[{i}]")
        for out in node.outputs:
            define(out, f"nodes[{i}] output")
    seen_outputs: set[str] = set()
    for t in eng.outputs:
        check_dtype(t.dtype, f"output {t.name!r}")
        if t.name not in defined:
            raise RefEngineFormatError(f"{where}: output {t.name!r} is produced by nothing")
        if t.name in seen_outputs:
            raise RefEngineFormatError(f"{where}: output {t.name!r} is listed twice")
        seen_outputs.add(t.name)
        if any(not isinstance(d, int) or d < -1 for d in t.shape):
            raise RefEngineFormatError(f"{where}: output {t.name!r} shape {t.shape!r} is invalid")


def fits(shape: tuple[int, ...], spec: RefTensor) -> bool:
    lo, hi = spec.profile()
    return len(shape) == len(lo) and all(a <= d <= b for d, a, b in zip(shape, lo, hi, strict=True))


def _check_profile(t: RefTensor, where: str) -> None:
    if any(not isinstance(d, int) or d < -1 for d in t.shape):
        raise RefEngineFormatError(f"{where}: input {t.name!r} shape {t.shape!r} is invalid")
    if -1 in t.shape and (t.min_shape is None or t.max_shape is None):
        raise RefEngineFormatError(f"{where}: dynamic input {t.name!r} needs min_shape and max_shape")
    lo, hi = t.profile()
    if not len(lo) == len(hi) == len(t.shape):
        raise RefEngineFormatError(
            f"{where}: input {t.name!r} min_shape {lo} / max_shape {hi} do not match the rank of {t.shape}"
        )
    for d, a, b in zip(t.shape, lo, hi, strict=True):
        if a < 0 or a > b or (d != -1 and not a == b == d):
            raise RefEngineFormatError(
                f"{where}: input {t.name!r} profile min {lo} .. max {hi} is inconsistent with shape {t.shape}"
            )


def _names(args: Any, kind: type[Ref] | type[DType]) -> list[str]:
    """The ``name`` of every ``kind`` argument in ``args``, lists searched through."""
    if isinstance(args, kind):
        return [args.name]
    if isinstance(args, (list, tuple)):
        return [r for a in args for r in _names(a, kind)]
    return []



def check_profiles(eng: Any, where: str) -> None:
    """Each optimization profile: known inputs, min <= opt <= max inside the input's declared
    min/max (the union of the profiles), static dims fixed, a byte count of activation memory."""
    if not is_int(eng.device_memory, low=0):
        raise RefEngineFormatError(f"{where}: device_memory must be an int >= 0, got {eng.device_memory!r}")
    inputs = {t.name: t for t in eng.inputs}
    for i, p in enumerate(eng.profiles):
        at = f"{where}: profiles[{i}]"
        if not isinstance(p, RefProfile):
            raise RefEngineFormatError(f"{at} is not a RefProfile: {p!r:.80}")
        d = p.device_memory
        if not is_int(d, low=0):
            raise RefEngineFormatError(f"{at}: device_memory must be an int >= 0, got {d!r}")
        for name in p.shapes:
            if name not in inputs:
                raise RefEngineFormatError(f"{at} names {name!r}, which is not an input")
        for t in eng.inputs:
            bounds = p.bounds(t)
            lo, hi = t.profile()
            ok = all(len(b) == len(t.shape) for b in bounds) and all(
                a <= b <= c and lo[k] <= a and c <= hi[k] and (t.shape[k] == -1 or a == c == t.shape[k])
                for k, (a, b, c) in enumerate(zip(*bounds, strict=True)))
            if not ok:
                raise RefEngineFormatError(f"{at}: input {t.name!r} min/opt/max {bounds} is not ordered inside "
                                           f"the input's declared range [{lo}, {hi}] with shape {t.shape}")
