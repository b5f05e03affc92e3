"""What pyrt.serve's generation routes use of pyrt.llm (pyrt.llm.serves, the engine), on real exported files."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest

import pyrt.llm  # binds pyrt too; pyrt.llm is a subpackage, not one of pyrt's lazy names
from tests.fixtures import llm_models as L

pytestmark = [pytest.mark.export]


@pytest.fixture(scope="module")
def gpt2() -> L.Exported:
    return L.exported("gpt2", "portable", route="pyrt")


@pytest.fixture
def prog(gpt2: L.Exported) -> Any:
    with pyrt.Program(gpt2.path) as p:
        yield p


def test_serves_says_why_a_method_does_not_generate(prog: Any) -> None:
    assert pyrt.llm.serves(prog) is None
    why = pyrt.llm.serves(prog, method="get_max_seq_len")
    assert why is not None and "convention" in why
    assert pyrt.llm.serves("not a program") is not None and not pyrt.llm.follows_convention("not a program")


def test_the_generate_routes_on_a_one_sequence_file_give_eager_tokens_and_queue(gpt2: L.Exported) -> None:
    """An in-process replica on a batch-1 file: requests at once queue in its engine, each gets eager's tokens."""
    pytest.importorskip("ray.serve")
    from pyrt.serve.config import ServeConfig
    from pyrt.serve.replica import PyrtReplica
    from tests.fixtures.llm_serve import call

    own = next(c for c in PyrtReplica.func_or_class.__mro__ if c.__module__ == "pyrt.serve.replica"
               and "__init__" in vars(c) and not inspect.iscoroutinefunction(c.__init__))
    replica = own(ServeConfig(str(gpt2.path), name="gpt2"))
    body = {"input_ids": L.PROMPT, "parameters": {"max_tokens": L.NEW_TOKENS, "eos_ids": []}}

    async def go() -> list[Any]:
        return list(await asyncio.gather(call(replica, "POST", "/v2/models/gpt2/generate", body),
                                         call(replica, "POST", "/v2/models/gpt2/generate_stream", body)))

    try:
        (status, one), (_, events) = asyncio.run(go())
    finally:
        replica.llm.close()
        replica.metrics.stop()
        replica.program.close()
    assert status == 200 and one["token_ids"] == gpt2.want and one["finish_reason"] == "length"
    assert [e["token_id"] for e in events[:-1]] == gpt2.want and events[-1]["token_ids"] == gpt2.want
    assert one["timings"]["new_tokens"] == L.NEW_TOKENS and "text_output" not in one  # no tokenizer here
