"""pyrt.llm.serving: the contract pyrt.serve's generate routes rely on (docs: notes/generate_contract)."""

from __future__ import annotations

import json
from typing import Any

import pytest

import pyrt
from pyrt.errors import InputError
from pyrt.llm import serving
from tests.fixtures import llm_models as L


@pytest.fixture(scope="module")
def gpt2() -> L.Exported:
    return L.exported("gpt2", "portable", route="pyrt")


@pytest.fixture
def prog(gpt2: L.Exported) -> Any:
    with pyrt.Program(gpt2.path) as p:
        yield p


def test_events_are_tokens_then_one_final_event(prog: Any, gpt2: L.Exported) -> None:
    body = {"input_ids": L.PROMPT, "parameters": {"max_tokens": L.NEW_TOKENS, "eos_ids": []}}
    events = list(serving.generate_events(prog, body))
    assert events[:-1] == [{"token_id": t, "index": i} for i, t in enumerate(gpt2.want)]
    final = events[-1]
    assert final["finish_reason"] == "length" and final["token_ids"] == gpt2.want
    assert final["timings"]["new_tokens"] == L.NEW_TOKENS and final["timings"]["decode_tokens_per_s"] > 0
    json.dumps(events)  # every event is JSON as it is (ints and floats, no numpy scalars)
    assert all(type(e["token_id"]) is int for e in events[:-1])


def test_parameters_are_optional_and_reach_the_sampler(prog: Any) -> None:
    plain = list(serving.generate_events(prog, {"input_ids": L.PROMPT}))
    assert plain[-1]["finish_reason"] in ("stop", "cache_full")  # no max_tokens: until EOS or a full cache
    if plain[-1]["finish_reason"] == "cache_full":
        assert len(plain[-1]["token_ids"]) == L.MAX_SEQ_LEN - len(L.PROMPT) + 1
    sampled = {"input_ids": L.PROMPT, "parameters": {"max_tokens": 6, "do_sample": True, "temperature": 1.5,
                                                     "top_k": 30, "top_p": 0.9, "seed": 11, "eos_ids": []}}
    first, again = (list(serving.generate_events(prog, sampled))[-1]["token_ids"] for _ in range(2))
    assert first == again and len(first) == 6
    direct = pyrt.generate(prog, L.PROMPT, max_new_tokens=6, do_sample=True, temperature=1.5, top_k=30, top_p=0.9,
                           seed=11, eos_ids=[]).tokens
    assert first == direct


def test_a_stop_id_ends_with_stop(prog: Any, gpt2: L.Exported) -> None:
    eos = gpt2.want[2]
    final = list(serving.generate_events(prog, {"input_ids": L.PROMPT, "parameters": {"eos_ids": [eos]}}))[-1]
    assert final["finish_reason"] == "stop" and final["token_ids"][-1] == eos


@pytest.mark.parametrize(("body", "match"), [
    ([1, 2], "request body must be a JSON object, got list"),
    ({"parameters": {}}, "input_ids is missing"),
    ({"input_ids": [1], "prompt": "x"}, r"unknown request field\(s\) \['prompt'\]"),
    ({"input_ids": [1], "parameters": 3}, "parameters must be a JSON object"),
    ({"input_ids": [1], "parameters": {"max_new_tokens": 3}}, r"unknown parameter\(s\) \['max_new_tokens'\]"),
    ({"input_ids": [1, 999]}, r"input_ids\[1\]=999 is outside the vocabulary"),
    ({"input_ids": list(range(3, 52))}, "input_ids has 49 tokens, more than the cache's 48"),
    ({"input_ids": [1], "parameters": {"max_tokens": 49}}, "parameters.max_tokens=49 goes past the cache"),
    ({"input_ids": [1], "parameters": {"temperature": -1}}, "parameters.temperature=-1 must be"),
    ({"input_ids": [1], "parameters": {"top_p": 0}}, "parameters.top_p=0 must be"),
    ({"input_ids": [1], "parameters": {"seed": "a"}}, "parameters.seed='a' must be an int"),
])
def test_bad_bodies_are_input_errors_naming_the_field_before_any_run(prog: Any, monkeypatch: pytest.MonkeyPatch,
                                                                     body: Any, match: str) -> None:
    runs: list[str] = []
    real = prog.run
    monkeypatch.setattr(prog, "run", lambda *a, method="forward", **k: runs.append(method) or real(*a, method=method))
    with pytest.raises(InputError, match=match):
        serving.generate_events(prog, body)  # raised by the call itself, not by the first next()
    assert "forward" not in runs


def test_follows_convention(prog: Any) -> None:
    assert serving.follows_convention(prog) and not serving.follows_convention(prog, method="get_max_seq_len")
    assert not serving.follows_convention("not a program")


def test_the_serve_routes_answer_with_this_module(prog: Any, gpt2: L.Exported) -> None:
    """pyrt.serve's generate routes over the real pyrt.llm.serving and a real program (no stand-in)."""
    fastapi = pytest.importorskip("fastapi")
    client_class = pytest.importorskip("starlette.testclient").TestClient
    import types
    from concurrent.futures import ThreadPoolExecutor

    from pyrt.serve import generate

    with ThreadPoolExecutor(1) as pool:
        gen = generate.Generation(prog, {"gpt2": types.SimpleNamespace(method="forward")}, pool)
        assert gen.module is serving and "gpt2" in gen.models
        app = fastapi.FastAPI()

        async def one(name: str, request: Any) -> Any:
            return await gen.generate(name, request, stream=False)

        async def many(name: str, request: Any) -> Any:
            return await gen.generate(name, request, stream=True)

        for route, endpoint in (("generate", one), ("generate_stream", many)):
            endpoint.__annotations__.update(name=str, request=fastapi.Request)  # FastAPI reads the real class
            app.post(f"/v2/models/{{name}}/{route}")(endpoint)

        client = client_class(app)
        body = {"input_ids": L.PROMPT, "parameters": {"max_tokens": 8, "eos_ids": []}}
        reply = client.post("/v2/models/gpt2/generate", json=body)
        assert reply.status_code == 200, reply.text
        assert reply.json()["token_ids"] == gpt2.want[:8] and reply.json()["finish_reason"] == "length"
        streamed = client.post("/v2/models/gpt2/generate_stream", json=body)
        events = [json.loads(c.removeprefix("data: ")) for c in streamed.text.split("\n\n") if c]
        assert [e["token_id"] for e in events[:-1]] == gpt2.want[:8] and events[-1]["token_ids"] == gpt2.want[:8]
        bad = client.post("/v2/models/gpt2/generate", json={"input_ids": [1, 500]})
        assert bad.status_code == 400 and "input_ids[1]=500 is outside the vocabulary" in bad.json()["error"]
