"""OpenAI's completions and chat completions: the request and response bodies (pydantic), no server, no engine.

:class:`CompletionRequest` and :class:`ChatRequest` are the request bodies, each turned into one
:class:`pyrt.llm.SamplingParams` by :meth:`OpenAIRequest.sampling_params` (temperature 0: greedy;
``top_k`` -1 or 0: no cut). Parameters: ``model``, ``prompt`` (text or token ids; one prompt) or
``messages``, ``max_tokens`` (completions default 16, as OpenAI's; chat: until EOS or a full
cache) / ``max_completion_tokens``, ``temperature`` (0: greedy; default 1), ``top_p``, ``top_k``
(vLLM's extension), ``seed``, ``stop`` (a string or a list of strings), ``stream``,
``stream_options`` (``include_usage``; vLLM's ``continuous_usage_stats``: the usage so far in
every chunk), ``n`` (1), ``ignore_eos`` (vLLM's extension). Fields OpenAI has and pyrt does not
implement (``logprobs``, ``echo``, penalties, ``logit_bias``, tools, ...) are accepted at their
neutral values and refused otherwise; unknown fields are refused. The types are checked here,
the sampling bounds by ``SamplingParams`` (once); :meth:`OpenAIRequest.spelled` names its fields
the client's way. The responses (:class:`Completion`, :class:`ChatCompletion`, the chunks, the
model cards) are the JSON OpenAI's API answers (``logprobs`` null: not computed).

>>> from pyrt.serve.validation import parse
>>> req = parse(CompletionRequest, b'{"model": "m", "prompt": "Hi", "temperature": 0, "stop": "."}')
>>> req.prompt, req.sampling_params(eos_ids=(0,)).do_sample, req.limit(), req.stop
('Hi', False, 16, ('.',))
>>> parse(CompletionRequest, b'{"model": "m", "prompt": "Hi", "n": 2}')
Traceback (most recent call last):
...
pyrt.errors.InputError: n=2: pyrt serve answers one choice per request (n=1)
>>> req = parse(ChatRequest, b'{"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 0}')
>>> req.sampling_params(eos_ids=())
Traceback (most recent call last):
...
pyrt.errors.InputError: max_new_tokens=0 must be an int >= 1
>>> req.spelled("max_new_tokens"), req.spelled("prompt_ids")
('max_tokens', 'messages')
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    ValidationInfo,
    field_validator,
)

from pyrt._version import __version__
from pyrt.llm import SamplingParams
from pyrt.serve.validation import Bad, Body, StopStrings

FINGERPRINT = f"pyrt-{__version__}"
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's (and vLLM's) default for /v1/completions
NEUTRAL: dict[str, tuple[Any, ...]] = {  # fields pyrt does not implement, and the values that ask for nothing
    "presence_penalty": (0,), "frequency_penalty": (0,), "logit_bias": ({},), "logprobs": (False, 0),
    "top_logprobs": (0,), "echo": (False,), "suffix": ("",), "best_of": (1,), "response_format": ({"type": "text"},),
    "tools": ([],), "tool_choice": ("none",), "functions": ([],), "function_call": ("none",),
    "parallel_tool_calls": (True, False), "n": (1,),
}


def neutral(value: Any, info: ValidationInfo) -> Any:
    """A field pyrt does not implement: None or a value that asks for nothing (a bool only where one is)."""
    if value is None or any(value == n and isinstance(value, bool) == isinstance(n, bool)
                            for n in NEUTRAL[str(info.field_name)]):
        return value
    if info.field_name == "n":
        raise Bad(": pyrt serve answers one choice per request (n=1)")
    raise Bad(" is not supported by pyrt serve")


Neutral = Annotated[Any, BeforeValidator(neutral)]


class StreamOptions(Body):
    include_usage: StrictBool | None = None
    continuous_usage_stats: StrictBool | None = None  # vLLM's: the usage so far in every chunk


class OpenAIRequest(Body):
    """What completions and chat completions share."""

    model: str = Field(None, validate_default=True)  # refused when missing
    temperature: StrictFloat | None = None
    top_p: StrictFloat | None = None
    top_k: StrictInt | None = None
    seed: StrictInt | None = None
    stop: StopStrings = ()
    stream: StrictBool | None = None
    stream_options: StreamOptions | None = None
    ignore_eos: StrictBool | None = None
    user: Any = None
    service_tier: Any = None
    store: Any = None
    metadata: Any = None
    n: Neutral = None
    presence_penalty: Neutral = None
    frequency_penalty: Neutral = None
    logit_bias: Neutral = None
    logprobs: Neutral = None
    top_logprobs: Neutral = None

    @field_validator("model", mode="before")
    @classmethod
    def _model(cls, value: Any) -> str:
        if not isinstance(value, str) or not value:
            raise Bad(": a model name is required (GET /v1/models lists them)")
        return value

    @field_validator("temperature")
    @classmethod
    def _greedy_at_zero(cls, value: float | None) -> float | None:
        """OpenAI's range starts at 0, which means greedy here; SamplingParams bounds a sampling temperature."""
        if value is not None and value < 0:
            raise Bad(" must be >= 0 (0: greedy)")
        return value

    @field_validator("stream_options")
    @classmethod
    def _only_streamed(cls, value: StreamOptions | None, info: ValidationInfo) -> StreamOptions | None:
        if value is not None and not info.data.get("stream"):
            raise Bad(" is only allowed when stream is true", show_value=False)
        return value

    def limit(self) -> int | None:
        """The cap on new tokens (``SamplingParams.max_new_tokens``)."""
        raise NotImplementedError

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return self.stop

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return self.include_usage and bool(self.stream_options and self.stream_options.continuous_usage_stats)

    def sampling_params(self, eos_ids: tuple[int, ...]) -> SamplingParams:
        """The request's :class:`SamplingParams` (InputError naming its field); ``eos_ids``: the server's EOS ids,
        used unless ``ignore_eos``."""
        greedy = self.temperature == 0
        return SamplingParams(max_new_tokens=self.limit(), do_sample=not greedy,
                              temperature=1.0 if greedy or self.temperature is None else self.temperature,
                              top_k=None if self.top_k in (-1, 0) else self.top_k,  # vLLM's "no cut"
                              top_p=self.top_p, seed=self.seed, eos_ids=() if self.ignore_eos else eos_ids)


def one_prompt(value: Any) -> str | list[Any]:
    """The prompt as text or token ids (a list holding one of those is the same); several are refused."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]
    if isinstance(value, str) or (isinstance(value, list) and not any(isinstance(p, (str, list)) for p in value)):
        return value  # the ids are checked against the vocabulary where they are submitted
    if isinstance(value, list):
        raise Bad(f": pyrt serve takes one prompt per request, got a list of {len(value)}", show_value=False)
    raise Bad(" must be text or a list of token ids")


class CompletionRequest(OpenAIRequest):
    """``POST /v1/completions``."""

    prompt: Annotated[str | list[Any], BeforeValidator(one_prompt)] = Field(None, validate_default=True)
    max_new_tokens: StrictInt | None = Field(COMPLETION_DEFAULT_MAX_TOKENS, alias="max_tokens")
    echo: Neutral = None
    suffix: Neutral = None
    best_of: Neutral = None

    @field_validator("max_new_tokens", mode="before")
    @classmethod
    def _default(cls, value: Any) -> Any:
        return COMPLETION_DEFAULT_MAX_TOKENS if value is None else value

    def limit(self) -> int | None:
        return self.max_new_tokens

    def spelled(self, field: str) -> str:
        return "prompt" if field == "prompt_ids" else super().spelled(field)


def text_part(value: Any) -> Any:
    if not isinstance(value, dict) or value.get("type") != "text" or not isinstance(value.get("text"), str):
        kind = value.get("type") if isinstance(value, dict) else type(value).__name__
        raise Bad(f": a content part of type {kind!r}; pyrt serve takes text parts only", show_value=False)
    return value


def content_parts(value: Any) -> Any:
    """A message's content as text parts: text is one part, None none."""
    if value is None:
        return []
    if isinstance(value, str):
        return [{"type": "text", "text": value}]
    if not isinstance(value, list):
        raise Bad(" must be text or a list of text parts")
    return value


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class Message(BaseModel):
    """One chat message: ``role`` and ``content`` (text, or text parts); a ``name`` that is text is kept."""

    role: str
    content: Annotated[list[Annotated[TextPart, BeforeValidator(text_part)]],
                       BeforeValidator(content_parts)] = Field(default_factory=list)
    name: Annotated[str | None, BeforeValidator(lambda v: v if isinstance(v, str) else None)] = None

    def for_template(self) -> dict[str, str]:
        """The message as a chat template takes it: ``role``, ``content`` text (parts joined), ``name``."""
        out = {"role": self.role, "content": "\n".join(part.text for part in self.content)}
        if self.name is not None:
            out["name"] = self.name
        return out


def a_message(value: Any) -> Any:
    if not isinstance(value, dict) or not isinstance(value.get("role"), str):
        raise Bad(" must be an object with a role")
    return value


def some_messages(value: Any) -> Any:
    if not isinstance(value, list) or not value:
        raise Bad(" must be a non-empty list of messages")
    return value


class ChatRequest(OpenAIRequest):
    """``POST /v1/chat/completions``: ``messages`` for the tokenizer's chat template."""

    messages: Annotated[list[Annotated[Message, BeforeValidator(a_message)]],
                        BeforeValidator(some_messages)] = Field(None, validate_default=True)
    max_completion_tokens: StrictInt | None = None
    max_tokens: StrictInt | None = None
    response_format: Neutral = None
    tools: Neutral = None
    tool_choice: Neutral = None
    parallel_tool_calls: Neutral = None
    functions: Neutral = None
    function_call: Neutral = None

    def limit(self) -> int | None:
        """``max_completion_tokens`` over ``max_tokens`` (as vLLM); None: until EOS or a full cache."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def spelled(self, field: str) -> str:
        if field == "prompt_ids":
            return "messages"
        if field == "max_new_tokens":
            return "max_tokens" if self.max_completion_tokens is None else "max_completion_tokens"
        return super().spelled(field)


# -- responses -------------------------------------------------------------------------------------


def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex


def now() -> int:
    return int(time.time())


def finish(reason: str | None) -> str | None:
    """OpenAI's finish reason: a full cache is "length"."""
    return "length" if reason == "cache_full" else reason


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, prompt: int, completion: int) -> Usage:
        return cls(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: str | None


class AssistantMessage(BaseModel):
    role: str = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: None = None
    finish_reason: str | None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: dict[str, str]
    logprobs: None = None
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


def answer(chat: bool, rid: str, created: int, model: str, text: str, reason: str | None, usage: Usage
           ) -> Completion | ChatCompletion:
    """The whole (not streamed) answer."""
    if chat:
        choice = ChatChoice(message=AssistantMessage(content=text), finish_reason=finish(reason))
        return ChatCompletion(id=rid, created=created, model=model, choices=[choice], usage=usage)
    return Completion(id=rid, created=created, model=model, choices=[CompletionChoice(
        text=text, finish_reason=finish(reason))], usage=usage)


def chunk(chat: bool, rid: str, created: int, model: str, delta: dict[str, str] | str, reason: str | None,
          usage: Usage | None = None) -> Chunk:
    """One streamed chunk: a chat ``delta`` object, or a completion's text."""
    choices: list[CompletionChoice] | list[ChunkChoice]
    if isinstance(delta, dict):
        choices = [ChunkChoice(delta=delta, finish_reason=finish(reason))]
    else:
        choices = [CompletionChoice(text=delta, finish_reason=finish(reason))]
    kind = "chat.completion.chunk" if chat else "text_completion"
    return Chunk(id=rid, object=kind, created=created, model=model, choices=choices, usage=usage)


def usage_chunk(chat: bool, rid: str, created: int, model: str, usage: Usage) -> Chunk:
    """The last chunk with ``stream_options.include_usage``: no choices, the usage."""
    kind = "chat.completion.chunk" if chat else "text_completion"
    return Chunk(id=rid, object=kind, created=created, model=model, choices=[], usage=usage)


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
