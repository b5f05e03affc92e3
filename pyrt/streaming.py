"""Weight-streaming budgets: parse what users and files say, decide per engine.

Pure integer logic; no TensorRT, CUDA or torch. The parsing itself is
:mod:`pyrt.device.budgets`' (its names are re-exported here). The engine layer applies the
decisions (and, for ``source == "automatic"``, asks TensorRT for its automatic
budget and retries with 0 if that fails).

Resolution per engine (formats.md §3): load-time budget > baked compile spec
``weight_streaming_budget`` > TensorRT automatic.

Load-time forms (see :func:`parse_budget`):

* ``None`` or ``""``: nothing given (``""`` is logged and ignored).
* ``"auto"``: TensorRT's automatic budget, overriding any baked value.
* bytes: an ``int``, or a string ``"<number>[unit]"``. Units, case-insensitive:
  ``B``, decimal ``kB MB GB TB`` (10**3...), binary ``KiB MiB GiB TiB``
  (2**10...). A fractional number is allowed only when it names a whole number
  of bytes (``"1.5GB"`` yes, ``"0.1KiB"`` no). At most 2**63.
* share of the streamable size: a ``float`` with ``0 < f <= 1``, or a percent
  string with ``0 < p <= 100``. A float is read exactly as its shortest
  ``repr`` (``0.3`` is 3/10, not the binary double), so shares are always
  exact decimal fractions.
* a mapping ``{delegate_index: any of the above}`` setting engines one by one.
* ``"fit"`` (any case): what the program's memory plan leaves each device for weights
  (:mod:`pyrt.runtime.memory_plan`), known once the engines are deserialized.

:func:`parse_load_budget` reads a whole load-time budget once, where it enters
(``Program``, ``set_budget``), into one :class:`LoadBudget`; the layers below take that.

Out-of-range policy: a program-wide byte budget is a TOTAL, split across the
streamable engines in proportion to their streamable sizes
(:func:`split_proportionally`); a share applies to each engine's own size,
rounded down; a per-engine byte value (mapping or baked) applies to that
engine. Any budget above an engine's streamable size (or a total above the
program's) is clamped to it with a :class:`BudgetWarning`; values below 0 are
rejected by parsing, so the lower clamp never fires. An explicit budget
(load-time or baked) on an engine with no streamable weights warns and is not
applied (``source == "none"``); a program-wide budget on a program with nothing
streamable warns once.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any, Literal, cast

from pyrt.checks import is_int, shown
from pyrt.device.budgets import (
    COMPILE_SPEC_KEY,
    MAX_BUDGET_BYTES,
    BudgetSpec,
    BudgetValue,
    LoadBudget,
    budget_argument,
    find_baked_budget,
    parse_budget,
    parse_compile_spec_budget,
    parse_load_budget,
)
from pyrt.errors import BudgetError

__all__ = [
    "COMPILE_SPEC_KEY",
    "MAX_BUDGET_BYTES",
    "BudgetSpec",
    "BudgetWarning",
    "EngineStreamingInfo",
    "LoadBudget",
    "ResolvedBudget",
    "budget_argument",
    "find_baked_budget",
    "parse_budget",
    "parse_compile_spec_budget",
    "parse_load_budget",
    "resolve_budgets",
    "split_proportionally",
]

BudgetSource = Literal["load-time", "baked", "automatic", "none", "fit"]
LoadTimeBudget = BudgetValue | Mapping[int, BudgetValue]


class BudgetWarning(UserWarning):
    """A budget was clamped, or given where nothing streams, and was adjusted."""


def split_proportionally(total: int, weights: Sequence[int]) -> list[int]:
    """Split ``total`` into parts proportional to ``weights`` (largest remainder).

    Policy: the total is first clamped to ``sum(weights)``, so each part lies in
    ``[0, weights[i]]`` and ``sum(result) == min(total, sum(weights))`` exactly.
    Each part is the floor or the ceiling of its exact share
    ``total * w / sum(weights)``; leftover bytes go to the largest fractional
    remainders, ties to the lower position. Known trade-off of the method: a
    part may shrink by 1 byte when the total grows (Alabama paradox), never more.

    >>> split_proportionally(10, [30, 30, 30])
    [4, 3, 3]
    >>> split_proportionally(100, [30, 10])
    [30, 10]
    """
    total = _count(total, "total")
    weights = [_count(w, f"weights[{i}]") for i, w in enumerate(weights)]  # plain ints: exact arithmetic
    whole = sum(weights)
    if total >= whole:
        return weights
    numer = [total * w for w in weights]
    parts = [n // whole for n in numer]
    leftover = total - sum(parts)
    order = sorted(range(len(parts)), key=lambda i: (-(numer[i] % whole), i))
    for i in order[:leftover]:
        parts[i] += 1
    return parts


def _count(n: Any, name: str) -> int:
    if not is_int(n, low=0):
        raise BudgetError(f"split_proportionally: {name} must be an int >= 0, got {shown(n)}")
    return int(n)


@dataclass(frozen=True)
class EngineStreamingInfo:
    """What the engine layer knows about one TensorRT delegate before choosing a budget.

    ``baked`` is the parsed compile-spec budget (see :func:`find_baked_budget`).

    >>> EngineStreamingInfo(0, streamable_bytes=1 << 20, baked=None).streamable_bytes
    1048576
    """

    delegate_index: int
    streamable_bytes: int
    baked: int | None = None

    def __post_init__(self) -> None:
        for name in ("delegate_index", "streamable_bytes"):
            v = getattr(self, name)
            if not is_int(v, low=0):
                raise BudgetError(f"EngineStreamingInfo: {name} must be an int >= 0, got {shown(v)}")
            object.__setattr__(self, name, int(v))  # a numpy int as a plain one: budget arithmetic is exact
        b = self.baked
        if b is not None and not is_int(b, low=0, end=MAX_BUDGET_BYTES + 1):
            raise BudgetError(f"EngineStreamingInfo of delegate {self.delegate_index}: baked "
                              f"budget must be None or an int in [0, 2**63], got {shown(b)}")
        if b is not None:
            object.__setattr__(self, "baked", int(b))


@dataclass(frozen=True)
class ResolvedBudget:
    """The decision for one engine.

    ``budget`` is the byte count to set, or None: with ``source == "automatic"``
    the engine layer uses TensorRT's automatic budget (retrying with 0 if that
    fails); with ``source == "none"`` it sets nothing (no streamable weights).
    """

    delegate_index: int
    streamable_bytes: int
    budget: int | None
    source: BudgetSource


def _warn(message: str) -> None:
    """Warn, attributing the warning to the first caller outside this module."""
    level, frame = 2, sys._getframe(1)
    while frame.f_back is not None and frame.f_globals.get("__name__") == __name__:
        frame, level = frame.f_back, level + 1
    warnings.warn(message, BudgetWarning, stacklevel=level)


def _clamped(budget: int, streamable: int, what: str) -> int:
    if budget > streamable:
        _warn(f"{what}: budget of {budget} bytes exceeds the {streamable} streamable bytes; "
              f"using {streamable}")
        return streamable
    return budget


def _per_engine(e: EngineStreamingInfo, spec: BudgetSpec | None, what: str,
                explicit: bool) -> ResolvedBudget:
    """Decide one engine from a per-engine (not total) load-time spec, else its baked value.

    ``explicit``: the spec names this engine (a mapping entry), so ignoring it warns.
    """
    if e.streamable_bytes == 0:
        if explicit and spec is not None and spec.kind != "auto":
            _warn(f"{what}: budget {spec} ignored, the engine has no streamable weights")
        elif spec is None and e.baked is not None:
            _warn(f"delegate {e.delegate_index}: baked budget of {e.baked} bytes ignored, "
                  "the engine has no streamable weights")
        return ResolvedBudget(e.delegate_index, 0, None, "none")
    if spec is None and e.baked is not None:
        budget = _clamped(e.baked, e.streamable_bytes, f"delegate {e.delegate_index} baked")
        return ResolvedBudget(e.delegate_index, e.streamable_bytes, budget, "baked")
    if spec is None or spec.kind == "auto":
        return ResolvedBudget(e.delegate_index, e.streamable_bytes, None, "automatic")
    if spec.kind == "share":
        share = cast(Fraction, spec.value)
        budget = share.numerator * e.streamable_bytes // share.denominator
    else:
        budget = _clamped(int(spec.value or 0), e.streamable_bytes, what)
    return ResolvedBudget(e.delegate_index, e.streamable_bytes, budget, "load-time")


def _split_total(engines: Sequence[EngineStreamingInfo], total: int,
                 source: str) -> list[ResolvedBudget]:
    streaming = sorted((e for e in engines if e.streamable_bytes), key=lambda e: e.delegate_index)
    whole = sum(e.streamable_bytes for e in streaming)
    if total > whole > 0:
        _warn(f"{source}: total of {total} bytes exceeds the program's {whole} streamable "
              f"bytes; using {whole}")
    parts = split_proportionally(total, [e.streamable_bytes for e in streaming])
    chosen = {e.delegate_index: p for e, p in zip(streaming, parts, strict=True)}
    return [ResolvedBudget(e.delegate_index, e.streamable_bytes, chosen[e.delegate_index],
                           "load-time") if e.streamable_bytes
            else ResolvedBudget(e.delegate_index, 0, None, "none") for e in engines]


def resolve_budgets(engines: Sequence[EngineStreamingInfo], load_time: LoadBudget | LoadTimeBudget = None,
                    *, source: str = "load-time budget",
                    planned: Mapping[int, int] | None = None) -> list[ResolvedBudget]:
    """Decide every engine's budget; results follow the order of ``engines``.

    ``load_time``: a :class:`LoadBudget` (any other value is read by :func:`parse_load_budget`).
    A program-wide byte budget is a total split by streamable size; a share,
    ``"auto"`` or a mapping entry applies per engine; ``"fit"`` applies ``planned``
    (engine index -> bytes: the memory plan's split), with source "fit".

    >>> engines = [EngineStreamingInfo(0, 300), EngineStreamingInfo(1, 100, baked=40)]
    >>> [(r.budget, r.source) for r in resolve_budgets(engines, "200B")]
    [(150, 'load-time'), (50, 'load-time')]
    >>> [(r.budget, r.source) for r in resolve_budgets(engines, {0: "50%"})]
    [(150, 'load-time'), (40, 'baked')]
    >>> [(r.budget, r.source) for r in resolve_budgets(engines)]
    [(None, 'automatic'), (40, 'baked')]
    >>> [(r.budget, r.source) for r in resolve_budgets(engines, "fit", planned={0: 30, 1: 10})]
    [(30, 'fit'), (10, 'fit')]
    """
    indices = [e.delegate_index for e in engines]
    if len(set(indices)) != len(indices):
        raise BudgetError(f"resolve_budgets: duplicate delegate indices in {indices}")
    if isinstance(load_time, Mapping):  # not yet read: an unknown index is named against the real ones first
        _check_indices(load_time, sorted(indices), source)
    budget = parse_load_budget(load_time, source=source)
    if budget.kind == "fit":
        if planned is None:
            raise BudgetError(f"{source}: budget 'fit' needs the memory plan's split (planned=)")
        fitted = _each(engines, {i: BudgetSpec("bytes", b) for i, b in planned.items()}, source)
        return [replace(r, source="fit") if r.source == "load-time" else r for r in fitted]
    if budget.kind == "per-engine":
        return _each(engines, budget.engines, source)
    spec = budget.spec
    if spec is not None and spec.kind != "auto" and not any(e.streamable_bytes for e in engines):
        _warn(f"{source}: budget {spec} ignored, the program has no streamable weights")
    if spec is not None and spec.kind == "bytes":
        return _split_total(engines, int(spec.value or 0), source)
    return [_per_engine(e, spec, source, False) for e in engines]


def _each(engines: Sequence[EngineStreamingInfo], specs: Mapping[int, BudgetSpec | None],
          source: str) -> list[ResolvedBudget]:
    """Decide engine by engine from ``specs`` (delegate index -> spec); an index with no engine is an error."""
    _check_indices(specs, sorted(e.delegate_index for e in engines), source)
    return [_per_engine(e, specs.get(e.delegate_index), f"{source} for delegate {e.delegate_index}", True)
            for e in engines]


def _check_indices(keys: Iterable[object], valid: list[int], source: str) -> None:
    for key in keys:
        if not is_int(key) or key not in valid:
            raise BudgetError(f"{source}: no TensorRT delegate with index {shown(key)}; "
                              f"valid delegate indices are {valid}")
