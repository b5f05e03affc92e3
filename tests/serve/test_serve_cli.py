"""``pyrt serve`` as a process: a bad file is a clear error; SIGTERM drains requests in flight, then exits 0."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures import serve as serve_fixtures
from tests.fixtures.serve import free_port, rows, wait_for

pytestmark = [pytest.mark.ray]

ROOT = Path(__file__).resolve().parents[2]
COMMAND = [sys.executable, "-m", "pyrt", "serve"]
BATCH_WAIT_MS = 5000  # requests wait this long for a batch: the stop comes while they do, however loaded the machine


def _env(gpus: int | None = None) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYRT_SIMULATED_GPUS", None)
    if gpus is not None:
        env["PYRT_SIMULATED_GPUS"] = str(gpus)
    return env


def test_a_file_that_cannot_load_is_an_error_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / "broken.pte"
    bad.write_bytes(b"not a program at all")
    done = subprocess.run([*COMMAND, str(bad), "--port", str(free_port())], env=_env(), capture_output=True, text=True,
                          timeout=120)  # a free port: one in use is refused before the file is read
    assert done.returncode == 1 and str(bad) in done.stderr, done.stderr
    assert "deprecated" not in done.stderr.lower(), done.stderr  # Ray Serve's Pydantic warnings stay out of sight
    usage = subprocess.run([*COMMAND, str(bad), "--replicas", "0"], env=_env(), capture_output=True, text=True,
                           timeout=120)
    assert usage.returncode == 2 and "expected a whole number >= 1, got '0'" in usage.stderr
    missing = tmp_path / "no-tokenizer"
    done = subprocess.run([*COMMAND, str(bad), "--tokenizer", str(missing)], env=_env(), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1 and f"tokenizer={str(missing)!r}: not a directory" in done.stderr, done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("flags", [[], ["--ray-proxy"]], ids=["haproxy", "ray-proxy"])
def test_sigterm_drains_requests_in_flight_then_exits_0(tmp_path: Path, flags: list[str]) -> None:
    """Through HAProxy straight to the replica (the default) and through Ray Serve's proxy actor."""
    pytest.importorskip("torch")
    pytest.importorskip("executorch")
    requests = pytest.importorskip("requests")
    path = serve_fixtures.build(tmp_path)["dyn"]
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("w") as sink:  # a file, not a pipe: what it said so far is readable while it runs
        proc = subprocess.Popen([*COMMAND, str(path), "--port", str(port), "--batch-wait-ms", str(BATCH_WAIT_MS),
                                 "--max-batch-size", "32", "--cpus-per-replica", "0.5", *flags],
                                env=_env(1), stdout=sink, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}/v2"

    def said() -> str:
        return f"pyrt serve ready (exit status {proc.poll()}; its output: {log.read_text()[-6000:]})"

    try:
        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"pyrt serve exited before it was ready: {said()}")
            try:
                return requests.get(f"{base}/health/ready", timeout=5).status_code == 200
            except (requests.ConnectionError, requests.Timeout):  # not listening yet, or too slow to answer yet
                return False

        wait_for(ready, 180, said)
        xs = [rows(np.random.default_rng(i), 1) for i in range(8)]

        def infer(x: np.ndarray) -> tuple[int, list[float]]:
            body = {"inputs": [{"name": "input0", "datatype": "FP32", "shape": [1, 8], "data": x.ravel().tolist()}]}
            reply = requests.post(f"{base}/models/dyn/infer", data=json.dumps(body), timeout=60)
            return reply.status_code, reply.json()["outputs"][0]["data"] if reply.ok else []

        def arrived() -> bool:  # the replica counts a request as it arrives
            return bool(requests.get(f"{base}/models/dyn/stats", timeout=30).json()["requests"] >= len(xs))

        with ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(infer, x) for x in xs]
            # all 8 at the replica before the stop (on a loaded machine the clients take a while to send them, and
            # one sent after the drain began was not in flight): the first runs at once, the others wait for a batch
            wait_for(arrived, 60, "the 8 requests at the replica")
            assert not all(f.done() for f in futures)
            proc.send_signal(signal.SIGTERM)
            answers = [f.result() for f in futures]
        assert [status for status, _ in answers] == [200] * 8
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = log.read_text()
    assert "draining requests in flight" in out
    from pyrt.serve import ingress

    haproxy = not flags and ingress.haproxy_binary() is not None
    assert f"HTTP via {ingress.HAPROXY if haproxy else ingress.RAY_PROXY}" in out, out
