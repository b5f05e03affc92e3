"""The serving tests' local Ray: one per session, shared by every module that deploys on it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fixtures import serve as serve_fixtures


@pytest.fixture(scope="session")
def ray_serve() -> Iterator[str]:
    """A local Ray on this machine's 2 cores, three simulated GPUs, Serve's HTTP ingress on a free port."""
    ray = pytest.importorskip("ray")
    serve = pytest.importorskip("ray.serve")
    from pyrt.serve.app import start

    port = serve_fixtures.free_port()
    serve_fixtures.INGRESS["mode"] = start(port=port, num_cpus=2, num_gpus=3,
                                           metrics_port=serve_fixtures.METRICS_PORT)
    yield f"127.0.0.1:{port}"
    serve.shutdown()
    ray.shutdown()
