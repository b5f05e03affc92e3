"""Generation metrics of one replica: Ray metrics (handed over with :class:`pyrt.serve.metrics.ServeMetrics`'
once-a-second flush) and the ``generation`` part of ``GET /v2/models/NAME/stats``.

Per model (names carry Ray's ``ray_`` prefix on the Prometheus endpoint):

- ``pyrt_serve_time_to_first_token_seconds``: histogram, a generation request's arrival to its
  first new token (queueing for a slot and prefill included);
- ``pyrt_serve_inter_token_latency_seconds``: histogram, the time between consecutive new tokens
  of one generation (one step of the engine, shared by every running sequence);
- ``pyrt_serve_queued_generations`` / ``pyrt_serve_running_generations``: gauges, generations
  waiting for a KV-cache slot / holding one, at the last flush;
- ``pyrt_serve_batch_occupancy``: histogram, sequences in each engine step (up to the file's
  ``max_batch_size``: how full the batch was);
- ``pyrt_serve_generated_tokens_total`` / ``pyrt_serve_prompt_tokens_total``: counters, new
  tokens sampled and prompt tokens prefilled;
- prefix caching: ``pyrt_serve_prefix_cache_queries_total`` / ``pyrt_serve_prefix_cache_hits_total``
  (counters, vLLM's ``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits`` in pyrt's spelling: Ray
  refuses ``:`` in a metric name): prompt tokens of generations that looked for a cached prefix, and
  those found in a KV-cache slot (not prefilled);
- speculative decoding (``pyrt serve --draft``): ``pyrt_serve_drafted_tokens_total`` /
  ``pyrt_serve_accepted_tokens_total`` (counters: guessed tokens checked / kept) and the gauges
  ``pyrt_serve_draft_acceptance_rate`` (accepted / drafted, since the replica started) and
  ``pyrt_serve_tokens_per_pass`` (generated tokens per sequence per target pass: 1.0 without a draft).

The stats route gives the engine's counters at once, with the median and 99th percentile of the
last :data:`WINDOW` samples of each latency.
"""

from __future__ import annotations

import threading
from collections import Counter as Tally
from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np

from pyrt.serve.twin_metrics import CollectorRegistry, Counter, Gauge, Histogram

TOKEN_BOUNDARIES = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0]
OCCUPANCY_BOUNDARIES = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0]
WINDOW = 4096  # latency samples kept per model for the stats route's percentiles


class GenerationMetrics:
    """Latency samples as generations end, and the engines' counters read at each flush."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        tags, reg = ("model",), registry if registry is not None else CollectorRegistry()
        self.ttft = Histogram("pyrt_serve_time_to_first_token_seconds", "a generation request's arrival to its "
                              "first new token", TOKEN_BOUNDARIES, tags, reg)
        self.itl = Histogram("pyrt_serve_inter_token_latency_seconds", "time between consecutive new tokens of one "
                             "generation", TOKEN_BOUNDARIES, tags, reg)
        self.queued = Gauge("pyrt_serve_queued_generations", "generations waiting for a KV-cache slot", tags, reg)
        self.running = Gauge("pyrt_serve_running_generations", "generations holding a KV-cache slot", tags, reg)
        self.occupancy = Histogram("pyrt_serve_batch_occupancy", "sequences in each generation step",
                                   OCCUPANCY_BOUNDARIES, tags, reg)
        self.generated = Counter("pyrt_serve_generated_tokens", "new tokens generated", tags, reg)
        self.prompt = Counter("pyrt_serve_prompt_tokens", "prompt tokens prefilled", tags, reg)
        self.queries = Counter("pyrt_serve_prefix_cache_queries", "prompt tokens of generations that looked for a "
                               "cached prefix", tags, reg)
        self.hits = Counter("pyrt_serve_prefix_cache_hits", "prompt tokens found in a KV-cache slot (not prefilled)",
                            tags, reg)
        self.drafted = Counter("pyrt_serve_drafted_tokens", "guessed tokens checked (speculative decoding)", tags, reg)
        self.accepted = Counter("pyrt_serve_accepted_tokens", "guessed tokens kept (speculative decoding)", tags, reg)
        self.acceptance = Gauge("pyrt_serve_draft_acceptance_rate", "accepted / drafted guessed tokens", tags, reg)
        self.per_pass = Gauge("pyrt_serve_tokens_per_pass", "generated tokens per sequence per target pass", tags, reg)
        self._lock = threading.Lock()
        self._pending: list[tuple[str, float | None, list[float]]] = []  # not yet handed to Ray
        self._ttft: dict[str, deque[float]] = {}
        self._itl: dict[str, deque[float]] = {}
        self._done: dict[str, dict[str, int]] = {}  # engine counters already handed over
        self._steps: dict[str, Tally[int]] = {}  # occupancy already handed over

    def finished(self, model: str, ttft_s: float | None, gaps_s: list[float]) -> None:
        """A generation ended: its time to first token (None: it had none) and inter-token gaps."""
        with self._lock:
            self._pending.append((model, ttft_s, gaps_s))
            if ttft_s is not None:
                self._ttft.setdefault(model, deque(maxlen=WINDOW)).append(ttft_s)
            self._itl.setdefault(model, deque(maxlen=WINDOW)).extend(gaps_s)

    def flush(self, engines: Mapping[str, Any]) -> None:
        """Hand Ray what changed: latency samples, the engines' token and step counters, the gauges."""
        with self._lock:
            pending, self._pending = self._pending, []
        for model, ttft_s, gaps in pending:
            tags = {"model": model}
            if ttft_s is not None:
                self.ttft.observe(ttft_s, tags=tags)
            for gap in gaps:
                self.itl.observe(gap, tags=tags)
        for model, host in engines.items():
            self._flush_engine(model, host.stats())

    def _flush_engine(self, model: str, stats: dict[str, Any]) -> None:
        tags = {"model": model}
        self.queued.set(stats["queued"], tags=tags)
        self.running.set(stats["running"], tags=tags)
        self.acceptance.set(stats["acceptance_rate"], tags=tags)
        self.per_pass.set(stats["tokens_per_pass"], tags=tags)
        done = self._done.setdefault(model, {})
        counters = {"tokens_generated": self.generated, "prompt_tokens": self.prompt, "drafted": self.drafted,
                    "accepted": self.accepted, "prefix_cache_queries": self.queries, "prefix_cache_hits": self.hits}
        for key, counter in counters.items():  # incremented by what changed since the last flush
            if stats[key] > done.get(key, 0):
                counter.inc(stats[key] - done.get(key, 0), tags=tags)
            done[key] = stats[key]
        occupancy = Tally({int(k): v for k, v in stats["occupancy"].items()})
        for size, count in (occupancy - self._steps.get(model, Tally())).items():
            for _ in range(count):
                self.occupancy.observe(size, tags=tags)
        self._steps[model] = occupancy

    def stats(self, model: str, host: Any) -> dict[str, Any]:
        """The stats route's ``generation`` object: the engine's counters and recent latency percentiles."""
        with self._lock:
            ttft, itl = list(self._ttft.get(model, ())), list(self._itl.get(model, ()))
        return {**host.stats(), "time_to_first_token_ms": _summary(ttft), "inter_token_latency_ms": _summary(itl)}


def _summary(samples: list[float]) -> dict[str, Any]:
    if not samples:
        return {"count": 0, "p50": None, "p99": None}
    p50, p99 = np.percentile(np.asarray(samples) * 1e3, [50, 99])
    return {"count": len(samples), "p50": round(float(p50), 3), "p99": round(float(p99), 3)}
