"""``pyrt serve --draft``: speculative decoding behind the generation routes of an in-process replica.

The served tokens equal ``pyrt.generate``'s on the same file (greedy: token for token, whatever the
draft), the stats route's ``generation`` object and the metrics carry the draft's counters, and a
bad ``--draft`` / ``--draft-tokens`` is a startup error naming the flag.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("ray.serve")
pytest.importorskip("executorch")
pytest.importorskip("transformers")

import pyrt  # noqa: E402
from pyrt.errors import InputError  # noqa: E402
from pyrt.llm.config import GenerationConfig  # noqa: E402
from pyrt.serve.flags import configs  # noqa: E402
from tests.fixtures import llm_serve as S  # noqa: E402

pytestmark = [pytest.mark.export]

NAME = "gpt2"
PROMPT = "say hello to the world hello world"


def run(replica: Any, method: str, path: str, body: Any = b"") -> Any:
    return asyncio.run(S.call(replica, method, path, body))


def reference(ids: list[int], n: int) -> list[int]:
    with pyrt.Program(S.slot_file("portable"), kernels="numpy") as prog:
        return list(pyrt.generate(prog, ids, max_new_tokens=n, eos_ids=[]).tokens)


@pytest.mark.parametrize("draft", ["ngram", "file"])
def test_served_tokens_with_a_draft_equal_pyrt_generate(draft: str) -> None:
    """Prompt lookup, and the target's own file as its draft (fully resident, its own slots): the tokens served on
    both routes, streamed and not, are those of pyrt.generate without a draft; the stats count the guesses."""
    ids = S.tokenizer().encode(PROMPT)
    want = reference(ids, 16)
    path = "ngram" if draft == "ngram" else str(S.slot_file("portable"))
    replica = S.build(tokenizer=str(S.tokenizer_dir()), generation=GenerationConfig(draft=path, draft_tokens=3))
    try:
        body = {"text_input": PROMPT, "max_tokens": 16, "temperature": 0, "eos_ids": []}
        one = run(replica, "POST", f"/v2/models/{NAME}/generate", body)[1]
        events = run(replica, "POST", f"/v2/models/{NAME}/generate_stream", body)[1]
        chat = run(replica, "POST", "/v1/completions", {"model": NAME, "prompt": PROMPT, "max_tokens": 16,
                                                        "temperature": 0, "ignore_eos": True})[1]
        assert one["token_ids"] == want and events[-1]["token_ids"] == want, (one, want)
        assert chat["choices"][0]["text"] == S.tokenizer().decode(want, skip_special_tokens=True)
        stats = run(replica, "GET", f"/v2/models/{NAME}/stats")[1]["generation"]
        assert stats["draft"] == ("ngram" if draft == "ngram" else str(S.slot_file("portable")))
        assert stats["draft_tokens"] == 3 and stats["drafted"] > 0 and 0 <= stats["accepted"] <= stats["drafted"]
        assert stats["tokens_per_pass"] >= 1.0 and stats["acceptance_rate"] == stats["accepted"] / stats["drafted"]
        if draft == "file":  # the target as its own draft: every guess is right
            assert stats["accepted"] == stats["drafted"] and stats["tokens_per_pass"] > 1.5, stats
        metrics = replica.generation.latencies
        replica.metrics.flush()
        assert metrics._done[NAME]["drafted"] == stats["drafted"]  # handed to Ray's counters
    finally:
        S.close(replica)


def test_a_bad_draft_is_a_startup_error_naming_the_flag(tmp_path: Any) -> None:
    """The command line's configs name the flag; a draft file that is no program fails the replica's start,
    naming the draft and the file (the engine's own refusal)."""
    path = str(S.slot_file("portable"))
    with pytest.raises(InputError, match="--draft-tokens=0 must be an int >= 1"):
        configs({"path": path, "generation.draft": "ngram", "generation.draft_tokens": 0})
    with pytest.raises(InputError, match="--draft='nowhere.pte': .*no such file"):
        configs({"path": path, "generation.draft": "nowhere.pte"})
    bad = tmp_path / "bad.pte"
    bad.write_bytes(b"not a program")
    with pytest.raises(InputError, match="draft .*bad.pte"):
        S.build(generation=GenerationConfig(draft=str(bad)))


def test_a_draft_file_runs_on_the_replicas_simulated_gpu() -> None:
    """The reference-engine slot file as its own draft, both on the replica's simulated GPU (its devices factory
    makes one set of devices for the program and the draft): the served tokens are pyrt.generate's there."""
    from pyrt.sim import simulated_gpus

    ids = S.tokenizer().encode(PROMPT)
    with simulated_gpus(1), pyrt.Program(S.slot_file("reference"), kernels="numpy") as prog:
        want = list(pyrt.generate(prog, ids, max_new_tokens=8, eos_ids=[]).tokens)
    replica = S.build("reference", simulated_gpus=1, tokenizer=str(S.tokenizer_dir()),
                      generation=GenerationConfig(draft=str(S.slot_file("reference")), draft_tokens=2))
    try:
        draft = replica.llm.hosts[NAME].engine.drafter.program  # opened by the engine on the target's devices
        assert draft._cuda is replica.program._cuda  # one set of simulated devices (one fake CUDA)
        body = {"input_ids": ids, "max_tokens": 8, "temperature": 0, "eos_ids": []}
        assert run(replica, "POST", f"/v2/models/{NAME}/generate", body)[1]["token_ids"] == want
        stats = run(replica, "GET", f"/v2/models/{NAME}/stats")[1]["generation"]
        assert stats["drafted"] > 0 and stats["accepted"] == stats["drafted"]
    finally:
        S.close(replica)
