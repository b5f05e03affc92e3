"""Overload: ``pyrt serve`` offered more than it can run, with and without ``--max-queued-requests``.

One replica on a slow simulated GPU (``PYRT_SIMULATED_SECONDS_PER_ROW=0.05``: a one-row run takes 50 ms,
so the replica serves about 20 requests/s with batching off), ``--max-batch-size 1``; 32 clients send one-row
requests back to back for ``--seconds`` (each client waits for its answer; a refused client waits the
``Retry-After`` it was given before it sends again, as a well-behaved client does). Per setting: requests
answered 200 and their p50/p99 latency, requests refused 503 and theirs, and the replica's RSS at the end.

    python benchmarks/bench_overload.py [--seconds 30] [--no-write]
"""


import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.fixtures
from _common import command_line, machine, markdown_table, write_results  # noqa: E402

CLIENTS = 32
SECONDS_PER_ROW = 0.05


def measure(path: Path, log: Path, seconds: float, queue: int | None) -> list[str]:
    from pyrt.sim import SECONDS_PER_ROW_ENV
    from tests.fixtures.serve_process import Server

    flags = ["--max-batch-size", "1", "--cpus-per-replica", "0.5"]
    if queue is not None:
        flags += ["--max-queued-requests", str(queue)]
    server = Server(path, log, *flags, env={SECONDS_PER_ROW_ENV: str(SECONDS_PER_ROW)}).wait_ready()
    body = json.dumps({"inputs": [{"name": "input0", "datatype": "FP32", "shape": [1, 8], "data": [0.5] * 8}]})
    done: list[tuple[int, float]] = []
    lock = threading.Lock()
    until = time.monotonic() + seconds

    def client() -> None:
        session = requests.Session()
        while time.monotonic() < until:  # bounded in time; each request waits for its answer
            sent = time.monotonic()
            reply = session.post(f"{server.base}/v2/models/dyn/infer", data=body, timeout=600)
            with lock:
                done.append((reply.status_code, time.monotonic() - sent))
            if reply.status_code == 503:
                time.sleep(float(reply.headers.get("Retry-After", "1")))

    try:
        threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        rss = requests.get(f"{server.base}/v2/models/dyn/stats", timeout=30).json()["rss_bytes"]
    finally:
        server.stop()
    row = [str(queue) if queue is not None else "none (default)"]
    for status in (200, 503):
        lat = [s for code, s in done if code == status]
        row += [str(len(lat)), *(f"{1000 * np.percentile(lat, q):.0f}" if lat else "-" for q in (50, 99))]
    others = sum(1 for code, _ in done if code not in (200, 503))
    return [*row, str(others), f"{rss / 2**20:.0f}"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args()
    from tests.fixtures.serve import build

    with tempfile.TemporaryDirectory(prefix="pyrt-overload-") as tmp:
        path = build(Path(tmp))["dyn"]
        rows = [measure(path, Path(tmp) / f"serve{q}.log", args.seconds, q) for q in (None, 4)]
    head = ["--max-queued-requests", "200", "p50 ms", "p99 ms", "503", "p50 ms", "p99 ms", "other", "replica RSS MiB"]
    text = (f"### Overload: {CLIENTS} clients against one replica that serves about {1 / SECONDS_PER_ROW:.0f} "
            f"requests/s\n\n`{command_line()}` ({machine()}); slow simulated GPU "
            f"(`PYRT_SIMULATED_SECONDS_PER_ROW={SECONDS_PER_ROW}`), `--max-batch-size 1`, {args.seconds:g} s each; "
            f"a refused client waits its `Retry-After` before it sends again.\n\n{markdown_table(head, rows)}")
    print(text)
    if not args.no_write:
        write_results("bench_overload", "Serving", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
