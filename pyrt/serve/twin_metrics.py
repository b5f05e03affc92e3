"""Each metric twice: a Ray metric (exported on each Ray node's Prometheus port) and a ``prometheus_client`` one in
the replica's own registry (``GET /metrics`` on the API port, :func:`exposition`).

:class:`Counter`, :class:`Gauge` and :class:`Histogram` take the calls Ray's metrics take
(``inc(n, tags=...)``, ``set``, ``observe``) and make them on both; the names are the same (Ray
adds its ``ray_`` prefix on its port; ``prometheus_client`` adds ``_total`` to a counter, as Ray
does). The registry holds one replica's counts: with several replicas, ``/metrics`` answers for the
replica that takes the request, and Ray's port sums them all.

>>> registry = CollectorRegistry()
>>> hits = Counter("pyrt_doc_hits", "hits", ("model",), registry)
>>> hits.inc(2, tags={"model": "m"})
>>> b'pyrt_doc_hits_total{model="m"} 2.0' in exposition(registry)
True
"""

from __future__ import annotations

from collections.abc import Sequence

import prometheus_client
from prometheus_client import CollectorRegistry
from ray.serve import metrics

CONTENT_TYPE = prometheus_client.CONTENT_TYPE_LATEST


class Counter:
    def __init__(self, name: str, description: str, tags: Sequence[str], registry: CollectorRegistry) -> None:
        self.ray = metrics.Counter(name, description, tag_keys=tuple(tags))  # type: ignore[arg-type]  # Ray's hint says tuple[str]
        self.prom = prometheus_client.Counter(name, description, list(tags), registry=registry)

    def inc(self, value: float = 1.0, tags: dict[str, str] | None = None) -> None:
        self.ray.inc(value, tags=tags or {})
        self.prom.labels(**(tags or {})).inc(value)


class Gauge:
    def __init__(self, name: str, description: str, tags: Sequence[str], registry: CollectorRegistry) -> None:
        self.ray = metrics.Gauge(name, description, tag_keys=tuple(tags))  # type: ignore[arg-type]  # Ray's hint says tuple[str]
        self.prom = prometheus_client.Gauge(name, description, list(tags), registry=registry)

    def set(self, value: float, tags: dict[str, str] | None = None) -> None:
        self.ray.set(value, tags=tags or {})
        self.prom.labels(**(tags or {})).set(value)


class Histogram:
    def __init__(self, name: str, description: str, boundaries: Sequence[float], tags: Sequence[str],
                 registry: CollectorRegistry) -> None:
        self.ray = metrics.Histogram(name, description, boundaries=list(boundaries), tag_keys=tuple(tags))  # type: ignore[arg-type]  # Ray's hint says tuple[str]
        self.prom = prometheus_client.Histogram(name, description, list(tags), registry=registry,
                                                buckets=[*boundaries, float("inf")])

    def observe(self, value: float, tags: dict[str, str] | None = None) -> None:
        self.ray.observe(value, tags=tags or {})
        self.prom.labels(**(tags or {})).observe(value)


def exposition(registry: CollectorRegistry) -> bytes:
    """The registry in Prometheus' text format."""
    out: bytes = prometheus_client.generate_latest(registry)
    return out


__all__ = ["CollectorRegistry", "Counter", "Gauge", "Histogram", "exposition", "CONTENT_TYPE"]
