"""Build and start a served program: :func:`deployment` returns the Ray Serve application.

>>> from ray import serve                                            # doctest: +SKIP
>>> app = deployment(ServeConfig("model.pte", replicas=2, budget="50%"))  # doctest: +SKIP
>>> start(port=8000); serve.run(app, name="pyrt", route_prefix="/")  # doctest: +SKIP

The file is opened and checked where the application is built, so a file that
is not a valid program is a :class:`pyrt.errors.PteFormatError` naming it
before anything is deployed; a replica that fails to load its Program fails the
deployment (:func:`run` raises a :class:`pyrt.errors.PyrtError` naming the file)
instead of restarting forever.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import shutil
import tempfile
import time
from functools import partial
from typing import Any

import ray
from ray import serve
from ray.serve import Application
from ray.serve.config import BackpressureConfig

from pyrt.errors import PyrtError
from pyrt.pte_reader import PteFile
from pyrt.serve import ingress, lifetime
from pyrt.serve.config import LOOPBACK_HOSTS, RAY_LOOPBACK_ENV, ServeConfig
from pyrt.serve.limits import RETRY_AFTER_S
from pyrt.serve.protocol import models_of
from pyrt.serve.replica import Devices, PyrtReplica
from pyrt.sim import gpus_from_environment, simulated_devices

PROXY_WAIT_S = 180.0  # beyond serve.start's own 60 s
log = logging.getLogger("pyrt.serve")

GRACEFUL_SHUTDOWN_S = 30.0


def _check(cfg: ServeConfig) -> bool:
    """Open the file as every replica will (typed errors name it); True when it has delegates."""
    with PteFile.open(cfg.path) as pte:
        models_of(pte, cfg.name)
        return any(plan.delegates for plan in pte.program.execution_plan)


def deployment(cfg: ServeConfig, *, simulated_gpus: int | None = None) -> Application:
    """The Ray Serve application serving ``cfg.path``: ``cfg.replicas`` copies, each its own Program.

    Each replica asks Ray for ``cfg.gpus_per_replica`` GPUs (None: 1 when the program has TensorRT
    delegates, else 0) and ``cfg.cpus_per_replica`` CPUs, and loads the Program on them with
    ``cfg.budget`` (resolved for that replica's engines: "50%", bytes, "auto"). ``simulated_gpus``
    (default: ``$PYRT_SIMULATED_GPUS``) runs each replica on simulated GPUs instead. Ray Serve's own
    queue limit follows ``cfg.max_queued_requests`` (:func:`_backpressure`).
    """
    sim = simulated_gpus if simulated_gpus is not None else simulated_from_env()
    has_delegates = _check(cfg)
    gpus = cfg.gpus_per_replica if cfg.gpus_per_replica is not None else (1.0 if has_delegates else 0.0)
    # the replica takes every request up to its own limits (infer: 503 past max_queued_requests; generations
    # beyond the KV-cache slots: 429), so Ray hands it more than those limits let wait
    ongoing = max(64, 2 * cfg.max_batch_size, (cfg.max_queued_requests or 0) + 64)
    return PyrtReplica.options(  # type: ignore[attr-defined]
        name="pyrt-" + re.sub(r"[^A-Za-z0-9_.-]", "-", cfg.name), num_replicas=cfg.replicas,
        ray_actor_options={"num_gpus": gpus, "num_cpus": cfg.cpus_per_replica},
        max_ongoing_requests=ongoing, graceful_shutdown_timeout_s=GRACEFUL_SHUTDOWN_S,
        health_check_period_s=2.0, **_backpressure(cfg, ongoing),
    ).bind(cfg, devices_of(sim, gpus))


def simulated_from_env() -> int | None:
    """``$PYRT_SIMULATED_GPUS`` as a count (None when unset); InputError naming a bad value."""
    return gpus_from_environment()


def devices_of(simulated_gpus: int | None, gpus_per_replica: float) -> Devices | None:
    """What makes a replica's devices: ``simulated_gpus`` simulated GPUs (as many as ``gpus_per_replica`` when
    that is a whole number of at least one), or None: the GPUs Ray assigns the replica.

    >>> devices_of(None, 1.0), devices_of(2, 0.0).args, devices_of(2, 1.0).args
    (None, (2,), (1,))
    """
    if simulated_gpus is None:
        return None
    return partial(simulated_devices, int(gpus_per_replica) or simulated_gpus)


def _backpressure(cfg: ServeConfig, ongoing: int) -> dict[str, Any]:
    """Ray Serve's own queue limit, a backstop for the requests it holds before a replica takes them: 503 with
    Retry-After.

    The replica's own limit (``max_queued_requests``) is the one clients meet. Ray's counts a request
    as queued from its arrival until it holds one of the replica's ``max_ongoing_requests`` places,
    yielding in between, so a burst that finds free places can still be counted over a small limit
    (Ray 2.60 says so in ``_can_accept_request``; seen: a burst of 16 on a limit of 2 with 66 places
    free refused with Ray's text). Ray's limit is therefore ``ongoing`` (as many again as the replica
    takes), never below the replica's.
    """
    if cfg.max_queued_requests is None:
        return {}
    return {"max_queued_requests": max(ongoing, cfg.max_queued_requests),
            "backpressure_config": BackpressureConfig(status_code=503, retry_after_s=RETRY_AFTER_S)}


def start(*, address: str | None = None, host: str = "127.0.0.1", port: int = 8000, num_cpus: int | None = None,
          num_gpus: int | None = None, metrics_port: int | None = None, ray_proxy: bool = False,
          owner: str | None = None, read_timeout_s: float | None = None, request_timeout_s: float | None = None,
          verbose: bool = False) -> str:
    """Start (or join, with ``address``: "auto" or "ray://HOST:PORT") Ray, then Serve's HTTP ingress on ``port``.

    A Ray started here serves HTTP through HAProxy straight to the replicas (:mod:`pyrt.serve.ingress`,
    which gives clients ``read_timeout_s`` to send their headers and waits for a replica a little
    longer than ``request_timeout_s``), or through Ray Serve's proxy actor
    with ``ray_proxy``; a joined cluster keeps its own setting. Every process of a Ray started here
    carries ``owner`` (:mod:`pyrt.serve.lifetime`; default: this process), and a start whose node timed out
    in Ray's fixed 30 s (a loaded machine) is ended and made again (:func:`pyrt.serve.lifetime.start_ray`).
    Ray's and Serve's own lines below ERROR show only when ``verbose``. Returns which serves HTTP.
    """
    quiet = logging.INFO if verbose else logging.ERROR  # Ray's lines ("Started a local Ray", its token note)
    for name in ("ray", "ray.serve"):
        logging.getLogger(name).setLevel(quiet)
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": quiet}
        if address:
            ray.init(address=address, **kwargs)
            _start_serve(host, port)
            return "the cluster's Serve ingress"
        kwargs.update(num_cpus=num_cpus, num_gpus=num_gpus)
        if host in LOOPBACK_HOSTS and all(os.environ.get(k) == v for k, v in RAY_LOOPBACK_ENV.items()):
            kwargs["_node_ip_address"] = "127.0.0.1"  # every process of this Ray on the loopback (pyrt serve's)
        if metrics_port is not None:
            kwargs["_metrics_export_port"] = metrics_port
        guard = tempfile.mkdtemp(prefix="pyrt-serve-")
        atexit.register(shutil.rmtree, guard, True)
        mark = owner or lifetime.owner_token()
        env = {**ingress.ingress_env(ray_proxy=ray_proxy, guard_dir=guard, read_timeout_s=read_timeout_s,
                                     request_timeout_s=request_timeout_s), lifetime.OWNER_ENV: mark}
        with ingress.environment(env):  # read by Ray's processes as they start
            lifetime.start_ray(partial(ray.init, **kwargs), partial(lifetime.marked, mark), log.warning)
            _start_serve(host, port)
        return ingress.mode(env)
    _start_serve(host, port)
    return "the running Ray's Serve ingress"


def _start_serve(host: str, port: int) -> None:
    """``serve.start``, waiting past its fixed 60 s for proxies that are still starting on busy cores.

    Ray gives up on its proxies after 60 s with a TimeoutError though the controller keeps starting
    them (its own patience is :data:`ingress.PATIENCE`); here a second ``serve.start`` joins that
    controller and the wait goes on until every proxy is healthy, for up to :data:`PROXY_WAIT_S` more.
    """
    try:
        serve.start(http_options={"host": host, "port": port})
        return
    except TimeoutError:
        log.warning("Serve's HTTP proxies were not ready within Ray's 60 s; waiting up to %.0f s more", PROXY_WAIT_S)
        serve.start(http_options={"host": host, "port": port})  # joins the controller the first call started
    deadline = time.monotonic() + PROXY_WAIT_S
    while True:
        states = dict(serve.status().proxies)  # node id -> ProxyStatus, a str enum
        if states and all(state == "HEALTHY" for state in states.values()):
            return
        if time.monotonic() > deadline:
            raise PyrtError(f"Serve's HTTP proxies on {host}:{port} were not ready {PROXY_WAIT_S + 60:.0f} s after "
                            f"the start: { {node: str(state) for node, state in states.items()} or 'none'}")
        time.sleep(0.5)


def run(app: Application, *, app_name: str = "pyrt", path: str = "", route_prefix: str = "/") -> Any:
    """Deploy ``app`` (built with the same ``app_name``) and wait until every replica has loaded.

    A replica that cannot load its Program fails the deployment: PyrtError naming ``path``.
    """
    try:
        return serve.run(app, name=app_name, route_prefix=route_prefix)
    except RuntimeError as exc:
        raise PyrtError(f"{path or 'the program'}: serving failed to start: a replica could not load it:\n{exc}") \
            from None
