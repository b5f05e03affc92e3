"""D2: behind the default HAProxy ingress, a client that gives up on a whole (not streamed) answer cancels its
generation, with the real ``openai`` client (which sends headers and body in separate writes) and its timeout.

``pyrt serve`` of the reference-engine GPT-2 slot file on a simulated GPU whose every row costs 50 ms, so
46 tokens take over 2 s: a client with a 0.5 s timeout gives up; the engine must stop within a few steps.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytest.importorskip("ray.serve")
pytest.importorskip("executorch")
pytest.importorskip("transformers")
openai = pytest.importorskip("openai")
requests = pytest.importorskip("requests")

from pyrt.serve import ingress  # noqa: E402
from tests.fixtures import llm_serve as S  # noqa: E402
from tests.fixtures.serve_process import Server  # noqa: E402

pytestmark = [pytest.mark.export, pytest.mark.ray]
MAX_TOKENS = S.MAX_SEQ_LEN - 2


def test_a_client_timeout_cancels_a_whole_answer_behind_haproxy(tmp_path: Path) -> None:
    if ingress.haproxy_binary() is None:
        pytest.skip("no HAProxy binary (ray[serve] installs one on Linux)")
    s = Server(S.slot_file("reference"), tmp_path / "serve.log", "--cpus-per-replica", "0.5", "--name", "gpt2",
               "--kernels", "numpy", "--tokenizer", str(S.tokenizer_dir()),
               env={"PYRT_SIMULATED_SECONDS_PER_ROW": "0.05"})
    try:
        s.wait_ready()
        assert "HAProxy" in s.output()

        def stats() -> dict[str, int]:
            return requests.get(f"{s.base}/v2/models/gpt2/stats", timeout=30).json()["generation"]

        before = stats()["tokens_generated"]
        client = openai.OpenAI(base_url=f"{s.base}/v1", api_key="none", max_retries=0, timeout=0.5)
        with pytest.raises(openai.APITimeoutError):
            client.completions.create(model="gpt2", prompt="hello", max_tokens=MAX_TOKENS, temperature=0,
                                      extra_body={"ignore_eos": True})
        deadline = time.monotonic() + 30
        while stats()["running"] and time.monotonic() < deadline:
            time.sleep(0.1)
        generated = stats()["tokens_generated"] - before
        assert stats()["running"] == 0 and generated < MAX_TOKENS // 2, generated  # cancelled, not run to its end
    finally:
        s.stop()
