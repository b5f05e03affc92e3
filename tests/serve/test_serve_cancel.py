"""Behind the default HAProxy ingress, a client that goes away cancels its generation: D2 (a whole answer given up
on, with the real ``openai`` client, which sends headers and body in separate writes, and its timeout) and a
stream closed after its first event.

One ``pyrt serve`` of the reference-engine GPT-2 slot file on a simulated GPU whose every row costs
:data:`SECONDS_PER_ROW` (a sleep: a loaded machine cannot make it shorter), so the 46 tokens of a whole
generation take over 46 s and a replica that ignores disconnects generates all of them and fails. Each test
first makes sure its generation has started on the engine (its prompt prefilled; for a stream, its first
event read), and what is left of the generation then takes far longer (20 s and more) than a disconnect
needs to cross HAProxy to the replica (a few scheduler turns, however loaded the machine). On the tiny
model's CPU file 46 tokens take tens of milliseconds, and the disconnect could arrive after the end (CI saw
it), so these checks live here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("ray.serve")
pytest.importorskip("executorch")
pytest.importorskip("transformers")
openai = pytest.importorskip("openai")
requests = pytest.importorskip("requests")

from pyrt.serve import ingress  # noqa: E402
from tests.fixtures import llm_serve as S  # noqa: E402
from tests.fixtures.serve import wait_for  # noqa: E402
from tests.fixtures.serve_process import Server  # noqa: E402

pytestmark = [pytest.mark.export, pytest.mark.ray]
MAX_TOKENS = S.MAX_SEQ_LEN - 2  # all the cache leaves after the prompt "hello" (one token)
SECONDS_PER_ROW = 1.0
GIVE_UP_S = 5.0  # the openai client's timeout: the request reaches the engine well before, the cancel ends it well
# before half the generation (MAX_TOKENS // 2 tokens: 23 s) is done


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    if ingress.haproxy_binary() is None:
        pytest.skip("no HAProxy binary (ray[serve] installs one on Linux)")
    s = Server(S.slot_file("reference"), tmp_path_factory.mktemp("cancel") / "serve.log", "--cpus-per-replica",
               "0.5", "--name", "gpt2", "--kernels", "numpy", "--tokenizer", str(S.tokenizer_dir()),
               env={"PYRT_SIMULATED_SECONDS_PER_ROW": str(SECONDS_PER_ROW)})
    try:
        s.wait_ready()
        assert "HAProxy" in s.output()
        yield s
    finally:
        s.stop()


def stats(server: Server) -> dict[str, Any]:
    return dict(requests.get(f"{server.base}/v2/models/gpt2/stats", timeout=30).json()["generation"])


def test_a_client_timeout_cancels_a_whole_answer_behind_haproxy(server: Server) -> None:
    before = stats(server)
    client = openai.OpenAI(base_url=f"{server.base}/v1", api_key="none", max_retries=0, timeout=GIVE_UP_S)
    with pytest.raises(openai.APITimeoutError):
        client.completions.create(model="gpt2", prompt="hello", max_tokens=MAX_TOKENS, temperature=0,
                                  extra_body={"ignore_eos": True})
    # it ran (a replica that ignores disconnects does), then ended: the stats read it after both
    wait_for(lambda: stats(server)["prompt_tokens"] > before["prompt_tokens"], 60, "the prompt prefilled")
    done = wait_for(lambda: (lambda s: s if s["running"] == 0 else None)(stats(server)), 120, "the slot freed")
    generated = done["tokens_generated"] - before["tokens_generated"]
    assert done["running"] == 0 and generated < MAX_TOKENS // 2, generated  # cancelled, not run to its end


def test_a_client_that_goes_away_mid_stream_frees_its_slot(server: Server) -> None:
    """Closing the connection after the first event cancels the generation through HAProxy and the replica.

    Cancelling within one step is proven in-process (tests/serve/test_serve_openai.py); here the way
    through HAProxy, the replica's HTTP server and the engine's inbox.
    """
    body = {"model": "gpt2", "prompt": "hello", "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
            "stream": True}
    before = stats(server)["tokens_generated"]
    with requests.post(f"{server.base}/v1/completions", json=body, stream=True, timeout=120) as reply:
        first = next(reply.iter_lines(delimiter=b"\n\n"))
        assert json.loads(first.removeprefix(b"data: "))["choices"][0]["finish_reason"] is None
        running = stats(server)
        assert running["running"] == 1 and running["tokens_generated"] - before < MAX_TOKENS, running
    done = wait_for(lambda: (lambda s: s if s["running"] == 0 else None)(stats(server)), 120, "the slot freed")
    assert done["free_slots"] == S.SLOTS, done
    generated = done["tokens_generated"] - before
    assert generated < MAX_TOKENS, f"the stream was not cut short: {generated} tokens generated"
