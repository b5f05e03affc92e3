"""OpenAI's completions and chat completions: request checks and response shapes (no server, no engine).

:func:`completion_spec` and :func:`chat_spec` check a request body before any run and return a
:class:`Spec` (what to submit to the engine); a bad value is an :class:`ApiError` naming the
field (400). Parameters: ``model``, ``prompt`` (text or token ids; one prompt) or ``messages``,
``max_tokens`` (completions default 16, as OpenAI's; chat: until EOS or a full cache) /
``max_completion_tokens``, ``temperature`` (0: greedy; default 1), ``top_p``, ``top_k`` (vLLM's
extension; -1 or 0: no cut), ``seed``, ``stop`` (a string or a list of strings), ``stream``,
``stream_options`` (``include_usage``; vLLM's ``continuous_usage_stats``: the usage so far in
every chunk), ``n`` (1), ``ignore_eos`` (vLLM's extension). Fields OpenAI
has and pyrt does not implement (``logprobs``, ``echo``, penalties, ``logit_bias``, tools, ...)
are accepted at their neutral values and refused otherwise; unknown fields are refused.

>>> spec = completion_spec({"model": "m", "prompt": "Hi", "temperature": 0, "stop": "."})
>>> spec.text, spec.options["do_sample"], spec.options["max_new_tokens"], spec.stops
('Hi', False, 16, ('.',))
>>> completion_spec({"model": "m", "prompt": "Hi", "n": 2})
Traceback (most recent call last):
...
pyrt.serve.failures.ApiError: n=2: pyrt serve answers one choice per request (n=1)
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from pyrt._version import __version__
from pyrt.serve.failures import ApiError

FINGERPRINT = f"pyrt-{__version__}"
MAX_STOPS = 16
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's (and vLLM's) default for /v1/completions
COMMON = ("model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream", "stream_options", "n",
          "user", "ignore_eos", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs",
          "service_tier", "store", "metadata")
COMPLETION_FIELDS = (*COMMON, "prompt", "echo", "suffix", "best_of")
CHAT_FIELDS = (*COMMON, "messages", "max_completion_tokens", "response_format", "tools", "tool_choice",
               "parallel_tool_calls", "functions", "function_call")
NEUTRAL: dict[str, tuple[Any, ...]] = {  # fields pyrt does not implement, and the values that ask for nothing
    "presence_penalty": (0,), "frequency_penalty": (0,), "logit_bias": ({},), "logprobs": (False, 0),
    "top_logprobs": (0,), "echo": (False,), "suffix": ("",), "best_of": (1,), "response_format": ({"type": "text"},),
    "tools": ([],), "tool_choice": ("none",), "functions": ([],), "function_call": ("none",),
    "parallel_tool_calls": (True, False),
}
ENGINE_NAMES = {"max_new_tokens": "max_tokens", "prompt_ids": "prompt"}


@dataclass
class Spec:
    """A checked generation request: the prompt (ids, text or chat messages) and ``Engine.submit``'s options."""

    model: str
    ids: list[Any] | None = None  # token ids as sent (the engine checks them)
    text: str | None = None  # text to encode with the tokenizer
    messages: list[dict[str, Any]] | None = None  # chat messages for the tokenizer's chat template
    options: dict[str, Any] = field(default_factory=dict)
    stops: tuple[str, ...] = ()  # stop strings (need the tokenizer)
    ignore_eos: bool = False
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False  # vLLM's stream_options.continuous_usage_stats: usage in every chunk
    names: dict[str, str] = field(default_factory=dict)  # engine field -> the request's field, for messages
    request_id: str | None = None


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ApiError(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def _known(body: dict[str, Any], fields: tuple[str, ...]) -> None:
    extra = sorted(set(body) - set(fields))
    if extra:
        raise ApiError(f"unknown parameter {extra[0]!r} (pyrt serve takes: {', '.join(sorted(fields))})",
                       param=extra[0])
    for key, neutral in NEUTRAL.items():
        value = body.get(key)
        if value is not None and not any(value == n and isinstance(value, bool) == isinstance(n, bool)
                                         for n in neutral):
            raise ApiError(f"{key}={value!r} is not supported by pyrt serve", param=key)


def _model(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(f"model={model!r}: a model name is required (GET /v1/models lists them)", param="model")
    return model


def _flag(body: dict[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(f"{key}={value!r} must be true or false", param=key)
    return value


def sampling(body: dict[str, Any], where: str = "") -> dict[str, Any]:
    """``Engine.submit``'s sampling options from ``temperature`` (0: greedy), ``top_p``, ``top_k``, ``seed``."""
    temperature = body.get("temperature")
    if temperature is None:
        temperature = 1.0
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not math.isfinite(temperature) \
            or temperature < 0:
        raise ApiError(f"{where}temperature={temperature!r} must be a number >= 0 (0: greedy)",
                       param=f"{where}temperature")
    top_k = body.get("top_k")
    if isinstance(top_k, int) and not isinstance(top_k, bool) and top_k in (-1, 0):
        top_k = None  # vLLM's "no cut"
    options: dict[str, Any] = {"do_sample": temperature > 0, "top_k": top_k, "top_p": body.get("top_p"),
                               "seed": body.get("seed")}
    if temperature > 0:
        options["temperature"] = temperature
    return options


def stop_strings(value: Any, param: str = "stop") -> tuple[str, ...]:
    """``stop``: None, a string, or a list of up to :data:`MAX_STOPS` non-empty strings."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise ApiError(f"{param}={value!r} must be a string or a list of strings", param=param)
    if len(items) > MAX_STOPS or any(not s for s in items):
        raise ApiError(f"{param}={value!r}: give at most {MAX_STOPS} non-empty stop strings", param=param)
    return tuple(items)


def _stream(body: dict[str, Any]) -> tuple[bool, bool, bool]:
    """(stream, include_usage, continuous_usage_stats)."""
    stream = _flag(body, "stream")
    opts = body.get("stream_options")
    if opts is None:
        return stream, False, False
    if not stream:
        raise ApiError("stream_options is only allowed when stream is true", param="stream_options")
    if not isinstance(opts, dict) or set(opts) - {"include_usage", "continuous_usage_stats"}:
        raise ApiError(f"stream_options={opts!r}: pyrt serve takes include_usage and continuous_usage_stats",
                       param="stream_options")
    usage, continuous = _flag(opts, "include_usage"), _flag(opts, "continuous_usage_stats")
    return stream, usage, usage and continuous


def _max_tokens(body: dict[str, Any], keys: tuple[str, ...], default: int | None) -> tuple[Any, str]:
    for key in keys:  # the first given wins (max_completion_tokens over max_tokens, as vLLM)
        if body.get(key) is not None:
            return body[key], key
    return default, keys[-1]


def _common(body: dict[str, Any], fields: tuple[str, ...], keys: tuple[str, ...], default: int | None) -> Spec:
    body = _object(body)
    _known(body, fields)
    model = _model(body)
    n = body.get("n")
    if n is not None and (n != 1 or isinstance(n, bool)):
        raise ApiError(f"n={n!r}: pyrt serve answers one choice per request (n=1)", param="n")
    stream, usage, continuous = _stream(body)
    limit, key = _max_tokens(body, keys, default)
    options = {"max_new_tokens": limit, **sampling(body)}
    return Spec(model, options=options, stops=stop_strings(body.get("stop")), ignore_eos=_flag(body, "ignore_eos"),
                stream=stream, include_usage=usage, continuous_usage=continuous,
                names={**ENGINE_NAMES, "max_new_tokens": key})


def completion_spec(body: Any) -> Spec:
    """``POST /v1/completions``: the prompt as text or token ids (a list holding one of those is the same)."""
    spec = _common(body, COMPLETION_FIELDS, ("max_tokens",), COMPLETION_DEFAULT_MAX_TOKENS)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        spec.text = prompt
    elif isinstance(prompt, list) and not any(isinstance(p, (str, list)) for p in prompt):
        spec.ids = prompt
    elif isinstance(prompt, list):
        raise ApiError(f"prompt: pyrt serve takes one prompt per request, got a list of {len(prompt)}", param="prompt")
    else:
        raise ApiError(f"prompt={prompt!r} must be text or a list of token ids", param="prompt")
    return spec


def chat_spec(body: Any) -> Spec:
    """``POST /v1/chat/completions``: ``messages`` for the tokenizer's chat template."""
    spec = _common(body, CHAT_FIELDS, ("max_completion_tokens", "max_tokens"), None)
    spec.messages = messages(body.get("messages"))
    spec.names["prompt_ids"] = "messages"
    return spec


def messages(value: Any) -> list[dict[str, Any]]:
    """Chat messages as a chat template takes them: ``role`` and ``content`` text (text parts joined)."""
    if not isinstance(value, list) or not value:
        raise ApiError(f"messages={value!r} must be a non-empty list of messages", param="messages")
    out = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ApiError(f"{where}={message!r} must be an object with a role", param=where)
        content = message.get("content")
        if isinstance(content, list):
            content = "\n".join(_text_part(part, f"{where}.content[{j}]") for j, part in enumerate(content))
        elif content is None:
            content = ""
        elif not isinstance(content, str):
            raise ApiError(f"{where}.content={content!r} must be text or a list of text parts",
                           param=f"{where}.content")
        entry = {"role": message["role"], "content": content}
        if isinstance(message.get("name"), str):
            entry["name"] = message["name"]
        out.append(entry)
    return out


def _text_part(part: Any, where: str) -> str:
    if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        raise ApiError(f"{where}: a content part of type {kind!r}; pyrt serve takes text parts only", param=where)
    text: str = part["text"]
    return text


# -- responses -------------------------------------------------------------------------------------


def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex


def now() -> int:
    return int(time.time())


def finish(reason: str | None) -> str | None:
    """OpenAI's finish reason: a full cache is "length"."""
    return "length" if reason == "cache_full" else reason


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _head(rid: str, kind: str, created: int, model: str) -> dict[str, Any]:
    return {"id": rid, "object": kind, "created": created, "model": model, "system_fingerprint": FINGERPRINT}


def completion(rid: str, created: int, model: str, text: str, reason: str | None, use: dict[str, int]
               ) -> dict[str, Any]:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish(reason)}
    return {**_head(rid, "text_completion", created, model), "choices": [choice], "usage": use}


def chat(rid: str, created: int, model: str, text: str, reason: str | None, use: dict[str, int]) -> dict[str, Any]:
    choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
              "finish_reason": finish(reason)}
    return {**_head(rid, "chat.completion", created, model), "choices": [choice], "usage": use}


def chunk(chat_: bool, rid: str, created: int, model: str, delta: dict[str, Any] | str, reason: str | None,
          include_usage: bool) -> dict[str, Any]:
    """One streamed chunk: a chat ``delta`` object, or a completion's text."""
    if chat_:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish(reason)}
        out = {**_head(rid, "chat.completion.chunk", created, model), "choices": [choice]}
    else:
        choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": finish(reason)}
        out = {**_head(rid, "text_completion", created, model), "choices": [choice]}
    if include_usage:
        out["usage"] = None
    return out


def usage_chunk(chat_: bool, rid: str, created: int, model: str, use: dict[str, int]) -> dict[str, Any]:
    """The last chunk with ``stream_options.include_usage``: no choices, the usage."""
    kind = "chat.completion.chunk" if chat_ else "text_completion"
    return {**_head(rid, kind, created, model), "choices": [], "usage": use}


def model_card(name: str, created: int, max_model_len: int) -> dict[str, Any]:
    """``GET /v1/models`` entry (``max_model_len``: the cache's positions, as vLLM reports)."""
    return {"id": name, "object": "model", "created": created, "owned_by": "pyrt", "max_model_len": max_model_len}
