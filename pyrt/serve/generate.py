"""Triton's generate extension (``/v2/models/NAME/generate``, ``/generate_stream``): request checks, events.

A request body is a JSON object with the prompt as ``text_input`` (needs ``pyrt serve
--tokenizer``) or ``input_ids``, and the generation parameters either in ``parameters`` or at
the top level (as Triton's TensorRT-LLM models take them): ``max_tokens`` (the cap on new
tokens; ``max_new_tokens`` in ``pyrt.generate``; default: until EOS or a full cache),
``temperature`` (0: greedy), ``do_sample`` (default: sample when ``temperature`` > 0),
``top_k``, ``top_p``, ``seed``, ``eos_ids``, ``stop`` (strings, cut from the text and ending
with ``finish_reason`` "stop"; or lists of token ids). ``id`` is echoed back.

``/generate`` answers ``{"model_name", "model_version", "text_output", "token_ids",
"finish_reason", "timings", "usage"}``; ``/generate_stream`` sends one server-sent event per new
token (``{"token_id", "index", "text_output"}``, the text that token completes, maybe "") and
a final one (``{"finish_reason", "token_ids", "timings", "usage", "text_output"}``, the text
held back until the end); the ``text_output`` of all events joined is ``/generate``'s.
``text_output`` is there when the server has a tokenizer.

>>> spec = generate_spec("m", {"text_input": "Hi", "max_tokens": 4, "parameters": {"temperature": 0}})
>>> spec.text, spec.options["max_new_tokens"], spec.options["do_sample"]
('Hi', 4, False)
"""

from __future__ import annotations

from typing import Any

from pyrt.serve.failures import ApiError
from pyrt.serve.llm_host import Piece
from pyrt.serve.openai_api import Spec, sampling, stop_strings
from pyrt.serve.protocol import VERSION

PARAMETERS = ("max_tokens", "do_sample", "temperature", "top_k", "top_p", "seed", "eos_ids", "stop")
FIELDS = ("id", "text_input", "input_ids", "parameters", *PARAMETERS)
NAMES = {"prompt_ids": "input_ids", "max_new_tokens": "max_tokens"}


def _parameters(body: dict[str, Any]) -> dict[str, Any]:
    params = body.get("parameters") or {}
    if not isinstance(params, dict):
        raise ApiError(f"parameters={params!r} must be a JSON object", param="parameters")
    extra = sorted(set(params) - set(PARAMETERS))
    if extra:
        raise ApiError(f"unknown parameter(s) {extra}; accepted: {', '.join(PARAMETERS)}", param="parameters")
    both = sorted(set(params) & set(body))
    if both:
        raise ApiError(f"{both[0]} is given both at the top level and in parameters; give it once", param=both[0])
    return {**{k: body[k] for k in PARAMETERS if k in body}, **params}


def _sampling(params: dict[str, Any]) -> dict[str, Any]:
    do_sample = params.get("do_sample")
    if do_sample is not None and not isinstance(do_sample, bool):
        raise ApiError(f"do_sample={do_sample!r} must be a bool", param="do_sample")
    temperature = params.get("temperature")
    if do_sample and temperature == 0:
        raise ApiError("do_sample is true and temperature is 0 (greedy): give one", param="temperature")
    if do_sample is False or (do_sample is None and temperature is None):
        temperature = 0  # greedy: pyrt.generate's default
    elif temperature is None:
        temperature = 1.0
    return sampling({**params, "temperature": temperature})


def _stop(value: Any) -> tuple[tuple[str, ...], list[Any] | None]:
    """(stop strings, token-id stop sequences) from ``stop``."""
    if isinstance(value, list) and value and all(isinstance(s, list) for s in value):
        return (), value
    return stop_strings(value), None


def generate_spec(model: str, body: Any) -> Spec:
    """The request of ``POST /v2/models/{model}/generate[_stream]``, checked before any run."""
    if not isinstance(body, dict):
        raise ApiError(f"model {model!r}: the generate request must be a JSON object, got {type(body).__name__}")
    extra = sorted(set(body) - set(FIELDS))
    if extra:
        raise ApiError(f"unknown request field(s) {extra}; expected text_input or input_ids, and parameters "
                       f"({', '.join(PARAMETERS)})", param=extra[0])
    given = [k for k in ("text_input", "input_ids") if body.get(k) is not None]
    if len(given) != 1:
        raise ApiError("give the prompt as text_input (text) or input_ids (token ids), once"
                       + ("; got both" if len(given) == 2 else ""), param="text_input")
    rid = body.get("id")
    if rid is not None and not isinstance(rid, str):
        raise ApiError(f"id={rid!r} must be a string", param="id")
    params = _parameters(body)
    stops, stop_ids = _stop(params.get("stop"))
    options = {"max_new_tokens": params.get("max_tokens"), **_sampling(params), "eos_ids": params.get("eos_ids"),
               "stop": stop_ids}
    spec = Spec(model, options=options, stops=stops, names=dict(NAMES), request_id=rid)
    if "text_input" in given:
        if not isinstance(body["text_input"], str):
            raise ApiError(f"text_input={body['text_input']!r} must be a string", param="text_input")
        spec.text = body["text_input"]
    else:
        spec.ids = body["input_ids"]
    return spec


def _head(model: str, spec: Spec) -> dict[str, Any]:
    head: dict[str, Any] = {"model_name": model, "model_version": VERSION}
    if spec.request_id is not None:
        head["id"] = spec.request_id
    return head


def token_event(model: str, spec: Spec, piece: Piece, index: int, text: bool) -> dict[str, Any]:
    """A streamed event for one new token (``text``: with the text it completes)."""
    event = {**_head(model, spec), "token_id": piece.tokens[0], "index": index}
    if text:
        event["text_output"] = piece.text
    return event


def final_event(model: str, spec: Spec, piece: Piece, tokens: list[int], prompt: int, text: str | None
                ) -> dict[str, Any]:
    """The last event (``text``: the text held back until the end) or, with the whole text, the response."""
    event = {**_head(model, spec), "finish_reason": piece.finish_reason, "token_ids": tokens,
             "timings": piece.result.timings.as_dict() if piece.result is not None else {},
             "usage": {"prompt_tokens": prompt, "completion_tokens": len(tokens)}}
    if text is not None:
        event["text_output"] = text
    return event
