"""The generate routes against pyrt.llm.serving's contract (docs: /generate, /generate_stream), without Ray.

``pyrt.llm`` is written separately; this test installs a stand-in that keeps the contract
(validation before any run, token events, one final event) and computes real tokens.
"""

from __future__ import annotations

import json
import types
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from pyrt.errors import ExecutionError, InputError

fastapi = pytest.importorskip("fastapi")  # the serve extra
FastAPI, Request = fastapi.FastAPI, fastapi.Request
TestClient = pytest.importorskip("starlette.testclient").TestClient

from pyrt.serve import generate  # noqa: E402


class FakeProgram:
    llm = True


def _events(program: Any, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    ids = body.get("input_ids")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
        raise InputError(f"input_ids={ids!r}: expected a non-empty list of token ids")
    n = int(body.get("parameters", {}).get("max_tokens", 3))

    def run() -> Iterator[dict[str, Any]]:
        out = []
        for k in range(n):
            token = (ids[-1] + 1 + k) % 100
            if token == 99:
                raise ExecutionError("step failed")
            out.append(token)
            yield {"token_id": token, "index": k}
        yield {"finish_reason": "length", "token_ids": out, "timings": {"steps": n}}
    return run()


@pytest.fixture()
def client(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    fake = types.ModuleType("pyrt.llm.serving")
    fake.follows_convention = lambda program, method="forward": method == "forward" and program.llm  # type: ignore[attr-defined]
    fake.generate_events = _events  # type: ignore[attr-defined]
    monkeypatch.setattr(generate, "llm_serving", lambda: fake)
    models = {"lm": types.SimpleNamespace(method="forward"), "lm.other": types.SimpleNamespace(method="other")}
    with ThreadPoolExecutor(1) as pool:
        gen = generate.Generation(FakeProgram(), models, pool)
        app = FastAPI()

        @app.post("/v2/models/{name}/generate")
        async def one(name: str, request: Request) -> Any:
            return await gen.generate(name, request, stream=False)

        @app.post("/v2/models/{name}/generate_stream")
        async def many(name: str, request: Request) -> Any:
            return await gen.generate(name, request, stream=True)

        yield TestClient(app)


def test_generate_returns_the_final_event(client: Any) -> None:
    reply = client.post("/v2/models/lm/generate", json={"input_ids": [5, 6], "parameters": {"max_tokens": 4}})
    assert reply.status_code == 200
    assert reply.json() == {"model_name": "lm", "token_ids": [7, 8, 9, 10], "finish_reason": "length",
                            "timings": {"steps": 4}}


def test_generate_stream_sends_each_token_then_the_final_event(client: Any) -> None:
    reply = client.post("/v2/models/lm/generate_stream", json={"input_ids": [1], "parameters": {"max_tokens": 2}})
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(chunk.removeprefix("data: ")) for chunk in reply.text.split("\n\n") if chunk]
    assert events == [{"token_id": 2, "index": 0}, {"token_id": 3, "index": 1},
                      {"finish_reason": "length", "token_ids": [2, 3], "timings": {"steps": 2}}]


def test_generate_errors(client: Any) -> None:
    bad = client.post("/v2/models/lm/generate", json={"input_ids": "hello"})
    assert bad.status_code == 400 and "input_ids='hello'" in bad.json()["error"]
    assert client.post("/v2/models/lm/generate", content=b"{oops").status_code == 400
    failed = client.post("/v2/models/lm/generate", json={"input_ids": [97], "parameters": {"max_tokens": 4}})
    assert failed.status_code == 500 and failed.json() == {"error": "step failed"}
    streamed = client.post("/v2/models/lm/generate_stream", json={"input_ids": [97], "parameters": {"max_tokens": 4}})
    assert streamed.text.endswith('data: {"error": "step failed"}\n\n')  # the status was sent with the first token
    for name in ("lm.other", "nope"):  # a method without the convention, an unknown model
        assert client.post(f"/v2/models/{name}/generate", json={"input_ids": [1]}).status_code == 404
