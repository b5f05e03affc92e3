"""Triton's generate extension for programs that follow the LLM convention (used by ``pyrt.serve``).

``generate_events(program, body)`` checks the request body before any run and returns an
iterator of events: ``{"token_id": int, "index": int}`` per new token, then one final
``{"finish_reason": "stop" | "length" | "cache_full", "token_ids": [...], "timings": {...}}``.

>>> body = {"input_ids": [1, 2, 3], "parameters": {"max_tokens": 8, "do_sample": True, "seed": 0}}
>>> events = generate_events(program, body)                                 # doctest: +SKIP
>>> [e for e in events][-1]["finish_reason"]                               # doctest: +SKIP
'length'
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyrt.errors import InputError
from pyrt.llm.convention import follows_convention, read_convention
from pyrt.llm.loop import Generation, start
from pyrt.llm.request import check_request

PARAMETERS = ("max_tokens", "do_sample", "temperature", "top_k", "top_p", "seed", "eos_ids")
_NAMES = {"prompt_ids": "input_ids", "max_new_tokens": "parameters.max_tokens",
          **{p: f"parameters.{p}" for p in PARAMETERS if p != "max_tokens"}}


def generate_events(program: Any, body: Any, method: str = "forward") -> Iterator[dict[str, Any]]:
    """The events of one generation for request ``body``; InputError naming the field, raised here."""
    if not isinstance(body, dict):
        raise InputError(f"the request body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - {"input_ids", "parameters"})
    if unknown:
        raise InputError(f"unknown request field(s) {unknown}; expected input_ids and parameters")
    if "input_ids" not in body:
        raise InputError("input_ids is missing: the request needs the prompt's token ids")
    params = body.get("parameters") or {}
    if not isinstance(params, dict):
        raise InputError(f"parameters must be a JSON object, got {type(params).__name__}")
    extra = sorted(set(params) - set(PARAMETERS))
    if extra:
        raise InputError(f"unknown parameter(s) {extra}; accepted: {', '.join(PARAMETERS)}")
    conv = read_convention(program, method)
    request = check_request(conv, body["input_ids"], max_new_tokens=params.get("max_tokens"),
                            do_sample=params.get("do_sample", False), temperature=params.get("temperature", 1.0),
                            top_k=params.get("top_k"), top_p=params.get("top_p"), seed=params.get("seed"),
                            eos_ids=params.get("eos_ids"), names=_NAMES)
    return _events(start(program, conv, request))


def _events(generation: Generation) -> Iterator[dict[str, Any]]:
    for index, token in enumerate(generation):
        yield {"token_id": token, "index": index}
    result = generation.result
    assert result is not None  # set when the generation ends
    yield {"finish_reason": result.finish_reason, "token_ids": list(result.tokens),
           "timings": result.timings.as_dict()}


__all__ = ["follows_convention", "generate_events", "PARAMETERS"]
