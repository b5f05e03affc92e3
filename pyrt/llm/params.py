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
>>> SamplingParams(seed=-1).numpy_seed == 2**64 - 1          # a signed 64-bit seed: its two's-complement bits
True
>>> SamplingParams(logit_bias={7: -100}, repetition_penalty=1.2).logit_bias
((7, -100.0),)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from pyrt.errors import InputError

TokenIds = tuple[int, ...]
SEED_LOW, SEED_END = -(1 << 63), 1 << 64  # a seed is a signed or an unsigned 64-bit value
MAX_LOGPROBS = 20  # the most alternatives per token (OpenAI's top_logprobs bound)
PENALTY = 2.0  # OpenAI's bound on presence_penalty and frequency_penalty: [-2, 2]
BIAS = 100.0  # OpenAI's bound on a logit_bias value: [-100, 100]


@dataclass(frozen=True)
class SamplingParams:
    """``max_new_tokens``: the cap on new tokens (None: until an EOS id or a full cache).
    ``do_sample``: False is greedy (``transformers``' ``do_sample=False``); True draws from the softmax
    of the logits divided by ``temperature``, cut to the ``top_k`` most likely ids and to the smallest
    set whose probability reaches ``top_p`` (None: no cut), with ``numpy.random.default_rng(seed)``.
    ``temperature`` 0 is greedy, whatever ``do_sample`` says (as vLLM and OpenAI's servers take it;
    the params then read ``do_sample=False, temperature=1.0``).
    ``eos_ids``: ids that end the generation (None: the program's ``get_eos_ids``; ``()``: none).
    ``stop``: token-id sequences that end it when its new tokens end with one. ``seed``: any signed
    or unsigned 64-bit int; a negative one draws as its two's-complement bits (``seed % 2**64``,
    :attr:`numpy_seed`), so -1 and 2**64 - 1 give the same tokens.

    Logits processors (:mod:`pyrt.llm.processors`, applied before temperature, greedy too, in this
    order): ``logit_bias`` (token id -> a value in [-100, 100] added to its logit, OpenAI's),
    ``repetition_penalty`` (> 0; 1: none; ``transformers``' ``RepetitionPenaltyLogitsProcessor``
    over the prompt and the new tokens), ``frequency_penalty`` and ``presence_penalty`` (in [-2, 2];
    OpenAI's: ``count * frequency + (count > 0) * presence`` taken from each logit, counting the new
    tokens), ``min_tokens`` (the ids that end the generation are masked until it has that many new
    tokens: ``transformers``' ``MinNewTokensLengthLogitsProcessor``); after top-k and top-p,
    ``min_p`` (in [0, 1]; ``MinPLogitsWarper``: tokens below ``min_p`` times the most likely one's
    probability are dropped). ``logprobs``: None, or how many most likely alternatives (0 to 20) to
    report with each new token's log-probability (:func:`pyrt.llm.processors.token_logprobs`: the
    log-softmax of the processed logits after temperature, before top-k, top-p and min-p).
    ``prompt_logprobs``: the same for each prompt token after the first (its row: the logits at the
    position before it; no processors), computed as the prompt is prefilled (each chunk then asks
    for a logits row per token). ``grammar``: structured output, an object whose ``matcher()`` makes a
    generation's state (:class:`pyrt.llm.processors.Matcher`): only the ids it allows are sampled, and
    the generation stops ("stop") when it is finished; a constrained sequence guesses no tokens
    (speculative decoding).
    """

    max_new_tokens: int | None = None
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    eos_ids: TokenIds | None = None
    stop: tuple[TokenIds, ...] = ()
    logit_bias: Any = ()
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    min_tokens: int = 0
    min_p: float | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    grammar: Any = None

    def __post_init__(self) -> None:
        if self.max_new_tokens is not None:
            self._set("max_new_tokens", whole(self.max_new_tokens, "max_new_tokens", low=1))
        if not isinstance(self.do_sample, bool):
            raise InputError(f"do_sample={self.do_sample!r} must be a bool", field="do_sample")
        heat = sampling_temperature(self.temperature, "temperature")
        self._set("do_sample", self.do_sample and heat > 0)  # 0: greedy
        self._set("temperature", heat or 1.0)
        if self.top_k is not None:
            self._set("top_k", whole(self.top_k, "top_k", low=1))
        if self.top_p is not None:
            self._set("top_p", fraction(self.top_p, "top_p"))
        if self.seed is not None:
            self._set("seed", whole(self.seed, "seed", low=SEED_LOW, end=SEED_END))
        if self.eos_ids is not None:
            self._set("eos_ids", token_ids(self.eos_ids, "eos_ids"))
        self._set("stop", stop_sequences(self.stop, "stop"))
        self._check_processors()

    def _check_processors(self) -> None:
        self._set("logit_bias", biases(self.logit_bias, "logit_bias"))
        self._set("repetition_penalty", temperature(self.repetition_penalty, "repetition_penalty"))
        for name in ("frequency_penalty", "presence_penalty"):
            self._set(name, number(getattr(self, name), name, -PENALTY, PENALTY))
        self._set("min_tokens", whole(self.min_tokens, "min_tokens", low=0))
        if self.max_new_tokens is not None and self.min_tokens > self.max_new_tokens:
            raise InputError(f"min_tokens={self.min_tokens} is more than max_new_tokens={self.max_new_tokens}",
                             field="min_tokens")
        if self.min_p is not None:
            self._set("min_p", number(self.min_p, "min_p", 0.0, 1.0))
        if self.logprobs is not None:
            self._set("logprobs", whole(self.logprobs, "logprobs", low=0, end=MAX_LOGPROBS + 1))
        if self.prompt_logprobs is not None:
            self._set("prompt_logprobs", whole(self.prompt_logprobs, "prompt_logprobs", low=0, end=MAX_LOGPROBS + 1))
        if self.grammar is not None and not callable(getattr(self.grammar, "matcher", None)):
            raise InputError(f"grammar={type(self.grammar).__name__} has no matcher()", field="grammar")

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)  # the checked, normalised value (a frozen dataclass)

    @property
    def numpy_seed(self) -> int | None:
        """The seed ``numpy.random.default_rng`` takes: ``seed % 2**64`` (None: fresh entropy)."""
        return None if self.seed is None else self.seed % SEED_END

    @property
    def processed(self) -> bool:
        """Whether any logits processor changes the logits (else they are used as the program returned them)."""
        return bool(self.logit_bias or self.repetition_penalty != 1.0 or self.frequency_penalty
                    or self.presence_penalty or self.min_tokens)


def whole(value: Any, field: str, low: int, end: int | None = None) -> int:
    """``value`` as an int >= ``low`` (and < ``end``; numpy ints too; bools and floats refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise InputError(f"{field}={value!r} must be an int >= {low}" + (f" and < {end}" if end else ""), field=field)
    if end is not None and value >= end:
        raise InputError(f"{field}={value!r} must be an int >= {low} and < {end}", field=field)
    return int(value)


def number(value: Any, field: str, low: float, high: float) -> float:
    """``value`` as a float in [``low``, ``high``]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise InputError(f"{field}={value!r} must be a number in [{low:g}, {high:g}]", field=field)
    return float(value)


def biases(value: Any, field: str) -> tuple[tuple[int, float], ...]:
    """``logit_bias``: a mapping (or pairs) of token id -> bias in [-100, 100], as sorted (id, bias) pairs."""
    items = value.items() if isinstance(value, dict) else value
    try:
        pairs = [(k, v) for k, v in items]
    except (TypeError, ValueError):
        raise InputError(f"{field}={value!r} must map token ids to numbers", field=field) from None
    out = {}
    for key, bias in pairs:
        if isinstance(key, bool) or not isinstance(key, (int, np.integer)) or key < 0:
            raise InputError(f"{field}: key {key!r} is not a token id (an int >= 0)", field=field)
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -BIAS <= bias <= BIAS:
            raise InputError(f"{field}[{key}]={bias!r} must be a number in [-100, 100]", field=field)
        out[int(key)] = float(bias)
    return tuple(sorted(out.items()))


TEMPERATURE_WANTED = "a finite number >= 0 (0: greedy)"


def sampling_temperature(value: Any, field: str = "temperature") -> float:
    """A sampling temperature: a finite number >= 0, 0 meaning greedy (every caller's one message for the rest)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InputError(f"{field}={value!r} must be {TEMPERATURE_WANTED}", field=field)
    return float(value)


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
