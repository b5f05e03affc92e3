"""Checks of plain values that every layer makes: an int that is not a bool, a finite number in a range.

``True`` is an ``int`` to Python, so ``isinstance(x, int) and x >= 1`` takes ``True`` for 1: every
count, index, size and seed pyrt takes goes through :func:`is_int` (or :func:`checked_int`, which
raises) instead. numpy integers count as ints (they come from arrays); numpy bools do not.
The error a check raises is the caller's (``error=``): a bad request field is an
:class:`pyrt.errors.InputError` naming it, a bad byte count in a file a
:class:`pyrt.errors.PteFormatError`, and so on.

>>> is_int(3), is_int(True), is_int(2.0), is_int(-1, low=0), is_int(4, low=0, end=4)
(True, False, False, False, False)
>>> checked_int(7, "max_batch_size", low=1)
7
>>> checked_int(0, "max_batch_size", low=1)
Traceback (most recent call last):
...
pyrt.errors.InputError: max_batch_size=0 must be an int >= 1
>>> checked_number(float("nan"), "temperature", low=0)
Traceback (most recent call last):
...
pyrt.errors.InputError: temperature=nan must be a finite number >= 0

A refused value that prints long is :func:`shown` cut short, in every layer's messages alike:

>>> shown("abc"), len(shown("x" * 1000)), shown("x" * 1000)[-5:]
("'abc'", 200, 'xx...')
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from pyrt.errors import InputError, PyrtError

REPR_CHARS = 200  # the most characters of a refused value an error message shows


def is_int(value: Any, *, low: int | None = None, end: int | None = None) -> bool:
    """Whether ``value`` is an int (a numpy int too; never a bool) with ``low <= value < end`` (None: no bound)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return False
    number = int(value)
    return (low is None or number >= low) and (end is None or number < end)


def int_wanted(low: int | None = None, end: int | None = None) -> str:
    """What :func:`checked_int` asks for, in words: ``"an int >= 1"``, ``"an int >= 0 and < 64"``."""
    bounds = [f">= {low}"] if low is not None else []
    bounds += [f"< {end}"] if end is not None else []
    return "an int" + (" " + " and ".join(bounds) if bounds else "")


def checked_int(value: Any, name: str, *, low: int | None = None, end: int | None = None,
                error: type[PyrtError] = InputError, field: str | None = None) -> int:
    """``value`` as a plain int when :func:`is_int` holds; else ``error`` naming ``name`` and the value.

    An :class:`~pyrt.errors.InputError` carries ``field`` (default: ``name``) for an API to rename.
    """
    if is_int(value, low=low, end=end):
        return int(value)
    message = f"{name}={value!r} must be {int_wanted(low, end)}"
    if issubclass(error, InputError):
        raise error(message, field=name if field is None else field)
    raise error(message)


def is_number(value: Any, *, low: float | None = None, high: float | None = None) -> bool:
    """Whether ``value`` is a finite real number (not a bool) with ``low <= value <= high`` (None: no bound)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    try:
        number = float(value)
    except OverflowError:  # an int past the largest float
        return False
    return math.isfinite(number) and (low is None or number >= low) and (high is None or number <= high)


def checked_number(value: Any, name: str, *, low: float | None = None, high: float | None = None,
                   error: type[PyrtError] = InputError, field: str | None = None) -> float:
    """``value`` as a float when :func:`is_number` holds; else ``error`` naming ``name`` and the value."""
    if is_number(value, low=low, high=high):
        return float(value)
    bounds = ([f">= {low:g}"] if low is not None else []) + ([f"<= {high:g}"] if high is not None else [])
    message = f"{name}={value!r} must be a finite number" + (" " + " and ".join(bounds) if bounds else "")
    if issubclass(error, InputError):
        raise error(message, field=name if field is None else field)
    raise error(message)


def shown(value: Any) -> str:
    """``repr(value)`` for an error message, cut to :data:`REPR_CHARS` characters (the cut ones end in ``...``)."""
    text = repr(value)
    return text if len(text) <= REPR_CHARS else text[:REPR_CHARS - 3] + "..."


__all__ = ["is_int", "checked_int", "int_wanted", "is_number", "checked_number", "shown", "REPR_CHARS"]
