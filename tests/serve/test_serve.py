"""``pyrt serve`` end to end: a local Ray (session-scoped), two replicas on simulated GPUs, real clients.

Every result is compared with a direct ``Program`` run of the same file; clients are
``tritonclient.http`` (binary and JSON tensors) and plain HTTP.
"""

from __future__ import annotations

import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.fixtures import serve as serve_fixtures
from tests.fixtures.serve import MAX_ROWS, assert_batched_equal, json_infer, rows, wait_for

pytest.importorskip("torch")
pytest.importorskip("executorch")
ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")
requests = pytest.importorskip("requests")
th = pytest.importorskip("tritonclient.http")

from pyrt.runtime.program import Program  # noqa: E402
from pyrt.serve import ingress  # noqa: E402
from pyrt.serve.app import deployment, run  # noqa: E402
from pyrt.serve.config import ServeConfig  # noqa: E402
from pyrt.sim import simulated_gpus  # noqa: E402

pytestmark = [pytest.mark.ray]

MAX_REQUEST_BYTES = 1 << 20


@pytest.fixture(scope="session")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return serve_fixtures.build(tmp_path_factory.mktemp("serve"))


METRICS_PORT = serve_fixtures.METRICS_PORT  # the session's Ray (tests/serve/conftest.py: ray_serve)
INGRESS = serve_fixtures.INGRESS
GAUGE_TTL_S = 20.0  # Ray 2.60 drops a gauge not set again within 2 export intervals (metrics_report_interval 10 s)
DEPLOYED: dict[str, float] = {}  # when each module fixture's application was running (time.monotonic())


@pytest.fixture(scope="module")
def dyn(ray_serve: str, programs: dict[str, Path]) -> str:
    """``dyn.pte`` as model "dyn": two replicas, one simulated GPU each, batches of up to 8 rows."""
    app = deployment(ServeConfig(str(programs["dyn"]), name="dyn", replicas=2, max_batch_size=8, batch_wait_ms=5,
                                 max_request_bytes=MAX_REQUEST_BYTES, kernels="numpy", cpus_per_replica=0.5,
                                 budget="50%"), simulated_gpus=1)
    run(app, path=str(programs["dyn"]))
    DEPLOYED["dyn"] = time.monotonic()
    return ray_serve


def direct(path: Path, x: np.ndarray) -> np.ndarray:
    with simulated_gpus(1), Program(path, kernels="numpy") as prog:
        return np.asarray(prog(x))


def post(base: str, model: str, body: Any, **kw: Any) -> Any:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return requests.post(f"http://{base}/v2/models/{model}/infer", data=data, timeout=60, **kw)


def test_health_and_metadata(dyn: str) -> None:
    client = th.InferenceServerClient(dyn)
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("dyn")
    assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
    meta = client.get_model_metadata("dyn")
    assert meta["inputs"] == [{"name": "input0", "datatype": "FP32", "shape": [-1, -1],
                               "parameters": {"max_shape": [MAX_ROWS, 8]}}]
    assert meta["outputs"][0]["datatype"] == "FP32" and meta["parameters"]["max_batch_size"] == 8
    missing = requests.get(f"http://{dyn}/v2/models/nope", timeout=30)
    assert missing.status_code == 404 and "no model 'nope'" in missing.json()["error"]
    assert not client.is_model_ready("nope")


def test_the_port_is_haproxy_in_front_of_the_replicas(dyn: str) -> None:
    """A local Ray started by pyrt serves HTTP with HAProxy (ray[serve] installs it on Linux), not Ray's proxy."""
    psutil = pytest.importorskip("psutil")
    if ingress.haproxy_binary() is None:
        pytest.skip("no HAProxy binary here: Ray's proxy serves (every other test runs through it)")
    assert INGRESS["mode"] == ingress.HAPROXY
    port = int(dyn.rsplit(":", 1)[1])
    listeners = {c.pid for c in psutil.net_connections("tcp") if c.laddr.port == port and c.status == "LISTEN"}
    names = set()
    for pid in filter(None, listeners):
        try:
            names.add(psutil.Process(pid).name())
        except psutil.NoSuchProcess:  # an HAProxy that Ray's reload replaced between the two reads
            continue
    assert names == {"haproxy"}, names
    assert "RAY_SERVE_ENABLE_HA_PROXY" not in os.environ  # set for Ray's processes only, then restored


def test_each_replica_applies_the_budget_to_its_engines(dyn: str, programs: dict[str, Path]) -> None:
    with simulated_gpus(1), Program(programs["dyn"], kernels="numpy", budget="50%") as prog:
        want = [(w.index, w.budget, w.source) for w in prog.weight_streaming]
    for _ in range(4):
        got = requests.get(f"http://{dyn}/v2/models/dyn/stats", timeout=30).json()["weight_streaming"]
        assert [(e["engine"], e["budget"], e["source"]) for e in got] == want and want[0][1] > 0


@pytest.mark.parametrize("route", ["generate", "generate_stream"])
def test_generate_routes_are_404_for_a_program_without_the_llm_convention(dyn: str, route: str) -> None:
    reply = requests.post(f"http://{dyn}/v2/models/dyn/{route}", json={"input_ids": [1, 2]}, timeout=30)
    assert reply.status_code == 404 and "does not generate" in reply.json()["error"]
    assert requests.post(f"http://{dyn}/v2/models/nope/{route}", json={}, timeout=30).status_code == 404


@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_infer_equals_a_direct_run(dyn: str, programs: dict[str, Path], binary: bool) -> None:
    x = rows(np.random.default_rng(1), 5)
    client = th.InferenceServerClient(dyn)
    inp = th.InferInput("input0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    out = th.InferRequestedOutput("output0", binary_data=binary)
    got = client.infer("dyn", [inp], outputs=[out]).as_numpy("output0")
    assert_batched_equal(got, direct(programs["dyn"], x))


def _client_work(base: str, seed: int, n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """One client's requests, alternating tritonclient binary, tritonclient JSON and plain HTTP JSON."""
    rng = np.random.default_rng(seed)
    client = th.InferenceServerClient(base)
    done = []
    for i in range(n):
        x = rows(rng, int(rng.integers(1, 4)))
        if i % 3 == 2:
            reply = post(base, "dyn", json_infer(x))
            assert reply.status_code == 200, reply.text
            out = reply.json()["outputs"][0]
            y = np.asarray(out["data"], np.float32).reshape(out["shape"])
        else:
            inp = th.InferInput("input0", list(x.shape), "FP32")
            inp.set_data_from_numpy(x, binary_data=i % 3 == 0)
            y = client.infer("dyn", [inp]).as_numpy("output0")
        done.append((x, y))
    return done


def stats(base: str, model: str, tries: int = 12) -> dict[str, int]:
    """Runs by rows, summed over the replicas the stats requests reached (each answers for itself)."""
    seen: dict[str, dict[str, int]] = {}
    for _ in range(tries):
        s = requests.get(f"http://{base}/v2/models/{model}/stats", timeout=30).json()
        seen[json.dumps(s["weight_streaming"]) + str(s["requests"])] = s["batch_rows"]
    total: dict[str, int] = {}
    for by_rows in seen.values():
        for k, v in by_rows.items():
            total[k] = total.get(k, 0) + v
    return total


def test_32_concurrent_clients_get_their_unbatched_results(dyn: str, programs: dict[str, Path]) -> None:
    with ThreadPoolExecutor(32) as pool:
        results = [r for part in pool.map(lambda s: _client_work(dyn, s, 16), range(32)) for r in part]
    assert len(results) == 512
    with simulated_gpus(1), Program(programs["dyn"], kernels="numpy") as prog:
        for x, y in results:
            assert_batched_equal(y, prog(x))
    by_rows = stats(dyn, "dyn")
    assert max(int(k) for k in by_rows) > 3, by_rows  # runs larger than any one request: batched
    assert max(int(k) for k in by_rows) <= 8, by_rows  # never above --max-batch-size


def _prometheus() -> str:
    return serve_fixtures.prometheus(METRICS_PORT)


@pytest.mark.slow
def test_prometheus_has_pyrt_metrics_per_model(dyn: str) -> None:
    """Ray exports what replicas record every few seconds: batch rows, run times, requests, budgets.

    Each metric appears from an export of its own (Ray's interval), so the test waits until every one it
    checks is there (CI read the batch rows before the requests counter and the run times had come). The
    budgets are set as the replicas load, so they are read only after Ray would have dropped a gauge set
    once (they vanished then: a loaded run reached this test minutes after the replicas loaded).
    """
    for seed in range(4):
        _client_work(dyn, seed, 4)
    time.sleep(max(0.0, DEPLOYED["dyn"] + 2 * GAUGE_TTL_S - time.monotonic()))
    text = serve_fixtures.wait_exported(METRICS_PORT, {
        "ray_pyrt_serve_requests_total", "ray_pyrt_serve_batch_rows_bucket", "ray_pyrt_serve_run_seconds_sum",
        "ray_pyrt_serve_weight_streaming_budget_bytes"}, 'model="dyn"')
    names = {line.split("{")[0] for line in text.splitlines() if 'model="dyn"' in line}
    assert {"ray_pyrt_serve_requests_total", "ray_pyrt_serve_batch_rows_bucket", "ray_pyrt_serve_run_seconds_sum",
            "ray_pyrt_serve_weight_streaming_budget_bytes"} <= names, sorted(names)
    wait_for(lambda: any(line.startswith("ray_serve_") for line in _prometheus().splitlines()), 90,
             "Ray Serve's own metrics on the Prometheus endpoint")  # and Ray Serve's own
    # exact: what Prometheus counts for "dyn" is what its two replicas counted (each hands over once a second)
    replicas: dict[int, dict[str, Any]] = {}
    for _ in range(64):
        stats = requests.get(f"http://{dyn}/v2/models/dyn/stats", timeout=30).json()
        replicas[stats["pid"]] = stats
        if len(replicas) == 2:
            break
    counted = sum(s["requests"] for s in replicas.values())

    def exported() -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in _prometheus().splitlines()
                   if line.startswith("ray_pyrt_serve_requests_total{") and 'model="dyn"' in line)
    wait_for(lambda: exported() == counted, 90, f"Prometheus counting the replicas' {counted} requests to dyn")


BAD_JSON = [
    (b"{oops", "not valid JSON"),
    ({"inputs": []}, "input 'input0' is missing"),
    ({"inputs": [{"name": "input0", "datatype": "FP32", "shape": [1, 8], "data": [0] * 8},
                 {"name": "extra", "datatype": "FP32", "shape": [1], "data": [0]}]}, "no input 'extra'"),
    ({"inputs": [{"name": "input0", "datatype": "INT64", "shape": [1, 8], "data": [0] * 8}]}, "datatype 'INT64'"),
    ({"inputs": [{"name": "input0", "datatype": "FP32", "shape": [1, 9], "data": [0] * 9}]}, "upper bound"),
    ({"inputs": [{"name": "input0", "datatype": "FP32", "shape": [1, 8], "data": [0] * 7}]}, "7 values"),
]


@pytest.mark.parametrize(("body", "message"), BAD_JSON)
def test_bad_requests_are_400_naming_the_input(dyn: str, body: Any, message: str) -> None:
    reply = post(dyn, "dyn", body)
    assert reply.status_code == 400 and message in reply.json()["error"]


def test_bad_binary_unknown_model_too_large_and_failed_runs(dyn: str, programs: dict[str, Path]) -> None:
    head = json.dumps({"inputs": [{"name": "input0", "datatype": "FP32", "shape": [2, 8],
                                   "parameters": {"binary_data_size": 60}}]}).encode()
    reply = post(dyn, "dyn", head + bytes(60), headers={"Inference-Header-Content-Length": str(len(head))})
    assert reply.status_code == 400 and "60 bytes of binary data; shape [2, 8] FP32 needs 64" in reply.json()["error"]
    assert post(dyn, "nope", json_infer(rows(np.random.default_rng(0), 1))).status_code == 404
    big = post(dyn, "dyn", b"x" * (MAX_REQUEST_BYTES + 1))
    assert big.status_code == 413 and "over the server's limit" in big.json()["error"]
    empty = post(dyn, "dyn", json_infer(np.zeros((0, 8), np.float32)))  # within the bounds, refused by the engine
    assert empty.status_code == 400 and "outside the engine's optimization profile" in empty.json()["error"]
    x = rows(np.random.default_rng(3), 2)  # every replica still serves
    for _ in range(6):
        good = post(dyn, "dyn", json_infer(x))
        assert good.status_code == 200
        assert_batched_equal(np.asarray(good.json()["outputs"][0]["data"], np.float32).reshape(2, 4),
                             direct(programs["dyn"], x))



def test_methods_are_models_static_ones_run_alone_and_run_failures_are_500(ray_serve: str, pte_file: Any) -> None:
    """ExecuTorch's ``portable`` fixture (methods forward and dyn) as a second application under /portable."""
    path = pte_file("portable")
    run(deployment(ServeConfig(str(path), name="portable", app_name="portable", kernels="torch", max_batch_size=4,
                               cpus_per_replica=0.5)),
        app_name="portable", path=str(path), route_prefix="/portable")
    base = f"{ray_serve}/portable"
    assert requests.get(f"http://{base}/v2/models/portable.dyn", timeout=30).json()["parameters"] == {
        "method": "dyn", "max_batch_size": 4}
    meta = requests.get(f"http://{base}/v2/models/portable", timeout=30).json()
    assert meta["parameters"] == {"method": "forward", "max_batch_size": 0}  # static shapes: one at a time
    x = np.ones((3, 3), np.float32)
    reply = post(base, "portable.dyn", {"inputs": [{"name": "input0", "datatype": "FP32", "shape": [3, 3],
                                                    "data": x.ravel().tolist()}]})
    assert reply.status_code == 200 and reply.json()["outputs"][0]["data"] == [3.0] * 9
    bad = {"inputs": [{"name": "input0", "datatype": "FP32", "shape": [2, 4], "data": [0] * 8},
                      {"name": "input1", "datatype": "INT64", "shape": [2], "data": [0, 99]}]}
    failed = post(base, "portable", bad)
    assert failed.status_code == 500 and "index 99 is out of bounds" in failed.json()["error"]
    good = post(base, "portable", {"inputs": [bad["inputs"][0], {**bad["inputs"][1], "data": [0, 3]}]})
    assert good.status_code == 200 and len(good.json()["outputs"]) == 3
    assert requests.get(f"http://{base}/v2/models/portable/stats", timeout=30).json()["errors"] == {
        "ExecutionError": 1}
    serve.delete("portable")


# -- faults (slow: each waits for Ray to notice and replace something) --------------------------------------


def _replica_pids(base: str, model: str, tries: int = 16) -> set[int]:
    """Process ids of the replicas the stats requests reached."""
    return {requests.get(f"http://{base}/v2/models/{model}/stats", timeout=30).json()["pid"] for _ in range(tries)}


def _running(app: str) -> int:
    status = serve.status().applications.get(app)
    return 0 if status is None else sum(d.replica_states.get("RUNNING", 0) for d in status.deployments.values())


def _racing_request(base: str, body: dict[str, Any]) -> int:
    """The status of a request sent as a replica dies; 0 when the connection was closed without an answer."""
    try:
        return int(post(base, "dyn", body).status_code)
    except requests.ConnectionError:
        return 0


@pytest.mark.slow
def test_a_killed_replica_is_replaced_while_the_other_serves(dyn: str, programs: dict[str, Path]) -> None:
    """Requests sent meanwhile are answered by the surviving replica.

    Behind HAProxy (the default) the one request racing the death itself may be dropped (connection
    closed, or HAProxy's 502 mapped to 500), about one kill in four here; Ray's proxy re-routes it.
    Documented in README (Serve) and pyrt.serve.ingress.
    """
    before = wait_for(lambda: (lambda p: p if len(p) == 2 else None)(_replica_pids(dyn, "dyn")), 60, "2 replicas")
    victim = min(before)
    os.kill(victim, signal.SIGKILL)
    x = rows(np.random.default_rng(5), 2)
    want = direct(programs["dyn"], x)
    first = _racing_request(dyn, json_infer(x))
    assert first == 200 or (INGRESS["mode"] == ingress.HAPROXY and first in (0, 500)), first
    answered = 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # requests sent meanwhile: answered by the surviving replica
        reply = post(dyn, "dyn", json_infer(x))
        assert reply.status_code == 200, reply.text
        assert_batched_equal(np.asarray(reply.json()["outputs"][0]["data"], np.float32).reshape(2, 4), want)
        answered += 1
    wait_for(lambda: _running("pyrt") == 2, 120, "a replacement replica")
    after = wait_for(lambda: (lambda p: p if len(p) == 2 else None)(_replica_pids(dyn, "dyn")), 60, "2 replicas")
    assert victim not in after and answered > 0
    client = th.InferenceServerClient(dyn)
    wait_for(client.is_server_ready, 60, "ready again")


@pytest.mark.slow
def test_ready_only_once_every_replica_has_loaded(ray_serve: str, programs: dict[str, Path]) -> None:
    """Two replicas of one GPU each while "dyn" holds two of the three GPUs: one loads, one waits."""
    from ray.serve.api import RunTarget, run_many

    app = deployment(ServeConfig(str(programs["dyn"]), name="late", app_name="late", replicas=2, kernels="numpy",
                                 cpus_per_replica=0.25), simulated_gpus=1)
    run_many([RunTarget(app, name="late", route_prefix="/late")], wait_for_applications_running=False)
    base = f"http://{ray_serve}/late/v2"
    wait_for(lambda: _running("late") == 1, 120, "the first replica")
    time.sleep(2)
    for path in ("/health/ready", "/models/late/ready"):
        assert requests.get(base + path, timeout=30).status_code == 503
    assert requests.get(base + "/health/live", timeout=30).status_code == 200
    serve.delete("pyrt")  # frees a GPU: the second replica loads
    wait_for(lambda: requests.get(base + "/health/ready", timeout=30).status_code == 200, 120, "ready")
    assert _running("late") == 2
    assert requests.get(base + "/models/late/ready", timeout=30).json() == {"name": "late", "ready": True}
    serve.delete("late")


@pytest.mark.export
@pytest.mark.slow
def test_generate_routes_of_a_program_following_the_llm_convention(ray_serve: str,
                                                                   tmp_path_factory: pytest.TempPathFactory) -> None:
    """A GPT-2 decoder exported by pyrt.export.decoder_to_pte: /generate and /generate_stream give eager's tokens."""
    from tests.fixtures import llm_models as L

    gpt2 = L.Exported("gpt2", tmp_path_factory.mktemp("gen") / "gpt2.pte", "portable", route="pyrt")
    run(deployment(ServeConfig(str(gpt2.path), name="gpt2", app_name="gen", cpus_per_replica=0.25)), app_name="gen",
        path=str(gpt2.path), route_prefix="/gen")
    base = f"http://{ray_serve}/gen/v2/models/gpt2"
    body = {"input_ids": L.PROMPT, "parameters": {"max_tokens": L.NEW_TOKENS, "eos_ids": []}}
    reply = requests.post(f"{base}/generate", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    assert reply.json()["token_ids"] == gpt2.want and reply.json()["finish_reason"] == "length"
    stream = requests.post(f"{base}/generate_stream", json=body, timeout=120)
    events = [json.loads(c.removeprefix("data: ")) for c in stream.text.split("\n\n") if c]
    assert [e["token_id"] for e in events[:-1]] == gpt2.want and events[-1]["token_ids"] == gpt2.want
    bad = requests.post(f"{base}/generate", json={"input_ids": L.PROMPT, "parameters": {"colour": 1}}, timeout=60)
    assert bad.status_code == 400 and "colour" in bad.json()["error"]
    serve.delete("gen")
