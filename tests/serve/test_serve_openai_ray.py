"""``pyrt serve`` of an LLM end to end: the real ``openai`` client against the session's Ray (tests/serve/conftest.py).

One deployment for the module: the portable 4-slot GPT-2 (the CPU) with the tokenizer the tests
train and an API key. Texts are compared with ``pyrt.generate`` on the same file alone. A client that goes
away mid-stream is tested on a slow simulated GPU (tests/serve/test_serve_cancel.py): here 46 tokens take tens
of milliseconds, and the disconnect could arrive after the generation's end.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

pytest.importorskip("executorch")
pytest.importorskip("transformers")
openai = pytest.importorskip("openai")
requests = pytest.importorskip("requests")
serve = pytest.importorskip("ray.serve")

import pyrt  # noqa: E402
from pyrt.serve.app import deployment, run  # noqa: E402
from pyrt.serve.config import ServeConfig  # noqa: E402
from tests.fixtures import llm_serve as S  # noqa: E402
from tests.fixtures.serve import METRICS_PORT, wait_exported  # noqa: E402

pytestmark = [pytest.mark.export, pytest.mark.ray]

KEY = "test-key"
APP = "llm"


@pytest.fixture(scope="module")
def base(ray_serve: str) -> Iterator[str]:
    path = S.slot_file("portable")
    app = deployment(ServeConfig(str(path), name="gpt2", app_name=APP, kernels="numpy", cpus_per_replica=0.5,
                                 tokenizer=str(S.tokenizer_dir()), api_key=KEY))
    run(app, app_name=APP, path=str(path), route_prefix=f"/{APP}")
    yield f"http://{ray_serve}/{APP}"
    serve.delete(APP)


@pytest.fixture(scope="module")
def client(base: str) -> Any:
    return openai.OpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def prog() -> Iterator[Any]:
    with pyrt.Program(S.slot_file("portable"), kernels="numpy") as p:
        yield p


def greedy_text(prog: Any, prompt: str, n: int) -> str:
    tokens = pyrt.generate(prog, S.tokenizer().encode(prompt), max_new_tokens=n, eos_ids=[]).tokens
    return str(S.tokenizer().decode(tokens, skip_special_tokens=True))


def test_the_openai_client_streamed_and_not(client: Any, prog: Any) -> None:
    assert [m.id for m in client.models.list()] == ["gpt2"]
    want = greedy_text(prog, "hello world", 12)
    extra = {"ignore_eos": True}
    done = client.completions.create(model="gpt2", prompt="hello world", max_tokens=12, temperature=0,
                                     extra_body=extra)
    assert done.choices[0].text == want and done.choices[0].finish_reason == "length"
    assert done.usage.completion_tokens == 12
    parts = client.completions.create(model="gpt2", prompt="hello world", max_tokens=12, temperature=0,
                                      extra_body=extra, stream=True, stream_options={"include_usage": True})
    chunks = list(parts)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want and chunks[-1].usage.total_tokens > 12
    messages = [{"role": "user", "content": "say hello"}]
    chat = client.chat.completions.create(model="gpt2", messages=messages, max_tokens=8, temperature=0, seed=3,
                                          extra_body=extra)
    streamed = client.chat.completions.create(model="gpt2", messages=messages, max_tokens=8, temperature=0, seed=3,
                                              extra_body=extra, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content == text


def test_eight_streams_at_once_each_equal_their_solo_text(client: Any, prog: Any) -> None:
    wants = [greedy_text(prog, p, 16) for p in S.PROMPTS]

    def one(prompt: str) -> str:
        stream = client.completions.create(model="gpt2", prompt=prompt, max_tokens=16, temperature=0, stream=True,
                                           extra_body={"ignore_eos": True})
        return "".join(c.choices[0].text for c in stream if c.choices)

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(one, S.PROMPTS)) == wants


def test_errors_are_the_clients_typed_errors(client: Any, base: str) -> None:
    with pytest.raises(openai.NotFoundError, match="no model 'nope'"):
        client.completions.create(model="nope", prompt="hello")
    with pytest.raises(openai.BadRequestError, match="n=0"):
        client.completions.create(model="gpt2", prompt="hello", n=0)
    with pytest.raises(openai.BadRequestError, match="more than the cache"):
        client.completions.create(model="gpt2", prompt="hello world " * 30, max_tokens=1)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{base}/v1", api_key="wrong", max_retries=0).models.list()
    assert requests.get(f"{base}/v2/health/live", timeout=30).status_code == 200  # health stays open
    assert [m.id for m in client.models.list()] == ["gpt2"]  # and the replica keeps serving


@pytest.mark.slow
def test_prometheus_has_the_generation_metrics(client: Any) -> None:
    """Every generation metric, each waited for: Ray exports each from an export of its own (its interval)."""
    client.completions.create(model="gpt2", prompt="hello", max_tokens=4, temperature=0)
    want = {"ray_pyrt_serve_time_to_first_token_seconds_bucket", "ray_pyrt_serve_inter_token_latency_seconds_bucket",
            "ray_pyrt_serve_generated_tokens_total", "ray_pyrt_serve_prompt_tokens_total",
            "ray_pyrt_serve_batch_occupancy_bucket", "ray_pyrt_serve_running_generations",
            "ray_pyrt_serve_queued_generations", "ray_pyrt_serve_requests_total"}
    text = wait_exported(METRICS_PORT, want, 'model="gpt2"')
    names = {line.split("{")[0] for line in text.splitlines() if 'model="gpt2"' in line}
    assert want <= names, sorted(names)
