"""Triton's generate extension (``/v2/models/NAME/generate``, ``/generate_stream``): the request and event bodies.

A request (:class:`GenerateRequest`) is a JSON object with the prompt as ``text_input`` (needs
``pyrt serve --tokenizer``) or ``input_ids``, and the generation parameters
(:class:`GenerateParameters`) either in ``parameters`` or at the top level (as Triton's
TensorRT-LLM models take them), each given once: ``max_tokens`` (the cap on new tokens;
``max_new_tokens`` in ``pyrt.generate``; default: until EOS or a full cache), ``temperature``
(0: greedy), ``do_sample`` (default: sample when ``temperature`` > 0), ``top_k``, ``top_p``,
``seed``, ``eos_ids``, ``stop`` (strings, cut from the text and ending with ``finish_reason``
"stop"; or lists of token ids). ``id`` is echoed back. :meth:`GenerateRequest.sampling_params`
is its one conversion to :class:`pyrt.llm.SamplingParams`, which checks every bound.

``/generate`` answers ``{"model_name", "model_version", "text_output", "token_ids",
"finish_reason", "timings", "usage"}``; ``/generate_stream`` sends one server-sent event per new
token (:class:`TokenEvent`: ``{"token_id", "index", "text_output"}``, the text that token
completes, maybe "") and a final one (:class:`FinalEvent`: ``{"finish_reason", "token_ids",
"timings", "usage", "text_output"}``, the text held back until the end); the ``text_output`` of
all events joined is ``/generate``'s. ``text_output`` is there when the server has a tokenizer.

>>> from pyrt.serve.validation import parse
>>> req = parse(GenerateRequest, b'{"text_input": "Hi", "max_tokens": 4, "parameters": {"temperature": 0}}')
>>> params = req.sampling_params(eos_ids=(0,))
>>> req.text_input, params.max_new_tokens, params.do_sample, req.spelled("max_new_tokens")
('Hi', 4, False, 'max_tokens')
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, Field, StrictBool, StrictFloat, StrictInt, StrictStr, model_validator

from pyrt.errors import InputError
from pyrt.llm import SamplingParams
from pyrt.serve.protocol import VERSION
from pyrt.serve.validation import Body, stop_strings


def stops(value: Any) -> Any:
    """``stop``: lists of token ids as they are (``SamplingParams`` checks them), else stop strings."""
    if isinstance(value, list) and value and all(isinstance(s, list) for s in value):
        return value
    return stop_strings(value)


class GenerateParameters(Body):
    """The generation parameters, in ``parameters`` or at the top level."""

    max_new_tokens: StrictInt | None = Field(None, alias="max_tokens")
    do_sample: StrictBool | None = None
    temperature: StrictFloat | None = None
    top_k: StrictInt | None = None
    top_p: StrictFloat | None = None
    seed: StrictInt | None = None
    eos_ids: list[Any] | None = None  # token ids: SamplingParams and the vocabulary check them
    stop: Annotated[tuple[str, ...] | list[list[Any]], BeforeValidator(stops)] = ()

    def effective(self) -> GenerateParameters:
        """The parameters in force (a request's: those at its top level and in ``parameters``, as one)."""
        return self

    @property
    def stop_strings(self) -> tuple[str, ...]:
        stop = self.effective().stop
        return stop if isinstance(stop, tuple) else ()

    def greedy(self) -> bool:
        """``do_sample`` false, or neither it nor ``temperature`` given, or ``temperature`` 0 without ``do_sample``."""
        if self.do_sample is None:
            return self.temperature is None or self.temperature == 0
        return not self.do_sample

    def sampling_params(self, eos_ids: tuple[int, ...]) -> SamplingParams:
        """The :class:`SamplingParams` (InputError naming the field); ``eos_ids``: the server's, unless given."""
        p = self.effective()
        greedy = p.greedy()
        return SamplingParams(max_new_tokens=p.max_new_tokens, do_sample=not greedy,
                              temperature=1.0 if greedy or p.temperature is None else p.temperature,
                              top_k=p.top_k, top_p=p.top_p, seed=p.seed,
                              eos_ids=eos_ids if p.eos_ids is None else tuple(p.eos_ids),
                              stop=() if isinstance(p.stop, tuple) else tuple(map(tuple, p.stop)))


class GenerateRequest(GenerateParameters):
    """``POST /v2/models/{model}/generate[_stream]``: the prompt, the parameters, an ``id`` to echo."""

    id: StrictStr | None = None
    text_input: StrictStr | None = None
    input_ids: list[Any] | None = None  # token ids: checked against the vocabulary where they are submitted
    parameters: GenerateParameters | None = None

    @model_validator(mode="after")
    def _once(self) -> GenerateRequest:
        if (self.text_input is None) == (self.input_ids is None):
            raise InputError("give the prompt as text_input (text) or input_ids (token ids), once"
                             + ("; got both" if self.input_ids is not None else ""), field="text_input")
        if self.parameters is not None:
            both = sorted(self.parameters.model_fields_set & (self.model_fields_set - {"parameters"}))
            if both:
                name = self.spelled(both[0])
                raise InputError(f"{name} is given both at the top level and in parameters; give it once", field=name)
        return self

    def effective(self) -> GenerateParameters:
        if self.parameters is None:
            return self
        given = {name: getattr(self.parameters, name) for name in self.parameters.model_fields_set}
        return self.model_copy(update={**given, "parameters": None})

    def spelled(self, field: str) -> str:
        if field == "prompt_ids":
            return "text_input" if self.text_input is not None else "input_ids"
        return super().spelled(field)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int


class Head(BaseModel):
    model_name: str
    model_version: str = VERSION
    id: str | None = None  # the request's, echoed (left out of the JSON when it had none)


class TokenEvent(Head):
    """A streamed event for one new token (with the text it completes, when there is a tokenizer)."""

    token_id: int
    index: int
    text_output: str | None = None


class FinalEvent(Head):
    """The last event (``text_output``: the text held back until the end) or, with the whole text, the response."""

    finish_reason: str | None
    token_ids: list[int]
    timings: dict[str, Any]
    usage: Usage
    text_output: str | None = None
