"""Weight-streaming budgets as written: parse what users, command lines and files say.

The forms and the policy are :mod:`pyrt.streaming`'s (which re-exports these names);
here each written value becomes a :class:`BudgetSpec`, and a whole load-time budget one
:class:`LoadBudget`, read once where it enters. Pure; no TensorRT, CUDA or torch.

>>> parse_budget("50%", source="load-time budget")
BudgetSpec(kind='share', value=Fraction(1, 2))
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from numbers import Integral
from typing import Literal, Union, cast

from pyrt.checks import is_int, shown
from pyrt.errors import BudgetError

logger = logging.getLogger("pyrt.streaming")  # the name users filter budget log lines by

COMPILE_SPEC_KEY = "weight_streaming_budget"
FIT = "fit"  # the load-time budget the program's memory plan decides
MAX_BUDGET_BYTES = 2**63  # formats.md §2: "at most 2^63"
_MAX_NUMBER_CHARS = 1000  # under int()'s 4300-digit limit; fits every float's exact decimal

_UNITS: dict[str, int] = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_UNIT_NAMES = {"kb": "kB", "mb": "MB", "gb": "GB", "tb": "TB",
               "kib": "KiB", "mib": "MiB", "gib": "GiB", "tib": "TiB"}
_NUMBER = r"[0-9]+(?:\.[0-9]+)?"
_BYTES_RE = re.compile(rf"({_NUMBER})\s*([a-z]*)", re.ASCII | re.IGNORECASE)
_PERCENT_RE = re.compile(rf"({_NUMBER})\s*%", re.ASCII)

BudgetKind = Literal["auto", "bytes", "share"]
LoadBudgetKind = Literal["none", "auto", "bytes", "share", "per-engine", "fit"]
BudgetValue = Union[None, str, int, float, "BudgetSpec"]


def _error(value: object, source: str, why: str) -> BudgetError:
    return BudgetError(f"{source}: invalid weight-streaming budget {shown(value)}: {why}")


def _is_decimal_fraction(x: Fraction) -> bool:
    d = x.denominator
    for p in (2, 5):
        while d % p == 0:
            d //= p
    return d == 1


def _decimal_str(x: Fraction) -> str:
    """Exact decimal text of a terminating fraction: 25/2 -> '12.5'."""
    k = 0
    while (10**k) % x.denominator:
        k += 1
    digits = str(x.numerator * 10**k // x.denominator).rjust(k + 1, "0")
    if k == 0:
        return digits
    return f"{digits[:-k]}.{digits[-k:]}".rstrip("0").rstrip(".")


@dataclass(frozen=True)
class BudgetSpec:
    """A parsed budget. ``str()`` gives text that parses back to an equal spec.

    kind ``"auto"``: value None; ``"bytes"``: int in [0, 2**63];
    ``"share"``: Fraction in (0, 1] with a terminating decimal expansion.

    >>> str(BudgetSpec("bytes", 3 * 2**30)), str(BudgetSpec("share", Fraction(1, 8)))
    ('3GiB', '12.5%')
    """

    kind: BudgetKind
    value: int | Fraction | None = None

    def __post_init__(self) -> None:
        v = self.value
        ok = {
            "auto": v is None,
            "bytes": is_int(v, low=0, end=MAX_BUDGET_BYTES + 1),
            "share": isinstance(v, Fraction) and 0 < v <= 1 and _is_decimal_fraction(v),
        }.get(self.kind)
        if not ok:
            raise _error(self, "BudgetSpec", "kind must be 'auto' (value None), 'bytes' "
                         "(int in [0, 2**63]) or 'share' (decimal Fraction in (0, 1])")
        if self.kind == "bytes":
            object.__setattr__(self, "value", int(cast(int, v)))  # a numpy int as a plain one

    def __str__(self) -> str:
        if self.kind == "auto":
            return "auto"
        if self.kind == "share":
            return _decimal_str(cast(Fraction, self.value) * 100) + "%"
        n = int(self.value or 0)
        for key, mult in sorted(_UNITS.items(), key=lambda kv: -kv[1]):
            if mult > 1 and n >= mult and n % mult == 0:
                return f"{n // mult}{_UNIT_NAMES[key]}"
        return f"{n}B"


def _parse_number(text: str, value: object, source: str) -> Fraction:
    if len(text) > _MAX_NUMBER_CHARS:
        raise _error(value, source, f"more than {_MAX_NUMBER_CHARS} characters of digits")
    return Fraction(text)


def _parse_share(share: Fraction, value: object, source: str) -> BudgetSpec:
    if not 0 < share <= 1:
        raise _error(value, source, "a share must be in (0, 1] (a percentage in (0, 100]); "
                     "pass an int for a byte count")
    return BudgetSpec("share", share)


def _parse_bytes(amount: Fraction, value: object, source: str) -> BudgetSpec:
    if amount.denominator != 1:
        raise _error(value, source, f"is {amount} bytes, not a whole number of bytes")
    if amount > MAX_BUDGET_BYTES:
        raise _error(value, source, "exceeds the maximum of 2**63 bytes")
    return BudgetSpec("bytes", int(amount))


def _parse_str(value: str, source: str) -> BudgetSpec | None:
    text = value.strip()
    if not text:
        logger.info("%s: empty weight-streaming budget %r ignored", source, value)
        return None
    if text.lower() == "auto":
        return BudgetSpec("auto")
    if text.startswith("-"):
        raise _error(value, source, "must not be negative")
    if m := _PERCENT_RE.fullmatch(text):
        return _parse_share(_parse_number(m[1], value, source) / 100, value, source)
    m = _BYTES_RE.fullmatch(text)
    if m is None or m[2].lower() not in _UNITS:
        raise _error(value, source, "expected 'auto', '<number>[unit]' with unit one of "
                     "B, kB, MB, GB, TB, KiB, MiB, GiB, TiB, or '<number>%'")
    amount = _parse_number(m[1], value, source) * _UNITS[m[2].lower()]
    return _parse_bytes(amount, value, source)


def parse_budget(value: object, *, source: str) -> BudgetSpec | None:
    """Parse one budget value; None when nothing was given.

    ``source`` names where the value came from and appears in every error.

    >>> parse_budget("1.5GB", source="load-time budget")
    BudgetSpec(kind='bytes', value=1500000000)
    >>> parse_budget(0.3, source="load-time budget")
    BudgetSpec(kind='share', value=Fraction(3, 10))
    >>> parse_budget("AUTO", source="x"), parse_budget(None, source="x")
    (BudgetSpec(kind='auto', value=None), None)
    >>> parse_budget(2.0, source="load-time budget")
    Traceback (most recent call last):
    pyrt.errors.BudgetError: load-time budget: invalid weight-streaming budget 2.0: \
a share must be in (0, 1] (a percentage in (0, 100]); pass an int for a byte count
    """
    if value is None or isinstance(value, BudgetSpec):
        return value
    if isinstance(value, bool):
        raise _error(value, source, "a bool is not a budget")
    if isinstance(value, Integral):
        if value < 0:
            raise _error(value, source, "must not be negative")
        return _parse_bytes(Fraction(int(value)), value, source)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _error(value, source, "must be finite")
        return _parse_share(Fraction(repr(float(value))), value, source)
    if isinstance(value, str):
        return _parse_str(value, source)
    raise _error(value, source, f"unsupported type {type(value).__name__}; expected None, "
                 "'auto', an int of bytes, a str like '2GiB' or '50%', or a float share")


@dataclass(frozen=True)
class LoadBudget:
    """A load-time budget as :func:`parse_load_budget` reads it: what every layer below the edge takes.

    ``kind`` "none": nothing given (baked, else automatic); "auto", "bytes" (a total), "share":
    ``spec``, for the whole program; "per-engine": ``engines`` (delegate index -> spec; None:
    as if nothing were given); "fit": the memory plan's split, known once the engines load.

    >>> parse_load_budget({1: "50%"}, source="load-time budget").engines
    {1: BudgetSpec(kind='share', value=Fraction(1, 2))}
    """

    kind: LoadBudgetKind = "none"
    spec: BudgetSpec | None = None
    engines: Mapping[int, BudgetSpec | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        whole = self.kind in ("auto", "bytes", "share")
        if (self.spec.kind if self.spec else None) != (self.kind if whole else None) or (
                self.engines and self.kind != "per-engine"):
            raise _error(self, "LoadBudget", "spec must be given for, and match, kind 'auto', 'bytes' or "
                         "'share'; engines only for kind 'per-engine'")


def parse_load_budget(value: object, *, source: str) -> LoadBudget:
    """Read a load-time budget (any form :mod:`pyrt.streaming` lists) once; errors name ``source``.

    A mapping's keys must be ints >= 0 here; :func:`pyrt.streaming.resolve_budgets` checks
    them against the program's engines.

    >>> parse_load_budget(" FIT", source="x").kind, parse_load_budget("2GiB", source="x").spec
    ('fit', BudgetSpec(kind='bytes', value=2147483648))
    >>> parse_load_budget({-1: "1GiB"}, source="load-time budget")
    Traceback (most recent call last):
    pyrt.errors.BudgetError: load-time budget: engine index -1 is not a non-negative int
    """
    if isinstance(value, LoadBudget):
        return value
    if isinstance(value, str) and value.strip().lower() == FIT:
        return LoadBudget("fit")
    if isinstance(value, Mapping):
        engines = {}
        for key, item in value.items():
            if not is_int(key, low=0):
                raise BudgetError(f"{source}: engine index {shown(key)} is not a non-negative int")
            engines[int(key)] = parse_budget(item, source=f"{source} for delegate {key}")
        return LoadBudget("per-engine", engines=engines)
    spec = parse_budget(value, source=source)
    return LoadBudget() if spec is None else LoadBudget(spec.kind, spec)


def budget_argument(text: str) -> str | dict[int, str]:
    """A command line's budget: ``50%`` stays text (:func:`parse_budget` reads it at load);
    ``0=1GiB,1=50%`` becomes ``{0: "1GiB", 1: "50%"}``. ValueError for a malformed map.

    >>> budget_argument("0=1GiB, 1=50%")
    {0: '1GiB', 1: '50%'}
    """
    if "=" not in text:
        return text
    out: dict[int, str] = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        if not key.strip().isdigit() or not value.strip():
            raise ValueError(f"expected ENGINE=BUDGET[,ENGINE=BUDGET...], got {text!r}")
        out[int(key)] = value.strip()
    return out


def parse_compile_spec_budget(raw: bytes | bytearray | memoryview | str, *,
                              source: str) -> int:
    """Parse a baked ``weight_streaming_budget`` compile-spec value (ASCII decimal).

    >>> parse_compile_spec_budget(b"1048576", source="delegate 0")
    1048576
    >>> parse_compile_spec_budget(b"1 MiB", source="compile spec of delegate 2")
    Traceback (most recent call last):
    pyrt.errors.BudgetError: compile spec of delegate 2: invalid weight-streaming budget \
b'1 MiB': expected ASCII decimal digits only
    """
    if isinstance(raw, (bytearray, memoryview)):
        raw = bytes(raw)
    if isinstance(raw, bytes):
        ok = raw.isdigit()  # bytes.isdigit is ASCII-only
        text = raw.decode("ascii") if ok else ""
    elif isinstance(raw, str):
        ok = raw.isascii() and raw.isdigit()
        text = raw
    else:
        raise _error(raw, source, f"unsupported type {type(raw).__name__}; expected bytes or str")
    if not ok:
        raise _error(raw, source, "expected ASCII decimal digits only")
    digits = text.lstrip("0") or "0"
    if len(digits) > 19 or int(digits) > MAX_BUDGET_BYTES:
        raise _error(raw, source, "exceeds the maximum of 2**63 bytes")
    return int(digits)


def find_baked_budget(compile_specs: Iterable[tuple[str, bytes | bytearray | memoryview | str]],
                      *, source: str) -> int | None:
    """The baked budget among a delegate's (key, value) compile specs; None if absent.

    A duplicated key is an error (formats.md §3).

    >>> find_baked_budget([("target_device", b"cuda:0"), ("weight_streaming_budget", b"64")],
    ...                   source="delegate 1")
    64
    """
    found = [v for k, v in compile_specs if k == COMPILE_SPEC_KEY]
    if len(found) > 1:
        raise BudgetError(f"{source}: compile spec {COMPILE_SPEC_KEY!r} appears "
                          f"{len(found)} times")
    key = f"{source} compile spec {COMPILE_SPEC_KEY}"
    return parse_compile_spec_budget(found[0], source=key) if found else None
