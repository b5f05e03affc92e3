"""A replica's limits, in-process (no Ray): a full queue is 503 at once, a late answer 504, a slow client 408.

Runs are made slow on purpose with pyrt.sim's slow simulated GPU
(``$PYRT_SIMULATED_SECONDS_PER_ROW``, read where the replica's simulated devices are made).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("ray.serve")
pytest.importorskip("executorch")

from pyrt.errors import InputError  # noqa: E402
from pyrt.llm.config import GenerationConfig  # noqa: E402
from pyrt.runtime.program import Program  # noqa: E402
from pyrt.serve.config import ServeConfig  # noqa: E402
from pyrt.serve.flags import configs  # noqa: E402
from pyrt.sim import SECONDS_PER_ROW_ENV, simulated_gpus  # noqa: E402
from tests.fixtures.serve import (  # noqa: E402
    asgi_request,
    assert_batched_equal,
    build,
    close,
    in_process,
    json_infer,
    rows,
    wait_for,
)

INFER = "/v2/models/dyn/infer"


@pytest.fixture(scope="module")
def dyn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("limits"))["dyn"]


@pytest.fixture
def make(dyn: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``make(seconds_per_row, **config)``: an in-process replica of dyn.pte on a (slow) simulated GPU."""
    made: list[Any] = []

    def replica(seconds_per_row: float = 0.0, **options: Any) -> Any:
        monkeypatch.setenv(SECONDS_PER_ROW_ENV, str(seconds_per_row))
        made.append(in_process(ServeConfig(str(dyn), kernels="numpy", **options), simulated_gpus=1))
        return made[-1]

    yield replica
    for r in made:
        wait_for(lambda r=r: not r.runs.busy, 120, "the replica's last run to end")
        close(r)


def direct(path: Path, x: np.ndarray) -> np.ndarray:
    with simulated_gpus(1), Program(path, kernels="numpy") as prog:
        return np.asarray(prog(x))


def infer_request(x: np.ndarray, **kw: Any) -> Any:
    return asgi_request("POST", INFER, json.dumps(json_infer(x)).encode(), **kw)


def output(reply: Any) -> np.ndarray:
    out = json.loads(reply.body)["outputs"][0]
    return np.asarray(out["data"], np.float32).reshape(out["shape"])


async def in_order(replica: Any, requests: list[Any]) -> tuple[list[Any], list[int]]:
    """Every request at once; the replies, and the order (request indices) in which they were answered."""
    done: list[int] = []

    async def one(i: int, request: Any) -> Any:
        reply = await replica(request)
        done.append(i)
        return reply

    return list(await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))), done


@pytest.mark.parametrize("max_batch_size", [1, 8], ids=["run-thread-queue", "batch-queue"])
def test_a_full_queue_refuses_at_once_with_503_and_retry_after(make: Any, dyn: Path, max_batch_size: int) -> None:
    """8 requests at once, 2 may wait: one runs (or a batch of the first ones), 2 wait, the rest are refused
    before any accepted one is answered; the accepted ones get their own results."""
    replica = make(0.05, generation=GenerationConfig(max_queued=2), max_batch_size=max_batch_size, inline_run_ms=0)
    xs = [rows(np.random.default_rng(i), 1) for i in range(8)]
    replies, order = asyncio.run(in_order(replica, [infer_request(x, late=True) for x in xs]))
    ok = [i for i, r in enumerate(replies) if r.status_code == 200]
    refused = [i for i, r in enumerate(replies) if r.status_code == 503]
    # the run thread's queue: one running and 2 waiting; the batch queue: 2 waiting (and then run as one batch)
    assert len(ok) == (3 if max_batch_size == 1 else 2) and sorted(ok + refused) == list(range(8)), replies
    assert set(order[:len(refused)]) == set(refused)  # refused before any accepted request was answered
    for i in refused:
        assert replies[i].headers["Retry-After"] == "1"
        assert "--max-queued-requests 2" in json.loads(replies[i].body)["error"]
    for i in ok:
        assert_batched_equal(output(replies[i]), direct(dyn, xs[i]))
    assert replica.metrics.stats("dyn")["errors"] == {"Overloaded": len(refused)}
    stats = json.loads(asyncio.run(replica(asgi_request("GET", "/v2/models/dyn/stats"))).body)
    assert stats["queue"] == {"waiting": 0, "limit": 2, "most_waiting": 2}  # the queue never held more than 2
    x = rows(np.random.default_rng(9), 3)  # the queue has drained: a request is served again
    assert_batched_equal(output(asyncio.run(replica(infer_request(x)))), direct(dyn, x))


def test_a_request_past_its_timeout_is_504_and_the_replica_serves_on(make: Any, dyn: Path) -> None:
    """A 32-row run takes 3.2 s on this slow GPU, the timeout is 2 s: 504; the run finishes, its result dropped;
    then a 1-row request (0.1 s) is answered with its result."""
    replica = make(0.1, request_timeout_s=2.0, inline_run_ms=0)
    slow = asyncio.run(replica(infer_request(rows(np.random.default_rng(0), 32))))
    assert slow.status_code == 504, slow.body
    assert "request timeout of 2 s (--request-timeout-s)" in json.loads(slow.body)["error"]
    wait_for(lambda: not replica.runs.busy, 60, "the slow run to end")
    x = rows(np.random.default_rng(1), 1)
    reply = asyncio.run(replica(infer_request(x)))
    assert reply.status_code == 200, reply.body
    assert_batched_equal(output(reply), direct(dyn, x))
    stats = replica.metrics.stats("dyn")
    assert stats["errors"] == {"RequestTimeout": 1} and stats["batch_rows"] == {"1": 1, "32": 1}


def test_after_a_timed_out_run_a_lone_request_waits_for_the_run_thread_instead_of_running_inline(
        make: Any, dyn: Path) -> None:
    """While a timed-out run still holds the run thread, a lone request must wait for the thread (not run on
    the event loop, where it would block every other route until the slow run ends)."""
    replica = make(0.1, request_timeout_s=3.0, inline_run_ms=60_000)

    async def go() -> tuple[Any, Any, Any]:
        slow = await replica(infer_request(rows(np.random.default_rng(0), 32)))  # 504 after 3 s; runs 0.2 s more
        waiting = asyncio.ensure_future(replica(infer_request(rows(np.random.default_rng(1), 1))))
        live = await replica(asgi_request("GET", "/v2/health/live"))  # the event loop is free meanwhile
        return slow, live, await waiting

    slow, live, waiting = asyncio.run(go())
    assert slow.status_code == 504 and live.status_code == 200
    assert waiting.status_code == 200, waiting.body  # 0.1 s of its own after at most 0.2 s of waiting
    assert replica.metrics.stats("dyn")["runs_on_event_loop"] == 0


def test_a_body_that_never_arrives_is_408_and_never_joins_the_queue(make: Any, dyn: Path) -> None:
    """A client that sends its headers and then nothing: 408 after the read timeout; meanwhile (a queue of
    one) a whole request is admitted and answered."""
    replica = make(0.0, read_timeout_s=1.0, generation=GenerationConfig(max_queued=1))
    stalled = asyncio.Event()

    async def never() -> dict[str, Any]:
        stalled.set()
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    x = rows(np.random.default_rng(2), 2)

    async def go() -> tuple[Any, Any]:
        slow = asyncio.ensure_future(replica(asgi_request("POST", INFER, headers={"content-length": "1000"},
                                                          receive=never)))
        await stalled.wait()
        good = await replica(infer_request(x))
        return await slow, good

    slow, good = asyncio.run(go())
    assert slow.status_code == 408 and "read timeout of 1 s (--read-timeout-s)" in json.loads(slow.body)["error"]
    assert good.status_code == 200
    assert_batched_equal(output(good), direct(dyn, x))


def test_json_nested_200000_deep_is_400(make: Any) -> None:
    """Tried as a user would: [[[[...]]]] used to be 500 {"error": "RecursionError: ..."}."""
    replica = make()
    deep = b"[" * 200_000 + b"]" * 200_000
    for body in (deep, b'{"inputs": ' + deep + b"}"):
        reply = asyncio.run(replica(asgi_request("POST", INFER, body)))
        assert reply.status_code == 400 and "nests too deeply" in json.loads(reply.body)["error"], reply.body
    for route in ("generate", "generate_stream"):  # not an LLM program: 404 before the body is read
        assert asyncio.run(replica(asgi_request("POST", f"/v2/models/dyn/{route}", deep))).status_code == 404


@pytest.mark.parametrize(("options", "message", "flag"), [
    ({"generation.max_queued": 0}, "max_queued=0", "--max-queued-requests=0"),
    ({"generation.max_queued": True}, "max_queued=True", "--max-queued-requests=True"),
    ({"request_timeout_s": 0}, "request_timeout_s=0", "--request-timeout-s=0"),
    ({"request_timeout_s": float("inf")}, "request_timeout_s=inf", "--request-timeout-s=inf"),
    ({"read_timeout_s": -1.0}, "read_timeout_s=-1.0", "--read-timeout-s=-1.0"),
    ({"read_timeout_s": None}, "read_timeout_s=None", "--read-timeout-s=None"),
])
def test_bad_limits_are_input_errors_naming_the_value(dyn: Path, options: dict[str, Any], message: str,
                                                      flag: str) -> None:
    """The configs name their fields (the queue bound is the generation config's ``max_queued``, which the infer
    queue shares); the command line's table names the flag that fills each."""
    generation = {k.removeprefix("generation."): v for k, v in options.items() if k.startswith("generation.")}
    own = {k: v for k, v in options.items() if not k.startswith("generation.")}
    with pytest.raises(InputError, match=message.replace("(", r"\(")):
        ServeConfig(str(dyn), generation=GenerationConfig(**generation), **own)
    with pytest.raises(InputError, match=flag.replace("(", r"\(")):
        configs({"path": str(dyn), **options})


def test_a_bad_slow_gpu_setting_is_an_input_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from pyrt.sim import seconds_per_row_from_env

    monkeypatch.setenv(SECONDS_PER_ROW_ENV, "fast")
    with pytest.raises(InputError, match="PYRT_SIMULATED_SECONDS_PER_ROW='fast'"):
        seconds_per_row_from_env()
