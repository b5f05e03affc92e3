"""Structured output and tool calls through the real ``openai`` client: every answer parses and validates, even
from a random model (grammar-constrained decoding with llguidance), streamed and not.

The model is a one-layer random Llama of ``llm_small`` (vocabulary 2048) with a byte-level BPE holding
every byte and a Hermes-style chat template (tests/fixtures/llm_serve.py), served in process behind
uvicorn. Schemas are bounded (string lengths, enums, integer ranges), so a constrained answer always
ends within ``max_tokens``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("ray.serve")
pytest.importorskip("executorch")
pytest.importorskip("transformers")
pytest.importorskip("llguidance")
openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

from tests.fixtures import llm_serve as S  # noqa: E402

pytestmark = [pytest.mark.export]

NAME = "llama"
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "pet"],
          "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0,
                                                                             "maximum": 120},
                         "pet": {"enum": ["cat", "dog", "none"]}, "ok": {"type": "boolean"}}}
WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
           "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["C", "F"]}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "additionalProperties": False, "required": ["zone"],
             "properties": {"zone": {"enum": ["UTC", "CET"]}}}}}]
ASK = [{"role": "user", "content": "what is the weather in paris?"}]


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    replica = S.build(path=S.json_slot_file(), name=NAME, tokenizer=str(S.json_tokenizer_dir()))
    server = S.Served(replica)
    yield openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=300)
    server.close()
    S.close(replica)


def schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}


def test_every_json_schema_answer_parses_and_validates(client: Any) -> None:
    out = client.chat.completions.create(model=NAME, messages=ASK, max_tokens=120, temperature=1.0, seed=1, n=4,
                                         response_format=schema_format(PERSON))
    for choice in out.choices:
        assert choice.finish_reason == "stop", choice
        jsonschema.validate(json.loads(choice.message.content), PERSON)
    assert len({c.message.content for c in out.choices}) > 1  # four random streams, all valid
    chunks = list(client.completions.create(model=NAME, prompt="a person:", max_tokens=120, temperature=1.0, seed=2,
                                            stream=True, extra_body={"response_format": schema_format(PERSON)}))
    jsonschema.validate(json.loads("".join(c.choices[0].text for c in chunks if c.choices)), PERSON)
    greedy = client.completions.create(model=NAME, prompt="a person:", max_tokens=120, temperature=0,
                                       extra_body={"response_format": schema_format(PERSON)})
    jsonschema.validate(json.loads(greedy.choices[0].text), PERSON)


def test_json_object_mode_answers_a_json_object(client: Any) -> None:
    for seed in range(3):
        out = client.chat.completions.create(model=NAME, messages=ASK, max_tokens=200, temperature=0.7, seed=seed,
                                             response_format={"type": "json_object"})
        text = out.choices[0].message.content
        if out.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(text), dict), text
        else:  # cut by max_tokens: what there is, is the start of an object
            assert text.startswith("{"), text


def test_bad_response_formats_and_tool_choices_are_400(client: Any) -> None:
    for fields, param in [({"response_format": {"type": "xml"}}, "response_format"),
                          ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
                           "tool_choice"),
                          ({"tools": [{"type": "function"}], "tool_choice": "required"}, "tools"),
                          ({"tool_choice": "required"}, "tool_choice")]:
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model=NAME, messages=ASK, max_tokens=4, **fields)
        assert caught.value.body["param"] == param, (fields, caught.value.body)


def valid_call(call: Any) -> dict[str, Any]:
    schema = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}[call.function.name]
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, schema)
    assert call.id.startswith("call_") and call.type == "function"
    return arguments


def test_required_and_named_tool_choices_give_valid_tool_calls(client: Any) -> None:
    out = client.chat.completions.create(model=NAME, messages=ASK, tools=TOOLS, tool_choice="required",
                                         max_tokens=150, temperature=1.0, seed=3)
    message = out.choices[0].message
    assert out.choices[0].finish_reason == "tool_calls" and message.content is None and message.tool_calls
    for call in message.tool_calls:
        valid_call(call)
    named = {"type": "function", "function": {"name": "get_weather"}}
    out = client.chat.completions.create(model=NAME, messages=ASK, tools=TOOLS, tool_choice=named, max_tokens=80,
                                         temperature=0)
    (call,) = out.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and set(valid_call(call)) == {"city", "unit"}
    chunks = list(client.chat.completions.create(model=NAME, messages=ASK, tools=TOOLS, tool_choice=named,
                                                 max_tokens=80, temperature=0, stream=True))
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert len(deltas) == 1 and deltas[0].function.arguments == call.function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_an_agent_loop_sends_the_tool_result_back(client: Any) -> None:
    """The loop an OpenAI agent runs: a forced call, the tool's result as a "tool" message, then an answer."""
    messages: list[Any] = list(ASK)
    first = client.chat.completions.create(model=NAME, messages=messages, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=False, max_tokens=150, temperature=0)
    calls = first.choices[0].message.tool_calls
    assert len(calls) == 1 and valid_call(calls[0])
    messages.append({"role": "assistant", "content": None,
                     "tool_calls": [c.model_dump(exclude_none=True) for c in calls]})
    for call in calls:
        messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp": 21})})
    final = client.chat.completions.create(model=NAME, messages=messages, tools=TOOLS, max_tokens=8, temperature=0)
    assert final.choices[0].message.role == "assistant" and final.usage.prompt_tokens > first.usage.prompt_tokens
    import requests

    rendered = requests.post(client.base_url.join("/tokenize").__str__().replace("/v1/tokenize", "/tokenize"),
                             json={"messages": messages, "tools": TOOLS}, timeout=60).json()
    assert rendered["count"] == final.usage.prompt_tokens  # the tool result went through the chat template


def test_auto_tool_choice_parses_hermes_calls() -> None:
    from pyrt.serve.tool_calls import HermesStream, ToolFilter

    text = 'Let me look. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}</tool_call>'
    content, calls = ToolFilter("auto").whole(text)
    assert content == "Let me look. " and calls[0]["function"]["name"] == "get_weather"
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris", "unit": "C"}
    stream, sent = HermesStream(), []
    for i in range(0, len(text), 3):  # the tag split across deltas is held back, never sent as content
        sent.append(stream.add(text[i:i + 3]))
    rest, streamed = stream.finish()
    assert "".join(sent) + rest == "Let me look. " and streamed[0]["function"] == calls[0]["function"]
    assert ToolFilter("auto").whole("no call here") == ("no call here", [])
    assert ToolFilter("auto").whole("<tool_call>not json</tool_call>") == ("<tool_call>not json</tool_call>", [])
