"""Soak: ``pyrt serve`` under steady mixed traffic for minutes; per window: requests, errors, latency, replica memory.

Two programs on one local Ray (HAProxy -> replicas, as ``pyrt serve`` starts it), two replicas each, on
simulated GPUs: ``dyn.pte`` (tests/fixtures/serve.py: Linear-ReLU-Linear, batch 1..32) at ``/``, and a
GPT-2-style decoder exported with ``pyrt.export.decoder_to_pte(..., builder="reference")`` at ``/llm`` (it
follows pyrt.llm's convention, so it has ``/generate``). Four client threads send ``--rate`` requests/s in all:
60% infer (tritonclient binary, tritonclient JSON, plain JSON), 25% bad requests (bad JSON, wrong datatype,
a shape past the bounds, a lying binary size, JSON nested 100,000 deep, an unknown model: 4xx expected),
15% generate (8 greedy tokens, compared with eager PyTorch's). Every answer is checked. Each window records
requests, errors by class, p50/p99 latency of the valid requests, and each replica's RSS and open file
descriptors (from its stats route).

``--check`` exits 1 unless: no valid request failed and every bad one got a 4xx; after warm-up (the first window,
and the empty windows after it, while the clients still wait on warm-up's slow answers), each replica's RSS and
descriptors grew less than 5%; the last window's p50 is under 3 times the first's after warm-up (no drift); the
same replicas served throughout.

    python benchmarks/soak_serve.py --minutes 10 [--rate 10] [--window-s 60] [--check] [--no-write]
"""


import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import numpy as np  # noqa: E402
import requests  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.fixtures
from _common import command_line, machine, markdown_table, write_results  # noqa: E402

THREADS = 4
NEW_TOKENS = 8
GROWTH = 0.05  # what "flat" allows after warm-up
DRIFT = 3.0  # the last window's p50 against the first's after warm-up
DEEP = b"[" * 100_000 + b"]" * 100_000


def prepare(directory: Path) -> dict[str, Any]:
    """The two programs (exported into ``directory``) and what their answers must be."""
    from tests.fixtures import llm_models
    from tests.fixtures.serve import build

    dyn = build(directory)["dyn"]
    gpt2 = llm_models.Exported("gpt2", directory / "gpt2.pte", "reference")
    return {"dyn": dyn, "gpt2": gpt2.path, "tokens": gpt2.want[:NEW_TOKENS], "prompt": llm_models.PROMPT}


def serve(files: dict[str, Any], port: int) -> None:
    """A local Ray as ``pyrt serve`` starts it, serving both programs with two replicas each."""
    from pyrt.serve.app import deployment, run, start
    from pyrt.serve.config import ServeConfig
    from pyrt.serve.lifetime import owner_token

    start(port=port, num_cpus=2, num_gpus=4, owner=owner_token())  # its processes ended by stop() at the end
    for name, path, prefix in (("dyn", files["dyn"], "/"), ("gpt2", files["gpt2"], "/llm")):
        cfg = ServeConfig(str(path), name=name, app_name=name, replicas=REPLICAS, kernels="numpy",
                          cpus_per_replica=0.25)
        run(deployment(cfg, simulated_gpus=1), app_name=name, path=str(path), route_prefix=prefix)


def _direct(path: Path, xs: list[np.ndarray]) -> list[np.ndarray]:
    from pyrt.runtime.program import Program
    from pyrt.sim import simulated_gpus

    with simulated_gpus(1), Program(path, kernels="numpy") as prog:
        return [np.asarray(prog(x)) for x in xs]


class Traffic:
    """The clients: each request's (time sent, kind, class of outcome, latency s); the outcome checked."""

    def __init__(self, base: str, files: dict[str, Any], rate: float, until: float) -> None:
        from pyrt.serve.batching import ATOL, RTOL

        self.base, self.files, self.rate, self.until = base, files, rate, until
        self.tol = {"rtol": RTOL, "atol": ATOL}
        rng = np.random.default_rng(7)
        self.xs = [rng.standard_normal((int(rng.integers(1, 5)), 8)).astype(np.float32) for _ in range(16)]
        self.want = _direct(files["dyn"], self.xs)
        self.records: list[tuple[float, str, str, float]] = []
        self.lock = threading.Lock()

    def run(self) -> None:
        threads = [threading.Thread(target=self._loop, args=(k,), daemon=True) for k in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _loop(self, k: int) -> None:
        import tritonclient.http as th

        client = th.InferenceServerClient(self.base.removeprefix("http://"), network_timeout=60.0)
        session = requests.Session()
        rnd = random.Random(k)
        period, i = THREADS / self.rate, k
        while time.time() < self.until:  # bounded: one request per period until the end
            sent = time.time()
            pick = rnd.random()
            kind = "infer" if pick < 0.6 else "bad" if pick < 0.85 else "generate"
            try:
                outcome = getattr(self, "_" + kind)(client, session, i)
            except Exception as exc:  # a connection error: recorded, the loop goes on
                outcome = f"error:{type(exc).__name__}"
            with self.lock:
                self.records.append((sent, kind, outcome, time.time() - sent))
            i += THREADS
            time.sleep(max(0.0, sent + period - time.time()))

    def _infer(self, client: Any, session: Any, i: int) -> str:
        import tritonclient.http as th

        x, want = self.xs[i % len(self.xs)], self.want[i % len(self.xs)]
        if i % 3 == 2:
            body = {"inputs": [{"name": "input0", "datatype": "FP32", "shape": list(x.shape),
                                "data": x.ravel().tolist()}]}
            reply = session.post(f"{self.base}/v2/models/dyn/infer", json=body, timeout=60)
            if reply.status_code != 200:
                return f"error:{reply.status_code}"
            out = reply.json()["outputs"][0]
            got = np.asarray(out["data"], np.float32).reshape(out["shape"])
        else:
            inp = th.InferInput("input0", list(x.shape), "FP32")
            inp.set_data_from_numpy(x, binary_data=i % 3 == 0)
            got = client.infer("dyn", [inp]).as_numpy("output0")
        return "ok" if got.shape == want.shape and np.allclose(got, want, **self.tol) else "error:wrong"

    def _bad(self, client: Any, session: Any, i: int) -> str:
        x = {"name": "input0", "datatype": "FP32", "shape": [1, 8], "data": [0.5] * 8}
        cases: list[tuple[str, bytes, dict[str, str]]] = [
            ("dyn", b"{oops", {}),
            ("dyn", json.dumps({"inputs": [{**x, "datatype": "INT64"}]}).encode(), {}),
            ("dyn", json.dumps({"inputs": [{**x, "shape": [64, 8], "data": [0.5] * 512}]}).encode(), {}),
            ("dyn", DEEP, {}),
            ("nope", json.dumps({"inputs": [x]}).encode(), {}),
        ]
        head = json.dumps({"inputs": [{**x, "data": None, "parameters": {"binary_data_size": 99}}]}).encode()
        cases.append(("dyn", head + bytes(32), {"Inference-Header-Content-Length": str(len(head))}))
        model, body, headers = cases[i % len(cases)]
        reply = session.post(f"{self.base}/v2/models/{model}/infer", data=body, headers=headers, timeout=60)
        return "rejected" if 400 <= reply.status_code < 500 else f"error:{reply.status_code}"

    def _generate(self, client: Any, session: Any, i: int) -> str:
        body = {"input_ids": self.files["prompt"], "parameters": {"max_tokens": NEW_TOKENS, "eos_ids": []}}
        reply = session.post(f"{self.base}/llm/v2/models/gpt2/generate", json=body, timeout=120)
        if reply.status_code != 200:
            return f"error:{reply.status_code}"
        return "ok" if reply.json()["token_ids"] == self.files["tokens"] else "error:wrong-tokens"


REPLICAS = 2  # of each model (the soak's two deployments)


def replicas(base: str) -> dict[str, dict[str, int]]:
    """Each replica's pid -> its RSS and open descriptors (stats asked until both replicas of each answered)."""
    seen: dict[str, dict[str, int]] = {}
    for path in ("/v2/models/dyn/stats", "/llm/v2/models/gpt2/stats"):
        found: dict[str, dict[str, int]] = {}
        for _ in range(24):
            s = requests.get(base + path, timeout=30).json()
            found[f"{path.split('/')[-2]}:{s['pid']}"] = {"rss": s["rss_bytes"], "fds": s["open_fds"]}
            if len(found) == 2:
                break
        seen.update(found)
    return seen


def windows(records: list[tuple[float, str, str, float]], samples: list[tuple[float, dict[str, Any]]],
            start: float, window_s: float) -> list[dict[str, Any]]:
    """One summary per window: requests, outcomes, valid p50/p99, the replicas' memory at its end."""
    out = []
    for w, (at, reps) in enumerate(samples):
        mine = [r for r in records if start + w * window_s <= r[0] < start + (w + 1) * window_s]
        valid = sorted(lat for _, kind, outcome, lat in mine if kind != "bad" and outcome == "ok")
        out.append({"window": w + 1, "requests": len(mine), "outcomes": dict(Counter(o for _, _, o, _ in mine)),
                    "p50_ms": 1000 * float(np.percentile(valid, 50)) if valid else float("nan"),
                    "p99_ms": 1000 * float(np.percentile(valid, 99)) if valid else float("nan"),
                    "replicas": reps, "at": at})
    return out


def problems(rows: list[dict[str, Any]]) -> list[str]:
    """What the soak must not show (see the module docstring)."""
    found = []
    for row in rows:
        bad = {k: n for k, n in row["outcomes"].items() if k.startswith("error")}
        if bad:
            found.append(f"window {row['window']}: failed requests {bad}")
    if len(rows) < 3:
        return found + [f"{len(rows)} windows: too few to tell warm-up from drift"]
    # Warm-up is the first window, and any empty windows after it: clients still waiting on warm-up's slow
    # answers send nothing (a window with no valid answer has no p50 to compare with).
    base = next((row for row in rows[1:-1] if row["p50_ms"] == row["p50_ms"]), None)
    last = rows[-1]
    if base is None:
        return found + [f"no valid request answered in windows 2-{len(rows) - 1}: nothing after warm-up to "
                        "compare with"]
    # A replica that restarted shows as a model with more pids after warm-up than it has replicas. A window that
    # did not see one of them is not a change: its stats requests were all routed to the other replica (Ray Serve
    # picks the less busy one, and a generating replica stays busy).
    after = [pid for row in rows[base["window"] - 1:] for pid in row["replicas"]]
    for model in sorted({pid.split(":")[0] for pid in after}):
        pids = sorted({pid for pid in after if pid.split(":")[0] == model})
        if len(pids) > REPLICAS:
            found.append(f"replicas changed: {model} had {len(pids)} pids after warm-up ({', '.join(pids)}), "
                         f"{REPLICAS} replicas")
    for rep in sorted(set(base["replicas"]) & set(last["replicas"])):
        for key in ("rss", "fds"):
            was = base["replicas"][rep][key]
            now = max(r["replicas"].get(rep, {}).get(key, 0) for r in rows[base["window"] - 1:])
            if now > was * (1 + GROWTH):
                found.append(f"replica {rep}: {key} grew from {was} to {now} after warm-up")
    if not last["p50_ms"] < DRIFT * base["p50_ms"]:
        found.append(f"p50 drifted from {base['p50_ms']:.1f} ms to {last['p50_ms']:.1f} ms")
    return found


def table(rows: list[dict[str, Any]]) -> str:
    reps = sorted(rows[0]["replicas"]) if rows else []
    head = ["window", "requests", "ok", "4xx (bad)", "errors", "p50 ms", "p99 ms",
            *[f"{r} RSS MiB / fds" for r in reps]]
    body = []
    for row in rows:
        o = row["outcomes"]
        errors = sum(n for k, n in o.items() if k.startswith("error"))
        body.append([str(row["window"]), str(row["requests"]), str(o.get("ok", 0)), str(o.get("rejected", 0)),
                     str(errors), f"{row['p50_ms']:.1f}", f"{row['p99_ms']:.1f}",
                     *[f"{row['replicas'].get(r, {}).get('rss', 0) / 2**20:.1f} / "
                       f"{row['replicas'].get(r, {}).get('fds', 0)}" for r in reps]])
    return markdown_table(head, body)


def stop() -> None:
    """As ``pyrt serve`` stops: Serve and Ray shut down, then whatever of this process's Ray is left ended."""
    import ray
    from ray import serve as ray_serve

    from pyrt.serve import lifetime

    lifetime.shutdown(ray_serve.shutdown, ray.shutdown, lifetime.owner_token(), 60, print)


def soak(minutes: float, rate: float, window_s: float) -> list[dict[str, Any]]:
    from tests.fixtures.serve import free_port

    with tempfile.TemporaryDirectory(prefix="pyrt-soak-") as tmp:
        files = prepare(Path(tmp))
        port = free_port()
        serve(files, port)
        base = f"http://127.0.0.1:{port}"
        try:
            start = time.time()
            traffic = Traffic(base, files, rate, start + minutes * 60)
            clients = threading.Thread(target=traffic.run, daemon=True)
            clients.start()
            samples = []
            for w in range(int(round(minutes * 60 / window_s))):  # bounded: one sample per window
                time.sleep(max(0.0, start + (w + 1) * window_s - time.time()))
                samples.append((time.time(), replicas(base)))
            clients.join(120)
            return windows(traffic.records, samples, start, window_s)
        finally:
            stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--rate", type=float, default=10.0, help="requests per second, all clients together")
    p.add_argument("--window-s", type=float, default=60.0)
    p.add_argument("--check", action="store_true", help="exit 1 when a problem is found")
    p.add_argument("--no-write", action="store_true", help="leave benchmarks/RESULTS.md as it is")
    args = p.parse_args()
    rows = soak(args.minutes, args.rate, args.window_s)
    found = problems(rows)
    text = (f"### Soak: {args.minutes:g} min of mixed traffic at {args.rate:g} requests/s, 2 + 2 replicas\n\n"
            f"`{command_line()}` ({machine()}); windows of {args.window_s:g} s; the first is warm-up.\n\n"
            f"{table(rows)}\n\n" + ("Problems: " + "; ".join(found) if found else
                                    "No failed request; RSS and descriptors flat after warm-up; no latency drift."))
    print(text)
    print(json.dumps({"problems": found}))
    if not args.no_write:
        write_results("soak_serve", "Serving", text)
    return 1 if args.check and found else 0


if __name__ == "__main__":
    sys.exit(main())
