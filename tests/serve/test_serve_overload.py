"""Overload, timeouts and slow clients through the real server: ``pyrt serve`` (HAProxy -> replica), real sockets.

The GPU is simulated and slow on purpose (``PYRT_SIMULATED_SECONDS_PER_ROW``, pyrt.sim):
a run of one row takes ``SLOW_S``. Every request loop is bounded in count and time.
"""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pyrt.runtime.program import Program
from pyrt.sim import SECONDS_PER_ROW_ENV, simulated_gpus
from tests.fixtures.serve import assert_batched_equal, build, json_infer, rows, wait_for
from tests.fixtures.serve_process import Server

pytest.importorskip("ray.serve")
pytest.importorskip("executorch")

pytestmark = [pytest.mark.ray]
requests = pytest.importorskip("requests")

SLOW_S = 0.5  # seconds per row of the simulated GPU
QUEUE = 2
TIMEOUT_S = 6.0  # --request-timeout-s: a 1-row run (0.5 s) always fits, a 32-row run (16 s) never does
READ_S = 2.0  # --read-timeout-s


@pytest.fixture(scope="module")
def dyn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("overload"))["dyn"]


@pytest.fixture(scope="module")
def server(dyn: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One replica, one row per run (batching off: each request is a run), a queue of 2, the limits set."""
    s = Server(dyn, tmp_path_factory.mktemp("overload-log") / "serve.log", "--max-queued-requests", str(QUEUE),
               "--max-batch-size", "1", "--request-timeout-s", str(TIMEOUT_S), "--read-timeout-s", str(READ_S),
               "--cpus-per-replica", "0.5", env={SECONDS_PER_ROW_ENV: str(SLOW_S)})
    try:
        yield s.wait_ready()
    finally:
        s.stop()


def direct(path: Path, x: np.ndarray) -> np.ndarray:
    with simulated_gpus(1), Program(path, kernels="numpy") as prog:
        return np.asarray(prog(x))


def infer(base: str, x: np.ndarray) -> tuple[float, float, Any]:
    """(sent, answered) monotonic times and the reply of one infer request."""
    sent = time.monotonic()
    reply = requests.post(f"{base}/v2/models/dyn/infer", data=json.dumps(json_infer(x)), timeout=120)
    return sent, time.monotonic(), reply


def output(reply: Any) -> np.ndarray:
    out = reply.json()["outputs"][0]
    return np.asarray(out["data"], np.float32).reshape(out["shape"])


def stats(base: str) -> dict[str, Any]:
    return dict(requests.get(f"{base}/v2/models/dyn/stats", timeout=30).json())


def burst(s: Server, n: int, seed: int) -> list[tuple[np.ndarray, float, float, Any]]:
    xs = [rows(np.random.default_rng(seed + i), 1) for i in range(n)]
    with ThreadPoolExecutor(n) as pool:
        return [(x, *r) for x, r in zip(xs, pool.map(lambda x: infer(s.base, x), xs), strict=True)]


def test_beyond_the_queue_clients_get_503_with_retry_after_and_the_accepted_get_their_results(
        server: Server, dyn: Path) -> None:
    """16 requests at once on a replica that runs one at a time (0.5 s each) and lets 2 wait: no admitted request
    ever joins a queue of more than 2 (the replica's own record, ``queue.most_waiting``); the rest are refused at
    once (before the last accepted one is answered), each with Retry-After and a JSON error naming the limit.
    How many are accepted depends on how many runs end while the burst still arrives (on a busy machine HAProxy
    can hand a request on seconds after the client sent it), so the count is bounded, not fixed.
    The replica's memory does not grow from one such burst to the next."""
    rss = []
    for round_ in range(3):
        done = burst(server, 16, 100 * round_)
        ok = [d for d in done if d[3].status_code == 200]
        refused = [d for d in done if d[3].status_code == 503]
        assert len(ok) + len(refused) == 16, [d[3].text for d in done]
        assert ok and refused, (len(ok), len(refused))
        last_ok = max(answered for _, _, answered, _ in ok)
        for _, _, answered, reply in refused:
            assert reply.headers["Retry-After"] == "1" and answered < last_ok
            assert reply.text.startswith("{") and f"--max-queued-requests {QUEUE}" in reply.json()["error"], \
                reply.text  # the replica's refusal, not Ray's backstop ("Request dropped due to backpressure")
        for x, _, _, reply in ok:
            assert_batched_equal(output(reply), direct(dyn, x))
        wait_for(lambda: stats(server.base)["requests"] > 0, 30, "stats")
        queue = stats(server.base)["queue"]
        assert queue["limit"] == QUEUE and 1 <= queue["most_waiting"] <= QUEUE, queue
        rss.append(stats(server.base)["rss_bytes"])
    assert rss[2] <= rss[0] * 1.05, rss  # bounded: the third burst holds no more than the first


def test_a_run_past_the_request_timeout_is_504_and_the_replica_serves_on(server: Server, dyn: Path) -> None:
    late = requests.post(f"{server.base}/v2/models/dyn/infer", data=json.dumps(json_infer(rows(
        np.random.default_rng(7), 32))), timeout=120)  # 16 s of run: answered 504 at 6 s, the run goes on
    assert late.status_code == 504 and "--request-timeout-s" in late.json()["error"]
    x = rows(np.random.default_rng(8), 1)

    def served() -> Any:  # the replica is busy with the abandoned run for about 10 s more: 504s meanwhile
        reply = infer(server.base, x)[2]
        assert reply.status_code in (200, 504), reply.text
        return reply if reply.status_code == 200 else None

    assert_batched_equal(output(wait_for(served, 120, "a request served after the timed-out run")), direct(dyn, x))


def _raw(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    sock.settimeout(60)
    return sock


def _trickle(sock: socket.socket, data: bytes, every_s: float = 0.5) -> None:
    """Send ``data`` a byte at a time (at most len(data) bytes, ``every_s`` apart) until the server answers."""
    for byte in data:
        if select.select([sock], [], [], 0)[0]:  # an answer (or a close) is waiting: stop sending
            return
        try:
            sock.sendall(bytes([byte]))
        except OSError:
            return
        time.sleep(every_s)


def _status(sock: socket.socket) -> int:
    """The status of the answer on ``sock`` (0 when it was closed without one)."""
    head = b""
    while b"\r\n" not in head:
        try:
            chunk = sock.recv(4096)
        except OSError:
            break
        if not chunk:
            break
        head += chunk
    return int(head.split()[1]) if head.startswith(b"HTTP/") else 0


def test_a_connection_that_never_sends_and_headers_that_trickle_are_cut_with_408(server: Server) -> None:
    """HAProxy's ``timeout http-request`` (set to --read-timeout-s by pyrt; Ray leaves it unset: an hour of
    ``timeout client``)."""
    silent = _raw(server.port)
    trickle = _raw(server.port)
    trickle.sendall(b"POST /v2/models/dyn/infer HTTP/1.1\r\nHost: x\r\n")
    _trickle(trickle, b"X-Slow: " + b"a" * 110)  # one header byte every 0.5 s: at most 60 s
    assert _status(trickle) == 408 and _status(silent) == 408
    silent.close()
    trickle.close()


def test_a_body_that_trickles_is_cut_with_408_without_taking_a_place_in_the_queue(server: Server, dyn: Path) -> None:
    """Headers whole, the body one byte every 0.5 s: 408 after --read-timeout-s, from HAProxy (which buffers each
    body, ``timeout http-request``) or from the replica (``ReadTimeout``), whichever's clock ends first; meanwhile
    (a queue of 2) three requests sent together are all served, and the slow bodies count as nothing else."""
    body = json.dumps(json_infer(rows(np.random.default_rng(9), 1))).encode()
    before = stats(server.base)["errors"]
    slow = [_raw(server.port) for _ in range(4)]
    for sock in slow:
        sock.sendall(b"POST /v2/models/dyn/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body[:5])
    for x, _, _, reply in burst(server, 1 + QUEUE, 900):
        assert reply.status_code == 200, reply.text
        assert_batched_equal(output(reply), direct(dyn, x))
    statuses = []
    for sock in slow:
        _trickle(sock, body[5:20])  # at most 15 bytes, 7.5 s
        statuses.append(_status(sock))
        sock.close()
    assert statuses == [408] * 4, statuses
    after = stats(server.base)["errors"]
    read_timeouts = after.pop("ReadTimeout", 0) - before.pop("ReadTimeout", 0)
    assert after == before and 0 <= read_timeouts <= 4, (before, after)
