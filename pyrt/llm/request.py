"""Checking a generation request against the program's convention, before any run.

Every problem is an :class:`pyrt.errors.InputError` naming the field and its value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from pyrt.errors import InputError
from pyrt.llm.convention import Convention
from pyrt.llm.sampling import Sampling


@dataclass(frozen=True)
class Request:
    """A checked request: prompt ids, the cap on new tokens (None: until EOS or a full cache), sampling."""

    prompt: tuple[int, ...]
    max_new_tokens: int | None
    sampling: Sampling
    seed: int | None
    eos_ids: frozenset[int]
    stop: tuple[tuple[int, ...], ...] = ()  # token-id sequences that end the generation


def check_request(conv: Convention, prompt_ids: Any, *, max_new_tokens: Any, do_sample: Any = False,
                  temperature: Any = 1.0, top_k: Any = None, top_p: Any = None, seed: Any = None,
                  eos_ids: Any = None, names: dict[str, str] | None = None,
                  stop: tuple[tuple[int, ...], ...] = ()) -> Request:
    """A :class:`Request`, or InputError naming the first bad field (``names`` renames fields in messages)."""
    label = dict(names or {})

    def name(field: str) -> str:
        return label.get(field, field)

    prompt = _ids(prompt_ids, conv.vocab_size, name("prompt_ids"))
    if not prompt:
        raise InputError(f"{name('prompt_ids')} is empty: a generation needs at least one prompt token")
    if len(prompt) > conv.max_context_len:
        raise InputError(f"{name('prompt_ids')} has {len(prompt)} tokens, more than the cache's "
                         f"{conv.max_context_len} positions (get_max_context_len)")
    room = conv.max_context_len - len(prompt) + 1  # the last token's logits need no cache position
    if max_new_tokens is not None:
        max_new_tokens = _int(max_new_tokens, name("max_new_tokens"), low=1)
        if max_new_tokens > room:
            raise InputError(f"{name('max_new_tokens')}={max_new_tokens} goes past the cache: a {len(prompt)}-token "
                             f"prompt leaves room for {room} new tokens in {conv.max_context_len} positions")
    if not isinstance(do_sample, bool):
        raise InputError(f"{name('do_sample')}={do_sample!r} must be a bool")
    sampling = Sampling(do_sample, _temperature(temperature, name("temperature")),
                        None if top_k is None else _int(top_k, name("top_k"), low=1),
                        None if top_p is None else _fraction(top_p, name("top_p")))
    if seed is not None:
        seed = _int(seed, name("seed"), low=0)
    eos = conv.eos_ids if eos_ids is None else _ids(eos_ids, conv.vocab_size, name("eos_ids"))
    return Request(prompt, max_new_tokens, sampling, seed, frozenset(eos), stop)


def check_stop(value: Any, vocab: int, names: dict[str, str] | None = None) -> tuple[tuple[int, ...], ...]:
    """``stop`` (None, or a list of token-id sequences) checked; InputError naming the bad entry."""
    field = (names or {}).get("stop", "stop")
    if value is None:
        return ()
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise InputError(f"{field}={value!r} must be a list of token-id sequences")
    out = []
    for i, item in enumerate(value):
        ids = _ids(item, vocab, f"{field}[{i}]")
        if not ids:
            raise InputError(f"{field}[{i}] is empty: a stop sequence needs at least one token id")
        out.append(ids)
    return tuple(out)


def _ids(value: Any, vocab: int, field: str) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise InputError(f"{field}={value!r} must be a sequence of token ids (ints)")
    try:
        items = list(np.asarray(value).reshape(-1).tolist()) if hasattr(value, "__array__") else list(value)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{field} could not be read as token ids: {exc}") from None
    for i, item in enumerate(items):
        if isinstance(item, bool) or not isinstance(item, int):
            raise InputError(f"{field}[{i}]={item!r} is not an int token id")
        if not 0 <= item < vocab:
            raise InputError(f"{field}[{i}]={item} is outside the vocabulary [0, {vocab})")
    return tuple(items)


def _int(value: Any, field: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise InputError(f"{field}={value!r} must be an int >= {low}")
    return int(value)


def _temperature(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InputError(f"{field}={value!r} must be a finite number > 0")
    return float(value)


def _fraction(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise InputError(f"{field}={value!r} must be a number in (0, 1]")
    return float(value)
