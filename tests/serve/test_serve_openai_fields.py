"""Every OpenAI / vLLM field pyrt serve takes, through the real ``openai`` client, streamed and not.

The replica is built in this process (tests/fixtures/llm_serve.py: the portable 4-slot GPT-2, the
byte-level BPE the tests train) behind a real HTTP server on a loopback port. Tokens are compared
with ``pyrt.generate`` on the same file (one ``SamplingParams``), log-probabilities with
``transformers``' logits of the same model.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

pytest.importorskip("ray.serve")
pytest.importorskip("executorch")
pytest.importorskip("transformers")
openai = pytest.importorskip("openai")

import pyrt  # noqa: E402
from pyrt.testing import archs  # noqa: E402
from tests.fixtures import llm_serve as S  # noqa: E402

pytestmark = [pytest.mark.export]

NAME = "gpt2"
PROMPT = "hello world"


@pytest.fixture(scope="module")
def served() -> Iterator[S.Served]:
    replica = S.build(tokenizer=str(S.tokenizer_dir()), name=NAME, aliases=("org/GPT-2", "small"))
    server = S.Served(replica)
    yield server
    server.close()
    S.close(replica)


@pytest.fixture(scope="module")
def client(served: S.Served) -> Any:
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def prog() -> Iterator[Any]:
    with pyrt.Program(S.slot_file("portable"), kernels="numpy") as p:
        yield p


def ids(text: str) -> list[int]:
    return list(S.tokenizer().encode(text))


def generate(prog: Any, prompt: list[int], n: int, **kw: Any) -> Any:
    return pyrt.generate(prog, prompt, max_new_tokens=n, **{"eos_ids": [], **kw})


def decode(tokens: list[int]) -> str:
    return str(S.tokenizer().decode(tokens, skip_special_tokens=True))


def model_logprobs(prompt: list[int], tokens: list[int], temperature: float = 1.0) -> np.ndarray:
    """transformers' log-softmax of the model's logits / temperature at each new token's position."""
    import torch

    with torch.no_grad():
        logits = archs.causal_lm("gpt2")(torch.tensor([prompt + tokens])).logits[0].double()
    logs = torch.log_softmax(logits / temperature, -1).numpy()
    return logs[len(prompt) - 1:len(prompt) - 1 + len(tokens)]


def test_completion_logprobs_are_the_models_after_temperature(client: Any, prog: Any) -> None:
    prompt = ids(PROMPT)
    out = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=8, temperature=0.8, seed=4, logprobs=3,
                                    extra_body={"ignore_eos": True})
    want = generate(prog, prompt, 8, do_sample=True, temperature=0.8, seed=4)
    lp = out.choices[0].logprobs
    assert out.choices[0].text == decode(want.tokens) and len(lp.token_logprobs) == 8
    logs = model_logprobs(prompt, want.tokens, 0.8)
    for j, token in enumerate(want.tokens):
        assert abs(lp.token_logprobs[j] - logs[j][token]) < 1e-4, j
        top = sorted(lp.top_logprobs[j].values(), reverse=True)  # keyed by text: tokens of one text share a key
        assert abs(top[0] - logs[j].max()) < 1e-4 and all(np.abs(logs[j] - v).min() < 1e-4 for v in top)
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    chunks = list(client.completions.create(model=NAME, prompt=PROMPT, max_tokens=8, temperature=0.8, seed=4,
                                            logprobs=3, stream=True, extra_body={"ignore_eos": True}))
    streamed = [x for c in chunks if c.choices and c.choices[0].logprobs for x in c.choices[0].logprobs.token_logprobs]
    assert "".join(c.choices[0].text for c in chunks) == out.choices[0].text
    np.testing.assert_allclose(streamed, lp.token_logprobs)


def test_chat_logprobs_with_top_alternatives_and_bytes(client: Any, prog: Any) -> None:
    messages = [{"role": "user", "content": "hello world"}]
    args = {"model": NAME, "messages": messages, "max_tokens": 10, "temperature": 0, "logprobs": True,
            "top_logprobs": 2, "extra_body": {"ignore_eos": True}}
    out = client.chat.completions.create(**args)
    content = out.choices[0].logprobs.content
    text = out.choices[0].message.content
    assert len(content) == 10 and bytes(b for item in content for b in item.bytes).decode() == text
    assert all(len(item.top_logprobs) == 2 and item.top_logprobs[0].logprob >= item.logprob - 1e-9
               for item in content)  # greedy: the chosen token is the most likely one
    assert all(item.top_logprobs[0].token == item.token for item in content)
    chunks = list(client.chat.completions.create(**args, stream=True))
    streamed = [item for c in chunks if c.choices and c.choices[0].logprobs for item in c.choices[0].logprobs.content]
    assert [(i.token, round(i.logprob, 6)) for i in streamed] == [(i.token, round(i.logprob, 6)) for i in content]
    plain = client.chat.completions.create(model=NAME, messages=messages, max_tokens=2)
    assert plain.choices[0].logprobs is None


def test_n_choices_each_with_its_own_seed_and_the_prompt_counted_once(client: Any, prog: Any) -> None:
    prompt = ids(PROMPT)
    args = {"model": NAME, "prompt": PROMPT, "max_tokens": 6, "temperature": 1.5, "seed": -1, "n": 3,
            "extra_body": {"ignore_eos": True}}
    out = client.completions.create(**args)
    wants = [decode(generate(prog, prompt, 6, do_sample=True, temperature=1.5, seed=(-1 + i) % 2**64).tokens)
             for i in range(3)]
    assert [c.index for c in out.choices] == [0, 1, 2] and [c.text for c in out.choices] == wants
    assert len(set(wants)) > 1  # three random streams
    assert out.usage.prompt_tokens == len(prompt) and out.usage.completion_tokens == 18
    chunks = list(client.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    texts = ["".join(c.choices[0].text for c in chunks if c.choices and c.choices[0].index == i) for i in range(3)]
    assert texts == wants and chunks[-1].usage.total_tokens == len(prompt) + 18
    chat = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}], n=2, seed=7,
                                          max_tokens=4, temperature=2.0)
    assert [c.index for c in chat.choices] == [0, 1]


def test_usage_counts_the_prompt_tokens_a_kv_cache_slot_held(client: Any, prog: Any) -> None:
    messages = [{"role": "system", "content": "answer in one word"}, {"role": "user", "content": "hello world"}]
    args = {"model": NAME, "messages": messages, "max_tokens": 4, "temperature": 0, "extra_body": {"ignore_eos": True}}
    first, again = client.chat.completions.create(**args), client.chat.completions.create(**args)
    size = first.usage.prompt_tokens
    assert again.usage.prompt_tokens_details.cached_tokens == size - 1  # all but the last prompt token
    assert again.choices[0].message.content == first.choices[0].message.content
    chunks = list(client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == size - 1
    prompt = ids(PROMPT)
    made = generate(prog, prompt, 3).tokens
    client.completions.create(model=NAME, prompt=prompt, max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    longer = [*prompt, *made[:2], (made[2] + 1) % archs.VOCAB]  # the slot holds prompt and made[:2]; then they differ
    out = client.completions.create(model=NAME, prompt=longer, max_tokens=5, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert out.usage.prompt_tokens_details.cached_tokens == len(prompt) + 2
    assert out.choices[0].text == decode(generate(prog, longer, 5, prefix_caching=False).tokens)


def test_best_of_keeps_the_highest_cumulative_logprob(client: Any, prog: Any) -> None:
    prompt = ids(PROMPT)
    runs = [generate(prog, prompt, 5, do_sample=True, temperature=2.0, seed=11 + i, logprobs=0) for i in range(4)]
    scores = [r.cumulative_logprob for r in runs]
    out = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=5, temperature=2.0, seed=11, best_of=4,
                                    extra_body={"ignore_eos": True})
    assert out.choices[0].text == decode(runs[int(np.argmax(scores))].tokens) and out.choices[0].logprobs is None
    assert out.usage.completion_tokens == 20


def test_echo_with_logprobs_gives_the_prompts_too(client: Any) -> None:
    prompt = ids("say hello to the world")
    args = {"model": NAME, "prompt": "say hello to the world", "max_tokens": 4, "temperature": 0, "echo": True,
            "logprobs": 1, "extra_body": {"ignore_eos": True}}
    out = client.completions.create(**args)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(prompt) + 4 and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert "".join(lp.tokens) == out.choices[0].text and lp.text_offset[0] == 0
    logs = model_logprobs(prompt[:1], prompt[1:] + [0])  # the rows before each prompt token
    for p in range(1, len(prompt)):
        assert abs(lp.token_logprobs[p] - logs[p - 1][prompt[p]]) < 1e-4, p
    chunks = list(client.completions.create(**args, stream=True))
    streamed = [x for c in chunks if c.choices and c.choices[0].logprobs for x in c.choices[0].logprobs.token_logprobs]
    assert "".join(c.choices[0].text for c in chunks) == out.choices[0].text
    assert streamed[0] is None and np.allclose(streamed[1:], lp.token_logprobs[1:])


def test_echo_prepends_the_prompt(client: Any, prog: Any) -> None:
    want = PROMPT + decode(generate(prog, ids(PROMPT), 4).tokens)
    out = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=4, temperature=0, echo=True,
                                    extra_body={"ignore_eos": True})
    assert out.choices[0].text == want
    chunks = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=4, temperature=0, echo=True,
                                       stream=True, extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in chunks) == want


PROCESSORS = [
    ({"presence_penalty": 1.5, "frequency_penalty": 0.7}, {"presence_penalty": 1.5, "frequency_penalty": 0.7}),
    ({"extra_body": {"repetition_penalty": 1.6}}, {"repetition_penalty": 1.6}),
    ({"logit_bias": {"7": 5.0, "9": -100}}, {"logit_bias": {7: 5.0, 9: -100}}),
    ({"extra_body": {"min_p": 0.9}, "temperature": 1.2, "seed": 5}, {"min_p": 0.9, "do_sample": True,
                                                                      "temperature": 1.2, "seed": 5}),
]


@pytest.mark.parametrize(("fields", "params"), PROCESSORS)
def test_penalties_bias_and_min_p_equal_pyrt_generate(client: Any, prog: Any, fields: dict[str, Any],
                                                      params: dict[str, Any]) -> None:
    fields = {"temperature": 0, **fields}
    extra = {"ignore_eos": True, **fields.pop("extra_body", {})}
    want = decode(generate(prog, ids(PROMPT), 12, **params).tokens)
    assert want != decode(generate(prog, ids(PROMPT), 12, **{k: v for k, v in params.items()
                                                              if k in ("do_sample", "temperature", "seed")}).tokens)
    out = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=12, extra_body=extra, **fields)
    assert out.choices[0].text == want
    chunks = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=12, extra_body=extra, stream=True,
                                       **fields)
    assert "".join(c.choices[0].text for c in chunks) == want


def test_min_tokens_stop_token_ids_and_ignore_eos(client: Any, prog: Any) -> None:
    plain = generate(prog, ids(PROMPT), 24).tokens
    first = next(i for i in range(2, 24) if plain[i] not in plain[:i])  # a token greedy decoding gives first there
    stop = plain[first]
    out = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=24, temperature=0,
                                    extra_body={"ignore_eos": True, "stop_token_ids": [stop]})
    assert out.choices[0].text == decode(plain[:first + 1]) and out.choices[0].finish_reason == "stop"
    held = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=24, temperature=0,
                                     extra_body={"ignore_eos": True, "stop_token_ids": [stop], "min_tokens": first + 2})
    want = generate(prog, ids(PROMPT), 24, eos_ids=[stop], min_tokens=first + 2).tokens
    assert len(want) > first + 1 and held.choices[0].text == decode(want)
    chunks = list(client.completions.create(model=NAME, prompt=PROMPT, max_tokens=24, temperature=0, stream=True,
                                            extra_body={"ignore_eos": True, "stop_token_ids": [stop],
                                                        "min_tokens": first + 2}))
    assert "".join(c.choices[0].text for c in chunks) == decode(want)
    assert chunks[-1].choices[0].finish_reason == held.choices[0].finish_reason


def test_special_tokens_and_stop_strings_in_the_text(client: Any, prog: Any) -> None:
    plain = generate(prog, ids(PROMPT), 12, logit_bias={2: 100}).tokens  # </s> (id 2) at every step
    shown = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=3, temperature=0, logit_bias={"2": 100},
                                      extra_body={"ignore_eos": True, "skip_special_tokens": False})
    assert plain[:3] == [2, 2, 2] and shown.choices[0].text == "</s></s></s>"
    full = decode(generate(prog, ids(PROMPT), 16).tokens)
    stop = full[5:8]
    out = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=16, temperature=0, stop=[stop],
                                    extra_body={"ignore_eos": True, "include_stop_str_in_output": True})
    assert out.choices[0].text == full[:full.index(stop) + len(stop)] and out.choices[0].finish_reason == "stop"
    chunks = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                            temperature=0, logit_bias={"2": 100}, stream=True,
                                            extra_body={"ignore_eos": True, "skip_special_tokens": False})
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "</s></s></s>"


def test_chat_template_options_and_tool_messages(client: Any, prog: Any) -> None:
    tok = S.tokenizer()
    messages = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hello world"}]

    def rendered(**kw: Any) -> str:
        return decode(generate(prog, tok.encode(tok.apply_chat_template(messages, tokenize=False, **kw),
                                                add_special_tokens=False), 5).tokens)

    out = client.chat.completions.create(model=NAME, messages=messages, max_tokens=5, temperature=0,
                                         extra_body={"ignore_eos": True, "add_generation_prompt": False,
                                                     "continue_final_message": True})
    assert out.choices[0].message.content == rendered(continue_final_message=True)
    chunks = client.chat.completions.create(model=NAME, messages=messages, max_tokens=5, temperature=0, stream=True,
                                            extra_body={"ignore_eos": True, "add_generation_prompt": False,
                                                        "continue_final_message": True})
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == out.choices[0].message.content
    with pytest.raises(openai.BadRequestError, match="continue_final_message"):
        client.chat.completions.create(model=NAME, messages=messages, max_tokens=5,
                                       extra_body={"continue_final_message": True})
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": calls},
               {"role": "tool", "tool_call_id": "c1", "content": "the answer"}]
    out = client.chat.completions.create(model=NAME, messages=history, max_tokens=3, temperature=0,
                                         extra_body={"chat_template_kwargs": {"unused": 1}})
    assert out.choices[0].finish_reason in ("length", "stop")


def test_aliases_and_hugging_face_style_names(served: S.Served, client: Any) -> None:
    import requests

    assert sorted(m.id for m in client.models.list()) == sorted([NAME, "org/GPT-2", "small"])
    assert client.models.retrieve("org/GPT-2").id == "org/GPT-2"
    out = client.completions.create(model="org/GPT-2", prompt=PROMPT, max_tokens=2)
    assert out.model == NAME  # answers carry the first name (as vLLM's --served-model-name)
    reply = requests.post(f"{served.url}/v2/models/org/GPT-2/generate", json={"input_ids": [5], "max_tokens": 2},
                          timeout=60)
    assert reply.status_code == 200 and reply.json()["model_name"] == NAME
    assert requests.get(f"{served.url}/v2/models/org/GPT-2", timeout=60).json()["name"] == NAME


def test_server_routes(served: S.Served) -> None:
    import requests

    url = served.url
    assert requests.get(f"{url}/health", timeout=30).status_code == 200
    assert requests.get(f"{url}/ping", timeout=30).status_code == 200
    assert requests.get(f"{url}/version", timeout=30).json() == {"version": pyrt.__version__}
    got = requests.post(f"{url}/tokenize", json={"prompt": PROMPT, "return_token_strs": True}, timeout=30).json()
    assert got["tokens"] == ids(PROMPT) and got["count"] == len(got["tokens"]) and got["max_model_len"] == 48
    assert got["token_strs"] == S.tokenizer().convert_ids_to_tokens(got["tokens"])  # vLLM's: vocabulary pieces
    assert "Ġworld" in got["token_strs"] and S.tokenizer().convert_tokens_to_string(got["token_strs"]) == PROMPT
    chat = requests.post(f"{url}/tokenize", json={"model": "small", "messages": [{"role": "user", "content": "hi"}]},
                         timeout=30).json()
    tok = S.tokenizer()
    assert chat["tokens"] == tok.encode(tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                                                add_generation_prompt=True), add_special_tokens=False)
    assert requests.post(f"{url}/detokenize", json={"tokens": got["tokens"]}, timeout=30).json() == {"prompt": PROMPT}
    bad = requests.post(f"{url}/detokenize", json={"tokens": [500]}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    assert requests.post(f"{url}/tokenize", json={"model": "nope", "prompt": "x"}, timeout=30).status_code == 404
    requests.post(f"{url}/v1/completions", json={"model": NAME, "prompt": PROMPT, "max_tokens": 2}, timeout=60)
    text = requests.get(f"{url}/metrics", timeout=30).text
    for metric in ("pyrt_serve_requests_total{model=\"gpt2\"}", "pyrt_serve_generated_tokens_total{model=\"gpt2\"}",
                   "pyrt_serve_time_to_first_token_seconds_bucket", "pyrt_serve_tokens_per_pass{model=\"gpt2\"}",
                   "pyrt_serve_prefix_cache_queries_total{model=\"gpt2\"}",
                   "pyrt_serve_prefix_cache_hits_total{model=\"gpt2\"}"):
        assert metric in text, metric
