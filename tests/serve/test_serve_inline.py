"""A replica built in-process: an idle replica runs short methods on its event loop; bfloat16 answers.

The replica is built in this process (no Ray): the class as written, then ``dispatch``, or
``replica(request)`` with a Starlette request as Ray Serve hands one over.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("ray.serve")
pytest.importorskip("executorch")

from pyrt.runtime.program import Program  # noqa: E402
from pyrt.serve.config import ServeConfig  # noqa: E402
from pyrt.serve.protocol import InferRequest  # noqa: E402
from pyrt.sim import simulated_gpus  # noqa: E402
from tests.fixtures.serve import asgi_request, assert_batched_equal, build, in_process, json_infer, rows  # noqa: E402


@pytest.fixture(scope="module")
def dyn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("inline"))["dyn"]


def _replica(cfg: ServeConfig, simulated_gpus: int | None = 1) -> Any:
    return in_process(cfg, simulated_gpus)


@pytest.fixture
def make(dyn: Path) -> Iterator[Any]:
    made: list[Any] = []

    def replica(inline_run_ms: float) -> Any:
        made.append(_replica(ServeConfig(str(dyn), kernels="numpy", inline_run_ms=inline_run_ms)))
        return made[-1]

    yield replica
    for r in made:
        r.metrics.stop()
        r.pool.shutdown()
        r.program.close()


def _requests(replica: Any, xs: list[np.ndarray]) -> tuple[list[np.ndarray], list[str]]:
    """One request at a time; each result and the thread its run took (recorded around Program.run)."""
    threads: list[str] = []
    run = replica.program.run

    def recording(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread().name)
        return run(*args, **kwargs)

    replica.program.run = recording
    info = replica.models["dyn"]

    async def go() -> list[np.ndarray]:
        return [(await replica.inference.dispatch(info, InferRequest(None, [x])))[0] for x in xs]

    return asyncio.run(go()), threads


def test_after_a_short_first_run_an_idle_replica_runs_on_its_event_loop(make: Any, dyn: Path) -> None:
    rng = np.random.default_rng(0)
    xs = [rows(rng, n) for n in (1, 3, 2, 5)]
    replica = make(inline_run_ms=60_000)  # every run is "short"
    got, threads = _requests(replica, xs)
    assert threads[0].startswith("pyrt-run")  # no run time known yet: the run thread
    assert threads[1:] == [threading.current_thread().name] * 3  # this test's thread runs the event loop
    assert replica.metrics.stats("dyn")["runs_on_event_loop"] == 3
    with simulated_gpus(1), Program(dyn, kernels="numpy") as prog:
        for x, y in zip(xs, got, strict=True):
            assert_batched_equal(y, prog(x))


def test_inline_run_ms_zero_keeps_every_run_on_the_run_thread(make: Any) -> None:
    rng = np.random.default_rng(1)
    replica = make(inline_run_ms=0)
    _, threads = _requests(replica, [rows(rng, 2) for _ in range(3)])
    assert all(t.startswith("pyrt-run") for t in threads), threads
    assert replica.metrics.stats("dyn")["runs_on_event_loop"] == 0


def test_a_negative_inline_run_ms_is_refused(dyn: Path) -> None:
    from pyrt.errors import InputError

    with pytest.raises(InputError, match=r"inline_run_ms=-1"):
        ServeConfig(str(dyn), inline_run_ms=-1)


def test_bfloat16_outputs_are_answered_as_bf16_bytes(tmp_path: Path) -> None:
    """A bfloat16 program on torch kernels: the binary output is the bytes of the direct torch run's bf16 result."""
    pytest.importorskip("ml_dtypes")
    import json

    import torch
    from executorch.exir import to_edge

    from pyrt.serve.protocol import decode_infer, encode_infer

    torch.manual_seed(0)
    model = torch.nn.Linear(6, 5).to(torch.bfloat16).eval()
    x = torch.randn(3, 6, dtype=torch.bfloat16)
    path = tmp_path / "bf16.pte"
    path.write_bytes(to_edge(torch.export.export(model, (x,))).to_executorch().buffer)
    replica = _replica(ServeConfig(str(path), kernels="torch"), simulated_gpus=None)
    try:
        info = replica.models["bf16"]
        header = json.dumps({"inputs": [{"name": "input0", "datatype": "BF16", "shape": [3, 6],
                                         "parameters": {"binary_data_size": 36}}],
                             "parameters": {"binary_data_output": True}}).encode()
        req = decode_infer(info, header + x.view(torch.int16).numpy().tobytes(), str(len(header)))
        data, headers = encode_infer(info, req, asyncio.run(replica.inference.dispatch(info, req)))
    finally:
        replica.pool.shutdown()
        replica.program.close()
    start = int(headers["Inference-Header-Content-Length"])
    assert json.loads(data[:start])["outputs"][0]["datatype"] == "BF16"
    with Program(path, kernels="torch") as prog:
        assert data[start:] == prog(x).view(torch.int16).numpy().tobytes()


def _request(method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
             scope: dict[str, Any] | None = None, *, late: bool = False) -> Any:
    """A Starlette request, as Ray Serve hands one to a replica; ``late``: its body arrives after a yield."""
    return asgi_request(method, path, body, headers, scope, late=late)


def _http(replica: Any, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
          scope: dict[str, Any] | None = None) -> Any:
    """``replica(request)`` for one HTTP request."""
    return asyncio.run(replica(_request(method, path, body, headers, scope)))


def test_the_replica_answers_http_itself(make: Any, dyn: Path) -> None:
    """tritonclient's binary request through ``__call__``: the answer is the direct run's; routes and statuses."""
    import json

    th = pytest.importorskip("tritonclient.http")
    x = rows(np.random.default_rng(2), 3)
    inp = th.InferInput("input0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    body, size = th.InferenceServerClient.generate_request_body(
        [inp], outputs=[th.InferRequestedOutput("output0", binary_data=True)])
    replica = make(inline_run_ms=2.0)
    for path in ("/v2/models/dyn/infer", "/v2/models/dyn/versions/1/infer"):
        reply = _http(replica, "POST", path, body, {"Inference-Header-Content-Length": str(size)})
        assert reply.status_code == 200, reply.body
        got = th.InferenceServerClient.parse_response_body(
            reply.body, header_length=int(reply.headers["Inference-Header-Content-Length"]))
        with simulated_gpus(1), Program(dyn, kernels="numpy") as prog:
            assert_batched_equal(got.as_numpy("output0"), prog(x))
    stats = replica.metrics.stats("dyn")
    assert stats["requests"] == 2 and sum(stats["batch_rows"].values()) == 2 and stats["run_seconds"] > 0
    under = _http(replica, "GET", "/apps/pyrt/v2/health/live", scope={"root_path": "/apps/pyrt"})  # a route prefix
    assert json.loads(under.body) == {"live": True}
    assert json.loads(_http(replica, "GET", "/v2/health/live").body) == {"live": True}
    assert json.loads(_http(replica, "GET", "/v2/models/dyn").body)["name"] == "dyn"
    assert json.loads(_http(replica, "GET", "/v2").body)["name"] == "pyrt"
    missing = _http(replica, "GET", "/v2/models/nope")
    assert missing.status_code == 404 and "no model 'nope'" in json.loads(missing.body)["error"]
    assert _http(replica, "GET", "/v3/anything").status_code == 404
    wrong = _http(replica, "GET", "/v2/models/dyn/infer")
    assert wrong.status_code == 405 and "GET is not allowed" in json.loads(wrong.body)["error"]
    bad = _http(replica, "POST", "/v2/models/dyn/infer", b"{oops")
    assert bad.status_code == 400 and "JSON" in json.loads(bad.body)["error"]
    assert replica.metrics.stats("dyn")["errors"] == {"InputError": 1}


def test_a_request_counts_as_in_flight_from_its_arrival(dyn: Path) -> None:
    """B arrives while A's body is read: A does not run alone on the event loop; A and B run as one batch."""
    import json

    replica = _replica(ServeConfig(str(dyn), kernels="numpy", inline_run_ms=60_000,
                                   batch_wait_ms=100))
    rng = np.random.default_rng(3)
    xs = [rows(rng, 2), rows(rng, 3)]

    def request(x: np.ndarray) -> Any:
        return _request("POST", "/v2/models/dyn/infer", json.dumps(json_infer(x)).encode(), late=True)

    async def go() -> list[Any]:
        await replica(request(xs[0]))  # a first run: its time is known (short) from now on
        return list(await asyncio.gather(*(replica(request(x)) for x in xs)))

    try:
        replies = asyncio.run(go())
        stats = replica.metrics.stats("dyn")
    finally:
        replica.metrics.stop()
        replica.pool.shutdown()
        replica.program.close()
    assert stats["runs_on_event_loop"] == 0 and stats["batch_rows"] == {"2": 1, "5": 1}, stats
    with simulated_gpus(1), Program(dyn, kernels="numpy") as prog:
        for x, reply in zip(xs, replies, strict=True):
            out = json.loads(reply.body)["outputs"][0]
            assert_batched_equal(np.asarray(out["data"], np.float32).reshape(out["shape"]), prog(x))
