"""pyrt's per-model serving metrics, on the Prometheus endpoint Ray exposes, and kept per replica.

Ray Serve exports these with its own (``ray_serve_*``) on each node's metrics
port (``ray.init(_metrics_export_port=P)``, then ``http://HOST:P/metrics``),
tagged with the deployment and replica; names there carry Ray's ``ray_``
prefix:

- ``pyrt_serve_requests_total{model}``: infer and generation requests answered (any status);
- ``pyrt_serve_errors_total{model, error}``: failed ones by class (``InputError``,
  ``RequestTooLarge``, ``ExecutionError``, ``BusyError``, ...);
- ``pyrt_serve_batch_rows{model}``: histogram of the rows in each run (1: unbatched);
- ``pyrt_serve_run_seconds{model}``: histogram of each run's wall time;
- ``pyrt_serve_weight_streaming_budget_bytes{model, engine, device}``: each engine's
  applied weight-streaming budget, as TensorRT reads it back (set again at every flush:
  Ray 2.60 drops a gauge that was not set within two of its export intervals, about 20 s).

The same counts, for the replica that answers, come from ``GET /v2/models/{name}/stats``
(:meth:`ServeMetrics.stats`). Requests count there at once; Ray's metrics get them from a
thread that hands over what changed every ``FLUSH_S`` (Ray's own export to Prometheus runs every
few seconds anyway): a Ray metric call releases the GIL, and on the replica's event loop, with
its run thread busy, each one waited its turn for the GIL again (6% of the loop at 32 clients).
The generation metrics (:mod:`pyrt.serve.llm_metrics`) are handed over by the same flush.
"""

from __future__ import annotations

import os
import threading
from collections import Counter as Tally
from collections.abc import Callable
from typing import Any

import ray

from pyrt.serve.twin_metrics import CollectorRegistry, Counter, Gauge, Histogram

BATCH_BOUNDARIES = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0]
FLUSH_S = 1.0
PENDING_RUNS = 4096  # runs kept for the next flush before the caller flushes itself
RUN_BOUNDARIES = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0]


class ServeMetrics:
    """Counters of one replica: exported to Ray's metrics and kept for the stats route."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()  # this replica's, for GET /metrics (pyrt.serve.twin_metrics)
        model, registry = ("model",), self.registry
        self.requests = Counter("pyrt_serve_requests", "infer and generation requests answered", model, registry)
        self.errors = Counter("pyrt_serve_errors", "failed requests by class", ("model", "error"), registry)
        self.rows = Histogram("pyrt_serve_batch_rows", "rows in each run of a method", BATCH_BOUNDARIES, model,
                              registry)
        self.seconds = Histogram("pyrt_serve_run_seconds", "wall time of each run", RUN_BOUNDARIES, model, registry)
        self.budget = Gauge("pyrt_serve_weight_streaming_budget_bytes", "applied weight-streaming budget per engine",
                            ("model", "engine", "device"), registry)
        self._lock = threading.Lock()
        self._requests: Tally[str] = Tally()
        self._errors: Tally[tuple[str, str]] = Tally()
        self._batches: dict[str, Tally[int]] = {}
        self._run_s: dict[str, float] = {}  # each model's run seconds, summed
        self._inline: Tally[str] = Tally()
        self._budgets: dict[str, list[dict[str, Any]]] = {}
        self._budget_gauges: dict[tuple[str, str, str], int] = {}  # (model, engine, device) -> bytes, set each flush
        self._exported: tuple[Tally[str], Tally[tuple[str, str]]] = (Tally(), Tally())
        self._runs: list[tuple[str, int, float]] = []  # (model, rows, seconds) not yet handed to Ray
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        self.hooks: list[Callable[[], None]] = []  # more hand-overs run by each flush (generation metrics)

    def request(self, model: str) -> None:
        with self._lock:
            self._requests[model] += 1

    def error(self, model: str, kind: str) -> None:
        with self._lock:
            self._errors[model, kind] += 1

    def run(self, model: str, rows: int, seconds: float) -> None:
        with self._lock:
            self._batches.setdefault(model, Tally())[rows] += 1
            self._run_s[model] = self._run_s.get(model, 0.0) + seconds
            self._runs.append((model, rows, seconds))
            full = len(self._runs) >= PENDING_RUNS
        if full:
            self.flush()

    def start(self, every_s: float = FLUSH_S) -> None:
        """Hand the counts to Ray's metrics every ``every_s`` from a daemon thread (until :meth:`stop`)."""
        def loop() -> None:
            while not self._stop.wait(every_s):
                self.flush()
        self._flusher = threading.Thread(target=loop, name="pyrt-metrics", daemon=True)
        self._flusher.start()

    def stop(self) -> None:
        """Stop the flushing thread, then flush what is left."""
        self._stop.set()
        if self._flusher is not None:
            self._flusher.join()
        self.flush()

    def flush(self) -> None:
        """Hand Ray's metrics what changed since the last flush."""
        done_requests, done_errors = self._exported
        with self._lock:
            requests = self._requests - done_requests
            errors = self._errors - done_errors
            runs, self._runs = self._runs, []
            done_requests.update(requests)
            done_errors.update(errors)
        for model, n in requests.items():
            self.requests.inc(n, tags={"model": model})
        for (model, kind), n in errors.items():
            self.errors.inc(n, tags={"model": model, "error": kind})
        for model, rows, seconds in runs:
            self.rows.observe(rows, tags={"model": model})
            self.seconds.observe(seconds, tags={"model": model})
        for (model, engine, device), budget in list(self._budget_gauges.items()):
            self.budget.set(budget, tags={"model": model, "engine": engine, "device": device})
        for hook in self.hooks:
            hook()

    def inline(self, model: str) -> None:
        """A run of ``model`` on the replica's event loop (an idle replica, a short run)."""
        with self._lock:
            self._inline[model] += 1

    def budgets(self, model: str, engines: list[Any]) -> None:
        """Record each engine's applied budget (``Program.weight_streaming`` entries)."""
        rows = []
        for w in engines:
            if w.budget is not None:
                self._budget_gauges[model, str(w.index), str(w.device)] = w.budget
                self.budget.set(w.budget, tags={"model": model, "engine": str(w.index), "device": str(w.device)})
            rows.append({"engine": w.index, "device": w.device, "budget": w.budget, "source": w.source,
                         "streamable_bytes": w.streamable_bytes})
        self._budgets[model] = rows

    def stats(self, model: str) -> dict[str, Any]:
        """This replica's counts for ``model`` (and its process id): requests, errors by class, runs by rows,
        the runs' seconds summed, engine budgets."""
        with self._lock:
            return {
                "name": model,
                "pid": os.getpid(),
                "requests": self._requests[model],
                "errors": {k: n for (m, k), n in self._errors.items() if m == model},
                "batch_rows": {str(r): n for r, n in sorted(self._batches.get(model, Tally()).items())},
                "run_seconds": self._run_s.get(model, 0.0),
                "runs_on_event_loop": self._inline[model],
                "weight_streaming": self._budgets.get(model, []),
            }


def process_stats() -> dict[str, Any]:
    """Where this replica runs and what it holds: its Ray node id ("" outside Ray), resident memory, open files."""
    node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
    rss = 0
    try:
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        fds = len(os.listdir("/proc/self/fd"))
    except OSError:  # no /proc (not Linux)
        fds = -1
    return {"node_id": node, "rss_bytes": rss, "open_fds": fds}
