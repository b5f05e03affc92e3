"""``pyrt generate --draft ngram|D.pte --draft-tokens K`` (in process, on a simulated GPU): the same tokens as
without a draft, and the tokens per pass printed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pyrt.tools.cli import main
from tests.fixtures import llm_models as L

pytestmark = pytest.mark.export

ECHO = "5,6,7,8,9,10,11,5,6,7,8,9"


@pytest.fixture(autouse=True)
def one_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYRT_SIMULATED_GPUS", "1")


def run(capsys: pytest.CaptureFixture[str], *args: Any) -> tuple[int, str, str]:
    status = main([str(a) for a in args])
    out = capsys.readouterr()
    return status, out.out, out.err


def test_generate_with_a_draft_prints_the_same_tokens_and_the_tokens_per_pass(capsys: Any) -> None:
    target = L.batched("llama", "reference").path
    plain = run(capsys, "generate", target, "--prompt-ids", ECHO, "--max-new-tokens", 12, "--eos-ids", "")
    assert plain[0] == 0, plain[2]
    for draft in ("ngram", L.draft("llama"), target):
        status, out, err = run(capsys, "generate", target, "--prompt-ids", ECHO, "--max-new-tokens", 12,
                               "--eos-ids", "", "--draft", draft, "--draft-tokens", 3)
        assert status == 0, err
        assert out == plain[1] and f"draft {draft}: " in err and "tokens per pass (12 tokens in" in err
    status, out, err = run(capsys, "generate", target, "--prompt-ids", ECHO, "--max-new-tokens", 12, "--eos-ids", "",
                           "--draft", target, "--json")
    data = json.loads(out)["speculation"]
    assert status == 0 and data["accepted"] == data["drafted"] > 0 and data["tokens_per_pass"] > 2
    assert data["draft_tokens"] == 4 and data["passes"] * data["tokens_per_pass"] == 12


def test_generate_with_a_draft_tree_prints_the_same_tokens(capsys: Any) -> None:
    target = L.batched("llama", "reference").path
    plain = run(capsys, "generate", target, "--prompt-ids", ECHO, "--max-new-tokens", 12, "--eos-ids", "")
    status, out, err = run(capsys, "generate", target, "--prompt-ids", ECHO, "--max-new-tokens", 12, "--eos-ids", "",
                           "--draft", L.draft("llama"), "--draft-tree", "--draft-tokens", 8, "--json")
    data = json.loads(out)
    assert status == 0, err
    assert " ".join(map(str, data["tokens"])) == plain[1].strip() and data["speculation"]["draft_tree"]
    assert data["speculation"]["drafted"] > 0


def test_a_bad_draft_is_named(capsys: Any, tmp_path: Any) -> None:
    target = L.batched("llama", "reference").path
    status, _, err = run(capsys, "generate", target, "--prompt-ids", "1,2", "--draft", tmp_path / "nope.pte")
    assert status != 0 and "is neither \"ngram\" nor a file" in err
    status, _, err = run(capsys, "generate", target, "--prompt-ids", "1,2", "--draft", "ngram", "--draft-tokens", 0)
    assert status != 0 and "--draft-tokens" in err
