"""The generation routes of an in-process replica: OpenAI's /v1 API and Triton's generate extension.

The replica is built in this process (no Ray) on a portable GPT-2 file with 4 KV-cache slots
(numpy kernels, the CPU) and a byte-level BPE the tests train (tests/fixtures/llm_serve.py);
requests go through ``replica(request)`` as Ray Serve hands them over. Every text is compared
with ``pyrt.generate`` on the same file alone, decoded by the tokenizer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("ray.serve")
pytest.importorskip("executorch")
pytest.importorskip("transformers")

import pyrt  # noqa: E402
from pyrt.llm.config import GenerationConfig  # noqa: E402
from tests.fixtures import llm_serve as S  # noqa: E402

pytestmark = [pytest.mark.export]

NAME = "gpt2"


build, close = S.build, S.close  # a replica built here of the slot file, and everything it holds ended


@pytest.fixture(scope="module")
def replica() -> Iterator[Any]:
    r = build(tokenizer=str(S.tokenizer_dir()))
    yield r
    close(r)


@pytest.fixture(scope="module")
def prog() -> Iterator[Any]:
    with pyrt.Program(S.slot_file("portable"), kernels="numpy") as p:
        yield p


def solo(prog: Any, ids: list[int], n: int, **kw: Any) -> list[int]:
    """``pyrt.generate`` of one prompt alone on the file (the reference every served text is compared with)."""
    return list(pyrt.generate(prog, ids, max_new_tokens=n, **kw).tokens)


def text(ids: list[int]) -> str:
    return str(S.tokenizer().decode(ids, skip_special_tokens=True))


def run(replica: Any, method: str, path: str, body: Any = b"", headers: dict[str, str] | None = None) -> Any:
    return asyncio.run(S.call(replica, method, path, body, headers))


def joined(chunks: list[Any], chat: bool = False) -> str:
    parts = [c["choices"][0]["delta"].get("content", "") if chat else c["choices"][0]["text"]
             for c in chunks if isinstance(c, dict) and c.get("choices")]
    return "".join(parts)


def wait_until(check: Any, what: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {seconds} s")
        time.sleep(0.01)


def test_models_and_a_greedy_completion(replica: Any, prog: Any) -> None:
    status, models = run(replica, "GET", "/v1/models")
    assert status == 200 and [m["id"] for m in models["data"]] == [NAME]
    assert models["data"][0]["object"] == "model" and models["data"][0]["max_model_len"] == S.MAX_SEQ_LEN
    assert run(replica, "GET", f"/v1/models/{NAME}")[1]["id"] == NAME
    ids = S.tokenizer().encode("the cat sat")
    status, body = run(replica, "POST", "/v1/completions",
                       {"model": NAME, "prompt": "the cat sat", "max_tokens": 12, "temperature": 0, "ignore_eos": True})
    assert status == 200, body
    want = solo(prog, ids, 12, eos_ids=[])
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-") and body["model"] == NAME
    assert body["choices"] == [{"index": 0, "text": text(want), "logprobs": None, "finish_reason": "length"}]
    assert body["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 12, "total_tokens": len(ids) + 12,
                             "prompt_tokens_details": {"cached_tokens": body["usage"]["prompt_tokens_details"][
                                 "cached_tokens"]}}
    by_ids = run(replica, "POST", "/v1/completions", {"model": NAME, "prompt": ids, "max_tokens": 12,
                                                      "temperature": 0, "ignore_eos": True})[1]
    assert by_ids["choices"][0]["text"] == text(want)


def test_streamed_deltas_join_to_the_whole_text_across_split_characters(replica: Any, prog: Any) -> None:
    """Sampled text of this tokenizer splits 2-byte characters across tokens; deltas never carry half of one."""
    ids = S.tokenizer().encode("hello world")
    body = {"model": NAME, "prompt": "hello world", "max_tokens": 32, "temperature": 3.0, "seed": 1,
            "ignore_eos": True}
    want = solo(prog, ids, 32, do_sample=True, temperature=3.0, seed=1, eos_ids=[])
    assert S.split_characters(want) >= 3, want  # the case this test is about
    whole = run(replica, "POST", "/v1/completions", body)[1]["choices"][0]["text"]
    status, chunks = run(replica, "POST", "/v1/completions", {**body, "stream": True})
    assert status == 200 and chunks[-1] == "[DONE]"
    deltas = [c["choices"][0]["text"] for c in chunks[:-1]]
    assert whole == text(want) and "".join(deltas) == whole
    assert not any(d.endswith("\ufffd") for d in deltas[:-1]), deltas
    v2 = {"text_input": "hello world", "parameters": {"max_tokens": 32, "temperature": 3.0, "seed": 1,
                                                      "eos_ids": []}}
    one = run(replica, "POST", f"/v2/models/{NAME}/generate", v2)[1]
    events = run(replica, "POST", f"/v2/models/{NAME}/generate_stream", v2)[1]
    assert one["token_ids"] == want and one["text_output"] == whole
    assert [e["token_id"] for e in events[:-1]] == want and events[-1]["token_ids"] == want
    assert "".join(e["text_output"] for e in events) == whole


def test_chat_completions_go_through_the_chat_template(replica: Any, prog: Any) -> None:
    tok = S.tokenizer()
    messages = [{"role": "system", "content": "say hello"}, {"role": "user", "content": "hello world"}]
    prompt = tok.encode(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                        add_special_tokens=False)
    want = text(solo(prog, prompt, 10, eos_ids=[]))
    body = {"model": NAME, "messages": messages, "max_completion_tokens": 10, "temperature": 0, "ignore_eos": True}
    status, reply = run(replica, "POST", "/v1/chat/completions", body)
    assert status == 200, reply
    assert reply["object"] == "chat.completion" and reply["id"].startswith("chatcmpl-")
    assert reply["choices"][0]["message"] == {"role": "assistant", "content": want}
    assert reply["usage"]["prompt_tokens"] == len(prompt) and reply["choices"][0]["finish_reason"] == "length"
    status, chunks = run(replica, "POST", "/v1/chat/completions",
                         {**body, "stream": True, "stream_options": {"include_usage": True}})
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert joined(chunks, chat=True) == want and chunks[-1] == "[DONE]"
    assert chunks[-2]["choices"] == [] and chunks[-2]["usage"] == {  # the same prompt again: all but its last cached
        **reply["usage"], "prompt_tokens_details": {"cached_tokens": len(prompt) - 1}}
    assert all(c["usage"] is None for c in chunks[:-2]) and chunks[-3]["choices"][0]["finish_reason"] == "length"
    parts = {**body, "messages": [{"role": "user", "content": [{"type": "text", "text": "hello world"}]}]}
    assert run(replica, "POST", "/v1/chat/completions", parts)[0] == 200


def test_eight_prompts_at_once_each_equal_their_solo_output(replica: Any, prog: Any) -> None:
    """8 different prompts on a 4-slot file: the engine shares its steps, and each text is the prompt's own."""
    tok = S.tokenizer()
    wants = [solo(prog, tok.encode(p), 16, eos_ids=[]) for p in S.PROMPTS]
    assert len({tuple(w) for w in wants}) > 1  # different prompts, different outputs

    async def go() -> list[Any]:
        v2 = [S.call(replica, "POST", f"/v2/models/{NAME}/generate",
                     {"text_input": p, "max_tokens": 16, "temperature": 0, "eos_ids": []}) for p in S.PROMPTS]
        v1 = [S.call(replica, "POST", "/v1/completions", {"model": NAME, "prompt": p, "max_tokens": 16,
                                                          "temperature": 0, "ignore_eos": True, "stream": True})
              for p in S.PROMPTS]
        return list(await asyncio.gather(*v2, *v1))

    before = replica.llm.hosts[NAME].engine.stats()["occupancy"]
    requests = replica.metrics.stats(NAME)["requests"]
    replies = asyncio.run(go())
    assert replica.metrics.stats(NAME)["requests"] == requests + 16  # generation traffic counts in the stats
    for want, (status, body) in zip(wants, replies[:8], strict=True):
        assert status == 200 and body["token_ids"] == want and body["text_output"] == text(want)
    for want, (status, chunks) in zip(wants, replies[8:], strict=True):
        assert status == 200 and joined(chunks) == text(want)
    after = replica.llm.hosts[NAME].engine.stats()["occupancy"]
    shared = sum(n - before.get(k, 0) for k, n in after.items() if int(k) > 1)
    assert shared > 0, after  # steps that carried more than one sequence


def test_on_a_simulated_gpu_eight_prompts_at_once_equal_their_solo_output() -> None:
    """The reference-engine slot file on a simulated GPU: 8 requests on 4 slots through the generate route."""
    from pyrt.sim import simulated_gpus

    tok = S.tokenizer()
    with simulated_gpus(1), pyrt.Program(S.slot_file("reference"), kernels="numpy") as ref:
        wants = [solo(ref, tok.encode(p), 4, eos_ids=[]) for p in S.PROMPTS]
    replica = build("reference", simulated_gpus=1, tokenizer=str(S.tokenizer_dir()))

    async def go() -> list[Any]:
        return list(await asyncio.gather(*(S.call(replica, "POST", f"/v2/models/{NAME}/generate",
                                                  {"text_input": p, "max_tokens": 4, "temperature": 0,
                                                   "eos_ids": []}) for p in S.PROMPTS)))

    try:
        replies = asyncio.run(go())
        occupancy = replica.llm.hosts[NAME].engine.stats()["occupancy"]
    finally:
        close(replica)
    assert [r[1]["token_ids"] for r in replies] == wants and all(r[0] == 200 for r in replies)
    assert max(int(k) for k in occupancy) > 1, occupancy


def test_a_failed_run_is_500_and_the_replica_keeps_serving() -> None:
    """The simulated GPU's TensorRT fails a launch on purpose: the request it carried gets 500, the next one runs."""
    from pyrt.sim import simulated_gpus

    body = {"model": NAME, "prompt": "hello", "max_tokens": 2, "temperature": 0}
    with simulated_gpus(1) as sim:
        replica = build("reference", tokenizer=str(S.tokenizer_dir()))  # on this process's simulated GPU
        try:
            sim.tensorrt.inject_failure("execute_async_v3")
            status, reply = run(replica, "POST", "/v1/completions", body)
            assert status == 500 and reply["error"]["type"] == "server_error", reply
            sim.tensorrt.inject_failure("execute_async_v3")
            status, chunks = run(replica, "POST", "/v1/completions", {**body, "stream": True})
            assert status == 200 and chunks[-2]["error"]["type"] == "server_error" and chunks[-1] == "[DONE]"
            sim.tensorrt.inject_failure("execute_async_v3")
            status, reply = run(replica, "POST", f"/v2/models/{NAME}/generate", {"input_ids": [5], "max_tokens": 2})
            assert status == 500 and reply["error"], reply
            assert run(replica, "POST", "/v1/completions", body)[0] == 200  # the replica keeps serving
            errors = replica.metrics.stats(NAME)["errors"]
            assert sum(errors.values()) == 3 and len(errors) == 1, errors
        finally:
            close(replica)


def test_stop_strings_cut_the_text_before_them(replica: Any, prog: Any) -> None:
    ids = S.tokenizer().encode("hello world")
    full = text(solo(prog, ids, 16, eos_ids=[]))
    stop = full[5:8]  # spans tokens, found in the text
    want = full[:full.index(stop)]
    body = {"model": NAME, "prompt": "hello world", "max_tokens": 16, "temperature": 0, "ignore_eos": True,
            "stop": [stop, "never there"]}
    reply = run(replica, "POST", "/v1/completions", body)[1]
    assert reply["choices"][0]["text"] == want and reply["choices"][0]["finish_reason"] == "stop"
    assert reply["usage"]["completion_tokens"] < 16
    chunks = run(replica, "POST", "/v1/completions", {**body, "stream": True})[1]
    assert joined(chunks) == want and chunks[-2]["choices"][0]["finish_reason"] == "stop"
    v2 = run(replica, "POST", f"/v2/models/{NAME}/generate",
             {"text_input": "hello world", "parameters": {"max_tokens": 16, "temperature": 0, "eos_ids": [],
                                                          "stop": stop}})[1]
    assert v2["text_output"] == want and v2["finish_reason"] == "stop"
    events = run(replica, "POST", f"/v2/models/{NAME}/generate_stream",
                 {"input_ids": ids, "max_tokens": 16, "eos_ids": [], "stop": [stop]})[1]
    assert "".join(e["text_output"] for e in events) == want and events[-1]["finish_reason"] == "stop"


BAD = [
    ("/v1/completions", {"model": "", "prompt": "hello"}, 400, "model"),
    ("/v1/completions", {"model": "nope", "prompt": "hello"}, 404, "model"),
    ("/v1/completions", {"model": NAME, "prompt": "hello", "n": 0}, 400, "n"),
    ("/v1/completions", {"model": NAME, "prompt": "hello", "temperature": -1}, 400, "temperature"),
    ("/v1/completions", {"model": NAME, "prompt": "hello", "top_p": 1.5}, 400, "top_p"),
    ("/v1/completions", {"model": NAME, "prompt": "hello", "top_k": 0.5}, 400, "top_k"),
    ("/v1/completions", {"model": NAME, "prompt": "hello", "seed": "a"}, 400, "seed"),
    ("/v1/completions", {"model": NAME, "prompt": "hello", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"model": NAME, "prompt": "hello", "max_tokens": 200}, 400, "max_tokens"),
    ("/v1/completions", {"model": NAME, "prompt": "hello world " * 20}, 400, "prompt"),
    ("/v1/completions", {"model": NAME, "prompt": [5, 500]}, 400, "prompt"),
    ("/v1/completions", {"model": NAME, "prompt": ["a", "b"]}, 400, "prompt"),
    ("/v1/completions", {"model": NAME, "prompt": "hello", "stop": ["ok", 3]}, 400, "stop"),
    ("/v1/completions", {"model": NAME, "prompt": "hello", "colour": 1}, 400, "colour"),
    ("/v1/completions", {"model": NAME, "prompt": "hello", "suffix": "!"}, 400, "suffix"),
    ("/v1/completions", {"model": NAME, "prompt": "hello", "logprobs": 21}, 400, "logprobs"),
    ("/v1/completions", {"model": NAME, "prompt": "hello", "presence_penalty": 3}, 400, "presence_penalty"),
    ("/v1/completions", {"model": NAME, "prompt": "hello", "logit_bias": {"500": 1}}, 400, "logit_bias"),
    ("/v1/completions", {"model": NAME, "prompt": "hello", "n": 2, "best_of": 1}, 400, "best_of"),
    ("/v1/chat/completions", {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "logprobs": True,
                              "top_logprobs": 21}, 400, "top_logprobs"),
    ("/v1/completions", {"model": NAME, "prompt": "hello", "min_tokens": 20, "max_tokens": 4}, 400, "min_tokens"),
    ("/v1/completions", {"model": NAME, "prompt": "hello", "seed": -(2**63) - 1}, 400, "seed"),
    ("/v1/completions", {"model": NAME, "prompt": "hello", "stream_options": {"include_usage": True}}, 400,
     "stream_options"),
    ("/v1/chat/completions", {"model": NAME, "messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"model": NAME, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     400, "messages[0].content[0]"),
    ("/v1/chat/completions", {"model": NAME, "messages": [{"content": "hi"}]}, 400, "messages[0]"),
    ("/v1/nowhere", {}, 404, None),
]


@pytest.mark.parametrize(("path", "body", "status", "param"), BAD)
def test_bad_requests_are_openai_errors_naming_the_field(replica: Any, path: str, body: Any, status: int,
                                                         param: str | None) -> None:
    got, reply = run(replica, "POST", path, body)
    assert got == status, reply
    error = reply["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param, error
    assert error["type"] == "invalid_request_error" and (param is None or param.split("[")[0] in error["message"])


def test_a_request_without_a_model_is_the_one_model_s_as_vllm_serves_it(replica: Any) -> None:
    body = {"prompt": "hello", "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    status, got = run(replica, "POST", "/v1/completions", body)
    assert status == 200 and got["model"] == NAME, got
    assert got["choices"][0]["text"] == run(replica, "POST", "/v1/completions", {**body, "model": NAME})[1][
        "choices"][0]["text"]
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert run(replica, "POST", "/v1/chat/completions", chat)[0] == 200
    do_sample_at_0 = {"input_ids": [5, 6], "max_tokens": 4, "eos_ids": [], "do_sample": True, "temperature": 0}
    greedy = run(replica, "POST", f"/v2/models/{NAME}/generate", {**do_sample_at_0, "do_sample": False})[1]
    assert run(replica, "POST", f"/v2/models/{NAME}/generate", do_sample_at_0)[1]["token_ids"] == greedy["token_ids"]


def test_bad_generate_requests_name_the_field(replica: Any) -> None:
    cases = [({"text_input": "hi", "input_ids": [5]}, "text_input"), ({"input_ids": [5], "colour": 1}, "colour"),
             ({"input_ids": [5], "max_tokens": 2, "parameters": {"max_tokens": 3}}, "max_tokens"),
             ({"input_ids": [5], "parameters": {"do_sample": True, "temperature": -1.0}}, "temperature"),
             ({"input_ids": [5, 500]}, "input_ids[1]=500"), ({"input_ids": [5], "max_tokens": 100}, "max_tokens=100")]
    for body, named in cases:
        status, reply = run(replica, "POST", f"/v2/models/{NAME}/generate", body)
        assert status == 400 and named in reply["error"], (body, reply)
    assert run(replica, "POST", f"/v2/models/{NAME}/generate", b"{oops")[0] == 400
    assert run(replica, "POST", f"/v2/models/{NAME}.get_max_seq_len/generate", {"input_ids": [5]})[0] == 404
    status, reply = run(replica, "POST", f"/v2/models/{NAME}/infer", {"inputs": []})
    assert status == 400 and "generates" in reply["error"]  # its runs would write the generations' cache slots
    assert run(replica, "POST", f"/v2/models/{NAME}.get_max_seq_len/infer", {"inputs": []})[0] == 200  # no cache


def test_a_full_queue_is_429_and_the_replica_keeps_serving(prog: Any) -> None:
    """max_queued_requests=1: 4 generations hold the slots, 1 waits, the next is refused (the engine held still)."""
    replica = build(tokenizer=str(S.tokenizer_dir()), generation=GenerationConfig(max_queued=1))
    host = replica.llm.hosts[NAME]
    body = {"model": NAME, "prompt": "hello", "max_tokens": 4, "temperature": 0, "stream": True}

    async def go() -> tuple[list[Any], Any]:
        clients = [S.Client("POST", "/v1/completions", body) for _ in range(6)]
        with host.engine.paused():  # no step admits anyone meanwhile: 4 are admitted at the next step, 1 waits
            answers = [await replica(c.request) for c in clients]
        streams = [a(c.scope, c.receive, c.send) for a, c in zip(answers[:5], clients, strict=False)]
        await asyncio.gather(*streams)
        return [S.events(c.body) for c in clients[:5]], answers[5]

    try:
        finished, refused = asyncio.run(go())
        assert refused.status_code == 429
        import json

        error = json.loads(refused.body)["error"]
        assert error["type"] == "rate_limit_error" and "max_queued_requests=1" in error["message"]
        assert all(e[-1] == "[DONE]" and joined(e) for e in finished)
        assert run(replica, "POST", "/v1/completions", {**body, "stream": False})[0] == 200
        assert replica.metrics.stats(NAME)["errors"] == {"BusyError": 1}
    finally:
        close(replica)


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_disconnects_frees_its_slot_within_one_step(replica: Any, stream: bool) -> None:
    host = replica.llm.hosts[NAME]
    body = {"model": NAME, "prompt": "hello", "max_tokens": 40, "temperature": 0, "ignore_eos": True,
            "stream": stream}

    async def go() -> int:
        client = S.Client("POST", "/v1/completions", body)
        task = asyncio.ensure_future(replica(client.request))  # a whole answer: the route waits for the end
        if stream:
            answer = await task
            task = asyncio.ensure_future(answer(client.scope, client.receive, client.send))
        for _ in range(6000):  # until tokens come (and, streamed, the first event went out)
            if host.engine.stats()["tokens_generated"] > before and (not stream or len(client.sent) > 1):
                break
            await asyncio.sleep(0.01)
        client.disconnect()
        await asyncio.gather(task, return_exceptions=True)
        return int(host.engine.stats()["steps"])

    before = host.engine.stats()["tokens_generated"]
    steps = asyncio.run(go())
    wait_until(lambda: host.stats()["running"] == 0, "the slot freed")
    stats = host.stats()
    assert stats["free_slots"] == S.SLOTS and stats["steps"] <= steps + 1, stats
    assert stats["tokens_generated"] - before < 40  # cancelled, not run to its end
    assert run(replica, "GET", f"/v2/models/{NAME}/stats")[1]["generation"]["running"] == 0


def test_an_api_key_guards_the_model_routes_and_not_health() -> None:
    replica = build(tokenizer=str(S.tokenizer_dir()), api_key="s3cret")
    good = {"Authorization": "Bearer s3cret"}
    try:
        status, reply = run(replica, "GET", "/v1/models")
        assert status == 401 and reply["error"]["code"] == "invalid_api_key"
        assert run(replica, "GET", "/v1/models", headers={"Authorization": "Bearer nope"})[0] == 401
        assert run(replica, "GET", "/v1/models", headers=good)[0] == 200
        assert run(replica, "GET", f"/v2/models/{NAME}")[0] == 401
        assert run(replica, "POST", f"/v2/models/{NAME}/generate", {"input_ids": [5], "max_tokens": 1})[0] == 401
        assert run(replica, "POST", f"/v2/models/{NAME}/generate", {"input_ids": [5], "max_tokens": 1},
                   headers=good)[0] == 200
        assert run(replica, "GET", "/v2/health/live")[1] == {"live": True} and run(replica, "GET", "/v2")[0] == 200
    finally:
        close(replica)
    assert "s3cret" not in repr(replica.cfg)


def test_without_a_tokenizer_the_generate_routes_take_ids_and_v1_says_what_it_needs(prog: Any) -> None:
    replica = build()
    try:
        status, reply = run(replica, "GET", "/v1/models")
        assert status == 404 and "--tokenizer" in reply["error"]["message"]
        reply = run(replica, "POST", f"/v2/models/{NAME}/generate", {"input_ids": [5, 6], "max_tokens": 6,
                                                                     "eos_ids": []})[1]
        assert reply["token_ids"] == solo(prog, [5, 6], 6, eos_ids=[]) and "text_output" not in reply
        for body, named in (({"text_input": "hi"}, "tokenizer"), ({"input_ids": [5], "stop": "x"}, "tokenizer"),
                            ({"input_ids": [5], "max_tokens": 4, "stop": [[7, 7]]}, None)):
            status, reply = run(replica, "POST", f"/v2/models/{NAME}/generate", body)
            assert (status, named is None or named in reply.get("error", "")) == ((400, True) if named else
                                                                                 (200, True)), reply
    finally:
        close(replica)


def test_the_replica_imports_no_torch_for_a_numpy_kernel_program() -> None:
    """A fresh process builds the replica with the tokenizer and answers a completion: torch never imported."""
    import os
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    script = textwrap.dedent(f"""
        import asyncio, inspect, sys
        from pyrt.serve.config import ServeConfig
        from pyrt.serve.replica import PyrtReplica
        from tests.fixtures.llm_serve import call
        own = next(c for c in PyrtReplica.func_or_class.__mro__ if c.__module__ == "pyrt.serve.replica"
                   and "__init__" in vars(c) and not inspect.iscoroutinefunction(c.__init__))
        replica = own(ServeConfig({str(S.slot_file("portable"))!r}, name="gpt2", kernels="numpy",
                                  tokenizer={str(S.tokenizer_dir())!r}))
        body = {{"model": "gpt2", "prompt": "hello", "max_tokens": 2}}
        status, _ = asyncio.run(call(replica, "POST", "/v1/completions", body))
        replica.llm.close()
        print(status, "torch" in sys.modules)
    """)
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-2:] == ["200", "False"], done.stdout


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", f"/v2/models/{NAME}/generate",
                                  f"/v2/models/{NAME}/generate_stream"])
def test_json_nested_200000_deep_is_400_on_the_generation_routes(replica: Any, path: str) -> None:
    status, reply = run(replica, "POST", path, b"[" * 200_000 + b"]" * 200_000)
    message = reply["error"]["message"] if path.startswith("/v1") else reply["error"]
    assert status == 400 and "nests too deeply" in message, reply
    assert run(replica, "POST", f"/v2/models/{NAME}/generate", {"input_ids": [5], "max_tokens": 1})[0] == 200
