"""OpenAI's completions and chat completions: the response bodies (pydantic), and the log-probabilities' shapes.

:class:`Completion`, :class:`ChatCompletion`, their streamed :class:`Chunk` and the model cards are
the JSON OpenAI's API answers. Log-probabilities come in each API's own shape: completions'
``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`` (:func:`completion_logprobs`) and
chat's ``{"content": [{"token", "logprob", "bytes", "top_logprobs"}], "refusal"}``
(:func:`chat_logprobs`); a log-probability of minus infinity (a token a processor ruled out) is
written -9999.0, as vLLM writes it (JSON has no infinity).
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel

from pyrt._version import __version__

FINGERPRINT = f"pyrt-{__version__}"
FLOOR = -9999.0  # a log-probability of -inf, as JSON can carry it
TokenText = Callable[[int], tuple[str, list[int]]]  # a token id -> its text and bytes


def new_id(prefix: str) -> str:
    """A new answer id: ``prefix`` (``chatcmpl-``, ``cmpl-``) and 32 hex digits."""
    return prefix + uuid.uuid4().hex


def now() -> int:
    return int(time.time())


def finish(reason: str | None) -> str | None:
    """OpenAI's finish reason: a full cache is "length"."""
    return "length" if reason == "cache_full" else reason


def finite(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else FLOOR


class PromptTokensDetails(BaseModel):
    cached_tokens: int  # prompt tokens a KV-cache slot held already (prefix caching), not prefilled again


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails

    @classmethod
    def of(cls, prompt: int, completion: int, cached: int = 0) -> Usage:
        return cls(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                   prompt_tokens_details=PromptTokensDetails(cached_tokens=cached))


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob]
    refusal: None = None


def completion_logprobs(items: Sequence[Any], token_text: TokenText, offset: int, echo: str = "",
                        echoed: int = 0) -> CompletionLogprobs:
    """Completions' shape of ``items`` (:class:`pyrt.llm.processors.TokenLogprob`, or None for a token without
    one: the first prompt token of ``echo``), the first token's text at character ``offset``. ``top_logprobs``: the
    alternatives asked for, and the chosen token (as vLLM and OpenAI give it).

    With ``echo``, the first ``echoed`` items are the prompt's, whose text ``echo`` is: their offsets are where
    their texts are in it (:func:`echo_offsets`: a token the text leaves out, as the BOS, takes no characters),
    and the tokens after them start at ``offset + len(echo)``."""
    out = CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
    texts = [token_text(token)[0] for token, _ in items]
    starts = [offset + at for at in echo_offsets(texts[:echoed], echo)] if echoed else []
    offset += len(echo) if echoed else 0
    for text in texts[len(starts):]:
        starts.append(offset)
        offset += len(text)
    for (_, item), text, start in zip(items, texts, starts, strict=True):
        out.tokens.append(text)
        out.text_offset.append(start)
        if item is None:
            out.token_logprobs.append(None)
            out.top_logprobs.append(None)
            continue
        out.token_logprobs.append(finite(item.logprob))
        top: dict[str, float] = {}
        for t, lp in item.top:  # keyed by text: of tokens with one text (an incomplete character), the likeliest
            top.setdefault(token_text(t)[0], finite(lp))
        top.setdefault(text, finite(item.logprob))
        out.top_logprobs.append(top)
    return out


def echo_offsets(texts: Sequence[str], echo: str) -> list[int]:
    """Where each of a prompt's token texts starts in its echoed text: at the next character, or one further (a
    SentencePiece token's text drops the space before it); one that is not there (a special token the text leaves
    out) takes no characters.

    >>> echo_offsets(["<|bos|>", "Once", " upon", "a"], "Once upon a")
    [0, 0, 4, 10]
    """
    out, at = [], 0
    for text in texts:
        found = echo.find(text, at, at + len(text) + 1) if text else -1
        out.append(at if found < 0 else found)
        at = at if found < 0 else found + len(text)
    return out


def chat_logprobs(items: Sequence[Any], token_text: TokenText) -> ChatLogprobs:
    """Chat's shape of ``items`` (:class:`pyrt.llm.processors.TokenLogprob`)."""
    content = []
    for item in items:
        text, raw = token_text(item.token)
        top = [TopLogprob(token=t, logprob=finite(lp), bytes=b)
               for (t, b), lp in ((token_text(i), lp) for i, lp in item.top)]
        content.append(TokenLogprob(token=text, logprob=finite(item.logprob), bytes=raw, top_logprobs=top))
    return ChatLogprobs(content=content)


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None


class ChatChoice(BaseModel):
    index: int = 0
    message: dict[str, Any]  # role, content (and tool_calls when there are some)
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: dict[str, Any]
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None


class Head(BaseModel):
    id: str
    object: str
    created: int
    model: str
    system_fingerprint: str = FINGERPRINT


class Completion(Head):
    object: str = "text_completion"
    choices: list[CompletionChoice]
    usage: Usage


class ChatCompletion(Head):
    object: str = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage


class Chunk(Head):
    """A streamed chunk (``choices`` empty in the last one of ``include_usage``, which has the usage);
    ``usage`` is left out of the JSON unless the request asked for it."""

    choices: list[CompletionChoice] | list[ChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    """``GET /v1/models`` entry (``max_model_len``: the cache's positions, as vLLM reports)."""

    id: str
    object: str = "model"
    created: int
    owned_by: str = "pyrt"
    max_model_len: int


class ModelList(BaseModel):
    object: str = "list"
    data: list[ModelCard]
