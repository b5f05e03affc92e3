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

from pyrt.sim import SECONDS_PER_ROW_ENV
from tests.fixtures import serve as serve_fixtures
from tests.fixtures.serve import free_port, rows, wait_for
from tests.fixtures.serve_process import Server

pytestmark = [pytest.mark.ray]

ROOT = Path(__file__).resolve().parents[2]
COMMAND = [sys.executable, "-m", "pyrt", "serve"]
# The stop must come while requests are in flight, however loaded the machine. A request that finds the replica
# idle runs at once, so each simulated launch takes SECONDS_PER_ROW per row: the others arrive while one runs
# (with runs of a few ms, 8 requests sent one after another on a loaded machine can each find it idle: all 8
# were answered before the stop). Those wait BATCH_WAIT_MS for a batch: the test's margin for seeing them all
# at the replica. The wait and the runs of all 8 rows stay within the 30 s Ray Serve gives a replica to finish
# its requests at the stop (pyrt.serve.app.GRACEFUL_SHUTDOWN_S).
SECONDS_PER_ROW = 1.0
BATCH_WAIT_MS = 15_000


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
    from pyrt.serve.app import GRACEFUL_SHUTDOWN_S

    assert BATCH_WAIT_MS / 1000 + 8 * SECONDS_PER_ROW < GRACEFUL_SHUTDOWN_S  # else the drain cuts requests off
    path = serve_fixtures.build(tmp_path)["dyn"]
    server = Server(path, tmp_path / "serve.log", "--batch-wait-ms", str(BATCH_WAIT_MS), "--max-batch-size", "32",
                    "--cpus-per-replica", "0.5", *flags, env={SECONDS_PER_ROW_ENV: str(SECONDS_PER_ROW)})
    base, proc = f"{server.base}/v2", server.proc
    try:
        server.wait_ready()  # fails at once, with what it printed, if it exits before it is ready
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
        server.stop()
    out = server.output()
    assert "draining requests in flight" in out
    from pyrt.serve import ingress

    haproxy = not flags and ingress.haproxy_binary() is not None
    assert f"HTTP via {ingress.HAPROXY if haproxy else ingress.RAY_PROXY}" in out, out
