"""OpenAI's completions and chat completions: the request bodies (pydantic), no server, no engine.

:class:`CompletionRequest` and :class:`ChatRequest` are the request bodies, each turned into one
:class:`pyrt.llm.SamplingParams` by :meth:`OpenAIRequest.sampling_params` (temperature 0: greedy;
``top_k`` -1 or 0: no cut). Parameters: ``model``, ``prompt`` (text or token ids; one prompt) or
``messages``, ``max_tokens`` (completions default 16, as OpenAI's; chat: until EOS or a full
cache) / ``max_completion_tokens``, ``temperature`` (0: greedy; default 1), ``top_p``, ``top_k``
(vLLM's), ``seed`` (any signed 64-bit int), ``stop`` (a string or a list of strings), ``stream``,
``stream_options`` (``include_usage``; vLLM's ``continuous_usage_stats``), ``n`` (choices, each its
own random stream: with ``seed`` s, choice i draws with seed s + i), completions' ``best_of`` (the
``n`` of that many with the highest cumulative log-probability) and ``echo``, ``logprobs`` /
``top_logprobs``, the penalties (``presence_penalty``, ``frequency_penalty``, vLLM's
``repetition_penalty``), ``logit_bias``, vLLM's ``min_p``, ``min_tokens``, ``stop_token_ids``,
``ignore_eos``, ``skip_special_tokens``, ``include_stop_str_in_output``, chat's
``add_generation_prompt``, ``continue_final_message``, ``chat_template_kwargs``,
``response_format`` and ``tools`` / ``tool_choice`` (:mod:`pyrt.serve.structured`). Fields
OpenAI has and pyrt does not implement (``suffix``, the deprecated ``functions``) are accepted at
their neutral values and refused otherwise; unknown fields are refused. The types are checked
here, the sampling bounds by ``SamplingParams`` (once); :meth:`OpenAIRequest.spelled` names its
fields the client's way. The responses are :mod:`pyrt.serve.openai_answers`.

>>> from pyrt.serve.validation import parse
>>> req = parse(CompletionRequest, b'{"model": "m", "prompt": "Hi", "temperature": 0, "stop": "."}')
>>> req.prompt, req.sampling_params(eos_ids=(0,)).do_sample, req.limit(), req.stop
('Hi', False, 16, ('.',))
>>> parse(CompletionRequest, b'{"model": "m", "prompt": "Hi", "n": 2, "best_of": 1}')
Traceback (most recent call last):
...
pyrt.errors.InputError: best_of=1 must be >= n (2)
>>> req = parse(ChatRequest, b'{"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 0}')
>>> req.sampling_params(eos_ids=())
Traceback (most recent call last):
...
pyrt.errors.InputError: max_new_tokens=0 must be an int >= 1
>>> req.spelled("max_new_tokens"), req.spelled("prompt_ids")
('max_tokens', 'messages')
"""

from __future__ import annotations

import json
from collections.abc import Mapping
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
    model_validator,
)

from pyrt.checks import is_number
from pyrt.errors import InputError
from pyrt.llm import SamplingParams
from pyrt.llm.params import TEMPERATURE_WANTED
from pyrt.serve.structured import GUIDED
from pyrt.serve.validation import Bad, Body, StopStrings

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's (and vLLM's) default for /v1/completions
MAX_CHOICES = 64  # n and best_of: the most sequences one request generates
DEFAULTABLE = ("temperature", "top_p", "top_k", "repetition_penalty", "min_p")  # generation_config.json's
NEUTRAL: dict[str, tuple[Any, ...]] = {  # fields pyrt does not implement, and the values that ask for nothing
    "suffix": ("",), "functions": ([],), "function_call": ("none",),
}


def neutral(value: Any, info: ValidationInfo) -> Any:
    """A field pyrt does not implement: None or a value that asks for nothing (a bool only where one is)."""
    if value is None or any(value == n and isinstance(value, bool) == isinstance(n, bool)
                            for n in NEUTRAL[str(info.field_name)]):
        return value
    raise Bad(" is not supported by pyrt serve")


Neutral = Annotated[Any, BeforeValidator(neutral)]


def biases(value: Any) -> Any:
    """OpenAI's ``logit_bias``: an object whose keys are token ids written as strings (ints taken too)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise Bad(" must be an object mapping token ids to biases")
    out = {}
    for key, bias in value.items():
        if isinstance(key, str) and key.strip().lstrip("-").isdigit():
            key = int(key)
        if not isinstance(key, int):
            raise Bad(f": key {key!r} is not a token id", show_value=False)
        out[key] = bias
    return out


class StreamOptions(Body):
    include_usage: StrictBool | None = None
    continuous_usage_stats: StrictBool | None = None  # vLLM's: the usage so far in every chunk


class OpenAIRequest(Body):
    """What completions and chat completions share."""

    model: str | None = None  # None: the one model the server generates with (as vLLM)
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
    n: StrictInt | None = None
    presence_penalty: StrictFloat | None = None
    frequency_penalty: StrictFloat | None = None
    repetition_penalty: StrictFloat | None = None
    logit_bias: Annotated[dict[int, Any] | None, BeforeValidator(biases)] = None
    min_p: StrictFloat | None = None
    min_tokens: StrictInt | None = None
    stop_token_ids: list[StrictInt] | None = None
    skip_special_tokens: StrictBool = True
    include_stop_str_in_output: StrictBool = False
    response_format: dict[str, Any] | None = None
    guided_json: Any = None  # vLLM's structured-output fields (pyrt.serve.structured.GUIDED)
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None

    @field_validator("model", mode="before")
    @classmethod
    def _model(cls, value: Any) -> str | None:
        if value is not None and (not isinstance(value, str) or not value):
            raise Bad(" must be a model name (GET /v1/models lists them), or left out when one model is served")
        return value

    @field_validator("temperature")
    @classmethod
    def _greedy_at_zero(cls, value: float | None) -> float | None:
        """OpenAI's range starts at 0, which means greedy (SamplingParams' rule and message: one for every route)."""
        if value is not None and not is_number(value, low=0):
            raise Bad(f" must be {TEMPERATURE_WANTED}")
        return value

    @field_validator("n")
    @classmethod
    def _choices(cls, value: int | None) -> int | None:
        if value is not None and not 1 <= value <= MAX_CHOICES:
            raise Bad(f" must be an int in [1, {MAX_CHOICES}]")
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
    def choices(self) -> int:
        """Choices answered (``n``)."""
        return self.n or 1

    @property
    def sequences(self) -> int:
        """Sequences generated (``best_of`` where it is more than ``n``)."""
        return self.choices

    @property
    def logprobs_wanted(self) -> int | None:
        """``SamplingParams.logprobs``: None, or the alternatives per token."""
        return None

    @property
    def prompt_logprobs_wanted(self) -> int | None:
        """``SamplingParams.prompt_logprobs``: completions' ``echo`` with ``logprobs``."""
        return None

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return self.stop

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def guided(self) -> dict[str, Any]:
        """vLLM's ``guided_*`` fields: name -> value (None: not given)."""
        return {name: getattr(self, name) for name in GUIDED}

    @property
    def continuous_usage(self) -> bool:
        return self.include_usage and bool(self.stream_options and self.stream_options.continuous_usage_stats)

    def sampling_params(self, eos_ids: tuple[int, ...], defaults: Mapping[str, Any] | None = None,
                        grammar: Any = None) -> SamplingParams:
        """The request's :class:`SamplingParams` (InputError naming its field). ``eos_ids``: the server's EOS ids,
        used unless ``ignore_eos`` (``stop_token_ids`` end it too); ``defaults``: the tokenizer directory's
        generation_config.json values of :data:`DEFAULTABLE` for fields the request leaves out."""
        given = {name: getattr(self, name) for name in DEFAULTABLE}
        given = {k: (v if v is not None else (defaults or {}).get(k)) for k, v in given.items()}
        greedy = given["temperature"] == 0
        eos = (*(() if self.ignore_eos else eos_ids), *(self.stop_token_ids or ()))
        return SamplingParams(
            max_new_tokens=self.limit(), do_sample=not greedy,
            temperature=1.0 if greedy or given["temperature"] is None else given["temperature"],
            top_k=None if given["top_k"] in (None, -1, 0) else given["top_k"],  # vLLM's "no cut"
            top_p=given["top_p"], seed=self.seed, eos_ids=eos,
            logit_bias=self.logit_bias or (), repetition_penalty=given["repetition_penalty"] or 1.0,
            frequency_penalty=self.frequency_penalty or 0.0, presence_penalty=self.presence_penalty or 0.0,
            min_tokens=self.min_tokens or 0, min_p=given["min_p"] or None, logprobs=self.logprobs_wanted,
            prompt_logprobs=self.prompt_logprobs_wanted, grammar=grammar)


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
    logprobs: StrictInt | None = None
    echo: StrictBool = False
    best_of: StrictInt | None = None
    suffix: Neutral = None

    @field_validator("max_new_tokens", mode="before")
    @classmethod
    def _default(cls, value: Any) -> Any:
        return COMPLETION_DEFAULT_MAX_TOKENS if value is None else value

    @model_validator(mode="after")
    def _best_of(self) -> CompletionRequest:
        if self.best_of is not None:
            if self.best_of < self.choices or self.best_of > MAX_CHOICES:
                raise InputError(f"best_of={self.best_of} must be >= n ({self.choices})"
                                 + (f" and <= {MAX_CHOICES}" if self.best_of > MAX_CHOICES else ""), field="best_of")
            if self.stream and self.best_of > self.choices:
                raise InputError("best_of > n cannot be streamed (the best are known at the end)", field="best_of")
        return self

    def limit(self) -> int | None:
        return self.max_new_tokens

    @property
    def sequences(self) -> int:
        return max(self.best_of or 1, self.choices)

    @property
    def logprobs_wanted(self) -> int | None:
        if self.sequences > self.choices:  # the best are chosen by their cumulative log-probability
            return self.logprobs or 0
        return self.logprobs

    @property
    def prompt_logprobs_wanted(self) -> int | None:
        return self.logprobs if self.echo else None

    def spelled(self, field: str) -> str:
        if field == "prompt_logprobs":
            return "logprobs"
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
    """One chat message: ``role`` and ``content`` (text, or text parts); a ``name`` that is text is kept; an
    assistant's ``tool_calls`` and a tool result's ``tool_call_id`` go to the chat template."""

    role: str
    content: Annotated[list[Annotated[TextPart, BeforeValidator(text_part)]],
                       BeforeValidator(content_parts)] = Field(default_factory=list)
    name: Annotated[str | None, BeforeValidator(lambda v: v if isinstance(v, str) else None)] = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    def for_template(self) -> dict[str, Any]:
        """The message as a chat template takes it: ``role``, ``content`` text (parts joined), ``name``, and tool
        calls with their ``arguments`` as an object (as Hugging Face's templates read them)."""
        out: dict[str, Any] = {"role": self.role, "content": "\n".join(part.text for part in self.content)}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            out["tool_calls"] = [template_call(call) for call in self.tool_calls]
        return out


def template_call(call: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI tool call with its ``function.arguments`` (JSON text) parsed, as chat templates take it."""
    function = dict(call.get("function") or {})
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            function["arguments"] = json.loads(arguments)
        except ValueError:
            pass  # the template gets the text as sent
    return {**call, "function": function}


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
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool | None = None
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    chat_template_kwargs: dict[str, Any] | None = None
    functions: Neutral = None
    function_call: Neutral = None

    @model_validator(mode="after")
    def _consistent(self) -> ChatRequest:
        if self.top_logprobs is not None and self.top_logprobs > 0 and not self.logprobs:
            raise InputError("top_logprobs needs logprobs: true", field="top_logprobs")
        if self.continue_final_message and self.add_generation_prompt:
            raise InputError("continue_final_message needs add_generation_prompt: false (the final message is "
                             "continued, not answered)", field="continue_final_message")
        if self.continue_final_message and self.messages[-1].role != "assistant":
            raise InputError("continue_final_message needs a final assistant message", field="continue_final_message")
        return self

    def limit(self) -> int | None:
        """``max_completion_tokens`` over ``max_tokens`` (as vLLM); None: until EOS or a full cache."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def logprobs_wanted(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def spelled(self, field: str) -> str:
        if field == "prompt_ids":
            return "messages"
        if field == "max_new_tokens":
            return "max_tokens" if self.max_completion_tokens is None else "max_completion_tokens"
        if field == "logprobs":
            return "top_logprobs"
        return super().spelled(field)
