"""How one generation samples and when it stops: :class:`SamplingParams`, checked once when made.

Every bound is checked here and nowhere else; a bad value is an :class:`pyrt.errors.InputError`
whose ``field`` names the parameter (an API that spells it differently renames it). The checks
that need the program (token ids inside its vocabulary, room in its cache) are
:func:`pyrt.llm.request.make_request`'s.

>>> SamplingParams(max_new_tokens=8, do_sample=True, temperature=0.7, top_k=20, seed=1).top_k
20
>>> SamplingParams(top_p=1.5)
Traceback (most recent call last):
...
pyrt.errors.InputError: top_p=1.5 must be a number in (0, 1]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from pyrt.errors import InputError

TokenIds = tuple[int, ...]


@dataclass(frozen=True)
class SamplingParams:
    """``max_new_tokens``: the cap on new tokens (None: until an EOS id or a full cache).
    ``do_sample``: False is greedy (``transformers``' ``do_sample=False``); True draws from the softmax
    of the logits divided by ``temperature``, cut to the ``top_k`` most likely ids and to the smallest
    set whose probability reaches ``top_p`` (None: no cut), with ``numpy.random.default_rng(seed)``.
    ``eos_ids``: ids that end the generation (None: the program's ``get_eos_ids``; ``()``: none).
    ``stop``: token-id sequences that end it when its new tokens end with one.
    """

    max_new_tokens: int | None = None
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    eos_ids: TokenIds | None = None
    stop: tuple[TokenIds, ...] = ()

    def __post_init__(self) -> None:
        if self.max_new_tokens is not None:
            self._set("max_new_tokens", whole(self.max_new_tokens, "max_new_tokens", low=1))
        if not isinstance(self.do_sample, bool):
            raise InputError(f"do_sample={self.do_sample!r} must be a bool", field="do_sample")
        self._set("temperature", temperature(self.temperature, "temperature"))
        if self.top_k is not None:
            self._set("top_k", whole(self.top_k, "top_k", low=1))
        if self.top_p is not None:
            self._set("top_p", fraction(self.top_p, "top_p"))
        if self.seed is not None:
            self._set("seed", whole(self.seed, "seed", low=0))
        if self.eos_ids is not None:
            self._set("eos_ids", token_ids(self.eos_ids, "eos_ids"))
        self._set("stop", stop_sequences(self.stop, "stop"))

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)  # the checked, normalised value (a frozen dataclass)


def whole(value: Any, field: str, low: int) -> int:
    """``value`` as an int >= ``low`` (numpy ints too; bools and floats refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise InputError(f"{field}={value!r} must be an int >= {low}", field=field)
    return int(value)


def temperature(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InputError(f"{field}={value!r} must be a finite number > 0", field=field)
    return float(value)


def fraction(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise InputError(f"{field}={value!r} must be a number in (0, 1]", field=field)
    return float(value)


def token_ids(value: Any, label: str) -> TokenIds:
    """A sequence of int ids (a list, tuple or numpy array); their range is the program's to check.

    ``label`` names the value in messages (``stop[2]``); the error's field is its parameter (``stop``).
    """
    field = label.split("[")[0]
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise InputError(f"{label}={value!r} must be a sequence of token ids (ints)", field=field)
    try:
        items = list(np.asarray(value).reshape(-1).tolist()) if hasattr(value, "__array__") else list(value)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{label} could not be read as token ids: {exc}", field=field) from None
    for i, item in enumerate(items):
        if isinstance(item, bool) or not isinstance(item, int):
            raise InputError(f"{label}[{i}]={item!r} is not an int token id", field=field)
    return tuple(items)


def stop_sequences(value: Any, field: str) -> tuple[TokenIds, ...]:
    """``stop``: None or a list of non-empty token-id sequences."""
    if value is None:
        return ()
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise InputError(f"{field}={value!r} must be a list of token-id sequences", field=field)
    out = []
    for i, item in enumerate(value):
        ids = token_ids(item, f"{field}[{i}]")
        if not ids:
            raise InputError(f"{field}[{i}] is empty: a stop sequence needs at least one token id", field=field)
        out.append(ids)
    return tuple(out)
