"""The Open Inference Protocol's (KServe v2's) routes of a replica: health, metadata, readiness, stats, infer.

``GET /v2/health/live``, ``GET /v2/health/ready`` (every replica of the application running),
``GET /v2`` (the server's metadata), ``GET /v2/models/{name}`` (a model's inputs and outputs,
:func:`pyrt.serve.protocol.model_metadata`), ``GET /v2/models/{name}/ready``,
``GET /v2/models/{name}/stats`` (runs, the queue, and a generating model's ``generation``
counters) and ``POST /v2/models/{name}/infer`` (:mod:`pyrt.serve.protocol`'s JSON and binary
tensors, run by :class:`pyrt.serve.inference.Inference`); the model routes take a
``/versions/{version}`` too, and a model's aliases. Failures are ``{"error": "text"}``: 404 an
unknown model, 400 a bad request, 413 / 408 a body over the limits, 503 a full queue, 504 late,
500 a failed run. A model that generates is refused on the infer route: its runs would write the
KV-cache slots its generations hold.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import ray
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from pyrt._version import __version__
from pyrt.errors import InputError
from pyrt.serve.config import ServeConfig
from pyrt.serve.failures import error_response
from pyrt.serve.inference import Inference
from pyrt.serve.metrics import process_stats
from pyrt.serve.protocol import HEADER_LENGTH, ModelInfo, decode_infer, encode_infer
from pyrt.serve.protocol import model_metadata as describe
from pyrt.serve.routes import route


def application_running(app_name: str) -> bool:
    """Whether Ray Serve's application ``app_name`` runs (every replica up); False outside Ray."""
    if not ray.is_initialized():  # built outside Ray (tests): no application; serve.status() would start a Ray
        return False
    try:
        status = serve.status().applications[app_name]
    except (KeyError, RuntimeError):
        return False
    return status.status == "RUNNING"


class InferRoutes:
    """The protocol's routes over ``models`` (aliases: ``aliases``), run by ``inference``.

    ``generating``: whether a model's engine drives it (refused on the infer route), ``generation``: its
    ``generation`` stats (None: it does not generate); ``metrics``: the replica's; ``read_body`` reads a body
    within the replica's limits.
    """

    def __init__(self, cfg: ServeConfig, models: dict[str, ModelInfo], aliases: dict[str, str], inference: Inference,
                 metrics: Any, read_body: Callable[[Request], Awaitable[bytes]], generating: Callable[[str], bool],
                 generation: Callable[[str], dict[str, Any] | None]) -> None:
        self.cfg, self.models, self.aliases, self.inference, self.metrics = cfg, models, aliases, inference, metrics
        self.read_body, self.generating, self.generation = read_body, generating, generation

    def routes(self) -> list[Route]:
        return [route("POST", "/v2/models/{name}/infer", self.infer),  # the hot path first
                route("POST", "/v2/models/{name}/versions/{version}/infer", self.infer),
                route("GET", "/v2/health/live", self.live),
                route("GET", "/v2/health/ready", self.ready),
                route("GET", "/v2", self.server_metadata),
                route("GET", "/v2/models/{name}", self.model_metadata),
                route("GET", "/v2/models/{name}/versions/{version}", self.model_metadata),
                route("GET", "/v2/models/{name}/ready", self.model_ready),
                route("GET", "/v2/models/{name}/versions/{version}/ready", self.model_ready),
                route("GET", "/v2/models/{name}/stats", self.model_stats)]

    def _named(self, request: Request) -> str:
        name: str = request.path_params["name"]
        return self.aliases.get(name, name)

    async def _running(self) -> bool:
        return await asyncio.get_running_loop().run_in_executor(None, application_running, self.cfg.app_name)

    async def live(self, request: Request) -> JSONResponse:
        return JSONResponse({"live": True})

    async def ready(self, request: Request) -> JSONResponse:
        ok = await self._running()
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    async def server_metadata(self, request: Request) -> JSONResponse:
        return JSONResponse({"name": "pyrt", "version": __version__,
                             "extensions": ["binary_tensor_data", "statistics", "generate"]})

    async def model_metadata(self, request: Request) -> JSONResponse:
        name = self._named(request)
        info = self.models.get(name)
        if info is None:
            return self._unknown(name)
        return JSONResponse(describe(info, self.cfg.max_batch_size))

    async def model_ready(self, request: Request) -> JSONResponse:
        name = self._named(request)
        if name not in self.models:
            return self._unknown(name)
        ok = await self._running()
        return JSONResponse({"name": name, "ready": ok}, status_code=200 if ok else 503)

    async def model_stats(self, request: Request) -> JSONResponse:
        name = self._named(request)
        if name not in self.models:
            return self._unknown(name)
        queue = self.inference.runs.queue_stats(self.inference.queued())
        stats = {**self.metrics.stats(name), **process_stats(), "queue": queue}
        generation = self.generation(name)
        if generation is not None:
            stats["generation"] = generation
        return JSONResponse(stats)

    async def infer(self, request: Request) -> Response:
        name = self._named(request)
        info = self.models.get(name)
        if info is None:
            return self._unknown(name)
        self.metrics.request(name)
        arrived = time.monotonic()
        with self.inference.arriving():
            try:
                if self.generating(name):
                    raise InputError(f"model {name!r} generates: its runs would write the KV-cache slots that "
                                     f"generations hold; use POST /v2/models/{name}/generate (or OpenAI's /v1 API)")
                body = await self.read_body(request)
                req = decode_infer(info, body, request.headers.get(HEADER_LENGTH))
                data, headers = encode_infer(info, req, await self.inference.infer(info, req, arrived))
            except Exception as exc:  # answered, never raised: the replica keeps serving
                self.metrics.error(name, type(exc).__name__)
                return error_response(exc)
        media = "application/octet-stream" if headers else "application/json"
        return Response(data, media_type=media, headers=headers)

    def _unknown(self, name: str) -> JSONResponse:
        self.metrics.error("", "UnknownModel")  # not the name: clients must not mint label values
        return JSONResponse({"error": f"no model {name!r}; models are {sorted(self.models)}"}, status_code=404)
