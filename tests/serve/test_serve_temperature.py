"""Temperature 0 is greedy everywhere (pyrt.generate, SamplingParams, the OpenAI and generate routes), and every
bad temperature gets one message (issue 46: ``--sample --temperature 0`` was refused; the server's messages for
-1 and 1e309 disagreed)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("pydantic")

from pyrt.errors import InputError  # noqa: E402
from pyrt.llm import SamplingParams  # noqa: E402
from pyrt.serve.generate import GenerateRequest  # noqa: E402
from pyrt.serve.openai_api import ChatRequest, CompletionRequest  # noqa: E402
from pyrt.serve.validation import parse  # noqa: E402

BODIES: dict[str, tuple[Any, bytes]] = {
    "completions": (CompletionRequest, b'{"model": "m", "prompt": "Hi", "temperature": %s}'),
    "chat": (ChatRequest, b'{"model": "m", "messages": [{"role": "user", "content": "Hi"}], "temperature": %s}'),
    "generate": (GenerateRequest, b'{"text_input": "Hi", "temperature": %s}'),
    "generate do_sample": (GenerateRequest, b'{"text_input": "Hi", "do_sample": true, "temperature": %s}'),
}


def params(route: str, value: bytes) -> SamplingParams:
    model, body = BODIES[route]
    request: Any = parse(model, body % value)
    got: SamplingParams = request.sampling_params((2,))
    return got


def test_temperature_0_is_greedy_whatever_do_sample_says() -> None:
    assert SamplingParams(do_sample=True, temperature=0) == SamplingParams()
    for route in BODIES:
        got = params(route, b"0")
        assert (got.do_sample, got.temperature) == (False, 1.0), route
        assert params(route, b"0.5").do_sample and params(route, b"0.5").temperature == 0.5, route


@pytest.mark.parametrize("value", [b"-1", b"1e309", b"-1e309"])
def test_a_bad_temperature_gets_one_message_on_every_route(value: bytes) -> None:
    said = set()
    for route in BODIES:
        with pytest.raises(InputError) as caught:
            params(route, value)
        said.add(str(caught.value).split("=", 1)[1].split(" ", 1)[1])  # past "temperature=VALUE "
    with pytest.raises(InputError) as caught:
        SamplingParams(do_sample=True, temperature=float(value))
    said.add(str(caught.value).split("=", 1)[1].split(" ", 1)[1])
    assert said == {"must be a finite number >= 0 (0: greedy)"}
