"""Completions' ``echo`` with ``logprobs``: each ``text_offset`` is where its token's text is in the choice's text.

A prompt that starts with the BOS (as a Llama tokenizer's does) echoes as text without it: the BOS takes no
characters, and every later token's text is found at its offset (issue 46: they counted the BOS's 7 characters).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("starlette")

from pyrt.llm.processors import TokenLogprob  # noqa: E402
from pyrt.serve.openai_api import CompletionRequest  # noqa: E402
from pyrt.serve.openai_completions import CompletionAdapter  # noqa: E402
from pyrt.serve.tokenization import Tokenization  # noqa: E402
from tests.fixtures import llm_serve as S  # noqa: E402

PROMPT = "hello world hello"


@pytest.fixture(scope="module")
def texts() -> Iterator[Tokenization]:
    t = Tokenization(str(S.tokenizer_dir()))
    yield t
    t.close()


@pytest.mark.parametrize("as_ids", [False, True])
def test_echoed_offsets_find_each_token_in_the_returned_text(texts: Tokenization, as_ids: bool) -> None:
    tok: Any = texts.tokenizer
    prompt = [tok.bos_token_id, *tok.encode(PROMPT)]
    body = CompletionRequest(model="m", prompt=prompt if as_ids else PROMPT, echo=True, logprobs=0, max_tokens=4)
    reply = CompletionAdapter(texts).reply(body, "m", prompt)
    new = [TokenLogprob(t, -0.5) for t in tok.encode(" world")]
    pairs = list(zip(prompt, [None] + [TokenLogprob(t, -1.0) for t in prompt[1:]], strict=True))
    lp = reply.logprobs_of(pairs, new, 0)
    text = reply.echo + tok.decode([i.token for i in new])
    assert reply.echo == PROMPT and lp is not None and lp.tokens[0] == tok.bos_token
    assert lp.text_offset[0] == 0 and lp.text_offset[1] == 0  # the BOS takes no characters of the text
    for token, offset in zip(lp.tokens[1:], lp.text_offset[1:], strict=True):
        assert text[offset:offset + len(token)] == token, (token, offset, lp.text_offset)
    assert lp.text_offset[len(prompt)] == len(PROMPT)  # the first new token starts right after the echo
