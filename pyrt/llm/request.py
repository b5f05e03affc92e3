"""A generation request checked against the program that will run it, before any run.

:func:`make_request` adds to :class:`pyrt.llm.params.SamplingParams`' own checks the ones that
need the program's convention: every token id inside its vocabulary, the prompt and
``max_new_tokens`` inside its cache. Every problem is an :class:`pyrt.errors.InputError`
naming the field (``prompt_ids``, ``max_new_tokens``, ``eos_ids``, ``stop``) and its value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyrt.errors import InputError
from pyrt.llm.convention import Convention
from pyrt.llm.params import SamplingParams, TokenIds, token_ids


@dataclass(frozen=True)
class Request:
    """A checked request: the prompt's ids, its parameters, and the EOS ids that end it (resolved)."""

    prompt: TokenIds
    params: SamplingParams
    eos_ids: frozenset[int]


def make_request(conv: Convention, prompt_ids: Any, params: SamplingParams) -> Request:
    """A :class:`Request` for ``conv``'s program, or InputError naming the first field it cannot take."""
    prompt = in_vocabulary(token_ids(prompt_ids, "prompt_ids"), conv.vocab_size, "prompt_ids")
    if not prompt:
        raise InputError("prompt_ids is empty: a generation needs at least one prompt token", field="prompt_ids")
    if len(prompt) > conv.max_context_len:
        raise InputError(f"prompt_ids has {len(prompt)} tokens, more than the cache's {conv.max_context_len} "
                         "positions (get_max_context_len)", field="prompt_ids")
    room = conv.max_context_len - len(prompt) + 1  # the last token's logits need no cache position
    if params.max_new_tokens is not None and params.max_new_tokens > room:
        raise InputError(f"max_new_tokens={params.max_new_tokens} goes past the cache: a {len(prompt)}-token "
                         f"prompt leaves room for {room} new tokens in {conv.max_context_len} positions",
                         field="max_new_tokens")
    eos = conv.eos_ids if params.eos_ids is None else in_vocabulary(params.eos_ids, conv.vocab_size, "eos_ids")
    for i, sequence in enumerate(params.stop):
        in_vocabulary(sequence, conv.vocab_size, f"stop[{i}]")
    for token, _ in params.logit_bias:
        if token >= conv.vocab_size:
            raise InputError(f"logit_bias: token {token} is outside the vocabulary [0, {conv.vocab_size})",
                             field="logit_bias")
    return Request(prompt, params, frozenset(eos))


def in_vocabulary(ids: TokenIds, vocab: int, label: str) -> TokenIds:
    """``ids`` when each is in ``[0, vocab)``; else InputError naming the first that is not."""
    for i, item in enumerate(ids):
        if not 0 <= item < vocab:
            raise InputError(f"{label}[{i}]={item} is outside the vocabulary [0, {vocab})",
                             field=label.split("[")[0])
    return ids
