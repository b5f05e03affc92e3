"""``pyrt serve`` against direct Program calls and a plain FastAPI + uvicorn app wrapping the same Program.

Three programs, each exported once with reference engines (batch 1..32) and run on one simulated GPU:
a tiny MLP (8 -> 256 -> 4), a small ResNet (``pyrt.testing.archs``), and a wide MLP (64 -> 4096, three
4096 x 4096 layers, -> 16; 200 MB of weights) whose cost is weight-bound like a GPU's: a batch of 32
rows costs a few times one row, not 32 times. Requests/s and p50/p99 latency at concurrency 1, 8 and 32 of

- ``direct``: ``Program`` calls in this process (threads share one Program);
- ``fastapi``: one uvicorn process, a POST route taking the raw float32 bytes;
- ``serve``: ``pyrt serve`` as it starts by default (one replica; HTTP through HAProxy straight to the
  replica, Ray 2.56+ direct ingress; binary KServe v2 bodies as tritonclient writes them), with dynamic
  batching (``--max-batch-size 32``) and without (``1``); their last column is the replica's own mean run
  time during the measurement (from its stats route), what the simulated GPU costs there;
- ``ray serve no-op``: the floor of Ray Serve itself: a replica that answers HTTP in its own
  ``__call__`` (as pyrt's does), reads the same body and answers ``{}`` without running anything;
- ``... (ray proxy)``: the batched server and the no-op again on a Ray started with ``--ray-proxy``
  (Ray Serve's HTTP proxy actor in front, the pre-2.56 path).

Every side loads the Program with ``kernels="torch"``, so the simulated GPU computes on torch on every
side (the reference engines use numpy in a process that has not imported torch). Each request is one row.
HTTP clients are asyncio tasks on one aiohttp session (keep-alive) in this process, on the same
cores as the servers; ``direct`` callers are threads; every figure is from the same run. Threads pinned to 1
(OMP/OpenBLAS/MKL variables, inherited by Ray's processes and the FastAPI app; ``torch.set_num_threads(1)``).

    python benchmarks/bench_serve.py [--requests 400] [--no-write]
"""


import argparse
import asyncio
import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import requests  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.fixtures.serve
from _common import ROOT, command_line, machine, markdown_table, write_results  # noqa: E402

CONCURRENCY = (1, 8, 32)
# Every side runs its Program with kernels="torch": that imports torch, so the simulated GPU's reference engines
# compute on torch on every side (in a process without torch they compute on numpy, at another speed).
KERNELS = "torch"
MAX_ROWS = 32
SHAPES = {"mlp": (8,), "resnet": (3, 32, 32), "wide": (64,)}
WIDE = 4096


class Mlp(torch.nn.Module):
    """Linear-ReLU layers: ``sizes[0] -> ... -> sizes[-1]``."""

    def __init__(self, *sizes: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:], strict=False))

    def forward(self, x: Any) -> Any:
        for layer in self.layers[:-1]:
            x = torch.relu(layer(x))
        return self.layers[-1](x)


def export(directory: Path) -> dict[str, Path]:
    from pyrt.export import to_pte
    from pyrt.testing import archs

    torch.manual_seed(0)
    resnet, _ = archs.build("resnet")
    models = {"mlp": Mlp(8, 256, 4).eval(), "resnet": resnet, "wide": Mlp(64, WIDE, WIDE, WIDE, WIDE, 16).eval()}
    batch = {0: torch.export.Dim("batch", min=1, max=MAX_ROWS)}
    out = {name: directory / f"{name}.pte" for name in models}
    for name, model in models.items():
        to_pte(model, out[name], (torch.randn(2, *SHAPES[name]),), builder="reference", dynamic_shapes=(batch,),
               progress=False)
    return out


def measure(call: Callable[[int], None], concurrency: int, n: int) -> dict[str, float]:
    """requests/s, p50 and p99 (ms) of ``n`` calls from ``concurrency`` threads (after a warm-up)."""
    for i in range(min(20, n)):
        call(i)
    lat: list[float] = []
    lock = threading.Lock()

    def worker(k: int) -> None:
        mine = []
        for i in range(k, n, concurrency):
            t0 = time.perf_counter()
            call(i)
            mine.append(time.perf_counter() - t0)
        with lock:
            lat.extend(mine)

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(worker, range(concurrency)))
    return figures(lat, time.perf_counter() - start)


def figures(lat: list[float], wall: float) -> dict[str, float]:
    """requests/s and p50/p99 (ms) of latencies ``lat`` (seconds) measured over ``wall`` seconds."""
    ms = np.asarray(lat) * 1e3
    return {"rps": len(lat) / wall, "p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99))}


def direct(path: Path, x: np.ndarray, n: int) -> dict[int, dict[str, float]]:
    from pyrt.runtime.program import Program
    from pyrt.sim import simulated_gpus

    with simulated_gpus(1), Program(path, kernels=KERNELS) as prog:
        return {c: measure(lambda i: prog(x), c, n) for c in CONCURRENCY}


FASTAPI_APP = """
import os, sys, numpy as np, torch, uvicorn
from fastapi import FastAPI, Request, Response
from pyrt.runtime.program import Program
from pyrt.sim import simulated_gpus
torch.set_num_threads(1)
path, port, shape = sys.argv[1], int(sys.argv[2]), tuple(int(d) for d in sys.argv[3].split(","))
with simulated_gpus(1):
    prog = Program(path, kernels="torch")
    app = FastAPI()

    @app.post("/infer")
    def infer(body: bytes = __import__("fastapi").Body(..., media_type="application/octet-stream")) -> Response:
        x = np.frombuffer(body, np.float32).reshape(-1, *shape)
        return Response(np.ascontiguousarray(prog(x)).tobytes(), media_type="application/octet-stream")

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
"""


def _wait_http(url: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            requests.get(url, timeout=2)
            return
        except requests.ConnectionError:
            time.sleep(0.3)
    raise RuntimeError(f"{url} did not come up")


def measure_http(url: str, body: bytes, headers: dict[str, str], concurrency: int, n: int) -> dict[str, float]:
    """``measure`` for HTTP: ``n`` POSTs of ``body`` from ``concurrency`` keep-alive connections (after a warm-up).

    The clients are asyncio tasks on one aiohttp session in this process: on 2 shared cores, 32 threads of
    ``requests`` cost about 1 ms of CPU per request (half the machine), the cores the servers need.
    """
    import aiohttp

    async def go() -> dict[str, float]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
            async def call() -> None:
                async with session.post(url, data=body, headers=headers) as reply:
                    data = await reply.read()
                    if reply.status != 200:
                        raise RuntimeError(f"{url}: {reply.status} {data[:200]!r}")

            for _ in range(min(20, n)):
                await call()
            lat: list[float] = []

            async def worker(k: int) -> None:
                for _ in range(k, n, concurrency):
                    t0 = time.perf_counter()
                    await call()
                    lat.append(time.perf_counter() - t0)

            start = time.perf_counter()
            await asyncio.gather(*(worker(k) for k in range(concurrency)))
            return figures(lat, time.perf_counter() - start)

    return asyncio.run(go())


def fastapi(path: Path, name: str, x: np.ndarray, n: int, port: int) -> dict[int, dict[str, float]]:
    shape = ",".join(map(str, SHAPES[name]))
    proc = subprocess.Popen([sys.executable, "-c", FASTAPI_APP, str(path), str(port), shape], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        _wait_http(f"http://127.0.0.1:{port}/docs")
        url, headers = f"http://127.0.0.1:{port}/infer", {"Content-Type": "application/octet-stream"}
        return {c: measure_http(url, x.tobytes(), headers, c, n) for c in CONCURRENCY}
    finally:
        proc.terminate()
        proc.wait()


def kserve_body(x: np.ndarray) -> tuple[bytes, dict[str, str]]:
    import tritonclient.http as th

    inp = th.InferInput("input0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    body, size = th.InferenceServerClient.generate_request_body(
        [inp], outputs=[th.InferRequestedOutput("output0", binary_data=True)])
    return body, {"Inference-Header-Content-Length": str(size), "Content-Type": "application/octet-stream"}


def pyrt_serve(path: Path, name: str, x: np.ndarray, n: int, port: int, batch: int) -> dict[int, dict[str, float]]:

    from pyrt.serve.app import deployment, run
    from pyrt.serve.config import ServeConfig

    run(deployment(ServeConfig(str(path), name=name, max_batch_size=batch, batch_wait_ms=1.0, kernels=KERNELS),
                   simulated_gpus=1),
        path=str(path))
    return _measure_deployed(port, name, x, n, runs=True)


def ray_noop(port: int, x: np.ndarray, n: int) -> dict[int, dict[str, float]]:
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import Response

    @serve.deployment
    class Noop:
        async def __call__(self, request: Request) -> Response:
            await request.body()
            return Response(b"{}", media_type="application/json")

    # the same max_ongoing_requests as pyrt's replicas (Ray's default, 5, makes the router back off at 32 clients)
    serve.run(Noop.options(max_ongoing_requests=64).bind(), name="pyrt", route_prefix="/")  # type: ignore[attr-defined]
    return _measure_deployed(port, "noop", x, n)


def _measure_deployed(port: int, model: str, x: np.ndarray, n: int, *, runs: bool = False
                      ) -> dict[int, dict[str, float]]:
    """Infer requests of ``x`` to the deployed app "pyrt" at each concurrency; the app is deleted after.

    With ``runs``, also the replica's own mean run time during each measurement (``run_ms``), from the
    stats route's counts before and after it (a replica's first run, which converts weights, falls outside).
    """
    from ray import serve

    body, headers = kserve_body(x)
    base = f"http://127.0.0.1:{port}/v2/models/{model}"
    out: dict[int, dict[str, float]] = {}
    try:
        measure_http(f"{base}/infer", body, headers, 1, min(20, n))  # the first run (weights) outside the counts
        for c in CONCURRENCY:
            before = requests.get(f"{base}/stats", timeout=30).json() if runs else None
            out[c] = measure_http(f"{base}/infer", body, headers, c, n)
            if before is not None:
                after = requests.get(f"{base}/stats", timeout=30).json()
                count = sum(after["batch_rows"].values()) - sum(before["batch_rows"].values())
                out[c]["run_ms"] = (after["run_seconds"] - before["run_seconds"]) / max(count, 1) * 1e3
        return out
    finally:
        serve.delete("pyrt")


Results = dict[str, dict[str, dict[int, dict[str, float]]]]  # model -> server -> concurrency -> figures


def serve_rows(paths: dict[str, Path], xs: dict[str, np.ndarray], n: int, results: Results, *,
               ray_proxy: bool) -> None:
    """The Serve rows of every model, on a local Ray started as ``pyrt serve`` starts it (or with --ray-proxy)."""
    import ray
    from ray import serve

    from pyrt.serve.app import start
    from tests.fixtures.serve import free_port

    port = free_port()
    start(port=port, num_cpus=2, num_gpus=1, ray_proxy=ray_proxy)
    try:
        for name, path in paths.items():
            if ray_proxy:
                results[name]["serve (batch 32, ray proxy)"] = pyrt_serve(path, name, xs[name], n, port, MAX_ROWS)
                results[name]["ray serve no-op (ray proxy)"] = ray_noop(port, xs[name], n)
                continue
            results[name]["serve (batch 32)"] = pyrt_serve(path, name, xs[name], n, port, MAX_ROWS)
            results[name]["serve (no batching)"] = pyrt_serve(path, name, xs[name], n, port, 1)
            results[name]["ray serve no-op"] = ray_noop(port, xs[name], n)
    finally:
        serve.shutdown()
        ray.shutdown()


def summary(name: str, r: dict[str, dict[int, dict[str, float]]]) -> str:
    s, d, f = r["serve (batch 32)"], r["direct"], r["fastapi"]
    return (f"- {name}: p50 at concurrency 1, serve {s[1]['p50']:.2f} ms vs direct {d[1]['p50']:.2f} ms "
            f"(+{s[1]['p50'] - d[1]['p50']:.2f} ms; the replica's own runs meanwhile: {s[1]['run_ms']:.2f} ms; "
            "Ray proxy: "
            f"+{r['serve (batch 32, ray proxy)'][1]['p50'] - d[1]['p50']:.2f} ms); at concurrency 32 batching gives "
            f"{s[32]['rps'] / r['serve (no batching)'][32]['rps']:.2f}x the unbatched throughput and "
            f"{s[32]['rps'] / f[32]['rps']:.2f}x the FastAPI app's (Ray proxy: "
            f"{r['serve (batch 32, ray proxy)'][32]['rps'] / f[32]['rps']:.2f}x); Ray Serve's own floor (no-op "
            f"replica) is {r['ray serve no-op'][1]['p50']:.2f} ms p50 at concurrency 1 "
            f"({r['ray serve no-op (ray proxy)'][1]['p50']:.2f} ms through Ray's proxy)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=400, help="requests per measurement (default 400)")
    ap.add_argument("--no-write", action="store_true", help="do not update benchmarks/RESULTS.md")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from tests.fixtures.serve import free_port

    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        paths = export(Path(tmp))
        xs = {name: np.random.default_rng(0).standard_normal((1, *SHAPES[name])).astype(np.float32) for name in paths}
        results: Results = {name: {} for name in paths}
        for name, path in paths.items():  # the baselines first, with no Ray on the cores
            results[name]["direct"] = direct(path, xs[name], args.requests)
            results[name]["fastapi"] = fastapi(path, name, xs[name], args.requests, free_port())
        serve_rows(paths, xs, args.requests, results, ray_proxy=False)
        serve_rows(paths, xs, args.requests, results, ray_proxy=True)
    load.append(os.getloadavg()[0])
    rows_out = [[name, server, str(c), f"{r['rps']:.0f}", f"{r['p50']:.2f}", f"{r['p99']:.2f}",
                 f"{r['run_ms']:.2f}" if "run_ms" in r else "-"]
                for name, by_server in results.items() for server, by_c in by_server.items()
                for c, r in by_c.items()]
    table = markdown_table(["model", "server", "concurrency", "requests/s", "p50 ms", "p99 ms",
                            "replica's mean run ms"], rows_out)
    text = "\n".join([f"`{command_line()}` ({machine()}; one simulated GPU, reference engines; clients in the "
                      "same process, on the same cores; load average (1 min) at the start and end: "
                      f"{load[0]:.2f} / {load[1]:.2f})", "", table, "",
                      *(summary(name, r) for name, r in results.items())])
    print(text)
    if not args.no_write:
        write_results("bench_serve", "Serving", text)


if __name__ == "__main__":
    main()
