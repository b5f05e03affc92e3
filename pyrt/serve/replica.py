"""The Ray Serve deployment: each replica loads one ``pyrt.Program`` and answers the protocol itself.

One hop: the replica answers HTTP itself (``__call__`` takes Ray Serve's
Starlette request; its routes are declared once, with Starlette's router, :mod:`pyrt.serve.routes`), with a batch
queue inside it (:mod:`pyrt.serve.batch_queue`), so a request goes HAProxy (or
Ray's proxy, see :mod:`pyrt.serve.ingress`) -> replica -> Program and back.
Runs happen on one worker thread per replica (a Program's runs of one method
take turns anyway) while the event loop keeps decoding requests, so the next
batch fills during a run; a request that finds the replica idle runs at once
(on the event loop when its method's runs are short). Status codes: 404
unknown model (or path), 405 a path the protocol has for another method, 400
a bad request (the ``InputError`` text), 413 a body over ``max_request_bytes``,
500 a failed run (the typed error), 503 not ready; with an API key, 401 without it; and the
limits of :mod:`pyrt.serve.limits`: 503 with ``Retry-After`` a full queue, 504 a request past
``request_timeout_s``, 408 a body slower than ``read_timeout_s``. Programs that generate also
answer OpenAI's ``/v1`` API and Triton's generate routes (:mod:`pyrt.serve.openai_routes`,
:mod:`pyrt.serve.generate_routes`: one :mod:`pyrt.serve.generation_call` over an engine per generating
model, :mod:`pyrt.serve.llm_models`, and the tokenizer, :mod:`pyrt.serve.tokenization`; 429 when
``max_queued_requests`` generations already wait for a KV-cache slot). The replica's devices come
from the ``devices`` factory it is bound with (simulated GPUs, :func:`pyrt.serve.app.deployment`);
without one, the GPUs Ray assigned it.
"""


import asyncio
import hmac
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import ray
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Router

from pyrt._version import __version__
from pyrt.errors import InputError
from pyrt.format.method_io import flatten
from pyrt.pte_reader import PteFile
from pyrt.runtime.program import Program
from pyrt.serve import limits, routes
from pyrt.serve.batch_queue import BatchQueue
from pyrt.serve.batching import run_batched
from pyrt.serve.config import ServeConfig
from pyrt.serve.failures import ApiError, error_response, openai_response
from pyrt.serve.generate_routes import GenerateRoutes
from pyrt.serve.generation_call import GenerationCall
from pyrt.serve.limits import RunThread
from pyrt.serve.llm_models import LlmModels
from pyrt.serve.metrics import ServeMetrics, process_stats
from pyrt.serve.openai_routes import OpenAIRoutes
from pyrt.serve.protocol import HEADER_LENGTH, InferRequest, ModelInfo, decode_infer, encode_infer, models_of
from pyrt.serve.protocol import model_metadata as describe
from pyrt.serve.routes import route
from pyrt.serve.server_routes import ServerRoutes
from pyrt.serve.tokenization import Tokenization

Item = tuple[str, list[np.ndarray]]
Devices = Callable[[], Any]  # makes the devices a Program runs on (pyrt.sim.simulated_devices)


def load_program(cfg: ServeConfig, devices: Any = None) -> Program:
    """The replica's Program, on ``devices`` (made by the replica's devices factory; None: the GPUs Ray assigned it)."""
    data = list(cfg.data) or None
    return Program(cfg.path, data=data, budget=cfg.budget, kernels=cfg.kernels, devices=devices)


def aliases_of(models: dict[str, ModelInfo], name: str, aliases: tuple[str, ...]) -> dict[str, str]:
    """Each alias's name of every model (``ALIAS`` for ``NAME``, ``ALIAS.METHOD`` for ``NAME.METHOD``) -> the model.

    >>> aliases_of({"m": None, "m.get_n": None}, "m", ("org/M",))
    {'org/M': 'm', 'org/M.get_n': 'm.get_n'}
    """
    return {alias + model[len(name):]: model for alias in aliases for model in models}


@serve.deployment
class PyrtReplica:
    """One replica: a Program, its models (``NAME`` = forward, ``NAME.METHOD``), the protocol routes.

    ``devices``: makes the devices its Program runs on (None: the GPUs Ray assigned it).
    """

    def __init__(self, cfg: ServeConfig, devices: Devices | None = None) -> None:
        self.cfg = cfg
        with PteFile.open(cfg.path) as pte:
            self.models: dict[str, ModelInfo] = models_of(pte, cfg.name)
        self.aliases = aliases_of(self.models, cfg.name, cfg.aliases)
        self.program = load_program(cfg, None if devices is None else devices())  # a draft file opens on them too
        self.runs = RunThread(cfg.max_queued_requests)  # the run thread, and the queue limit of requests for it
        self.pool = self.runs.pool
        self.in_flight = 0  # infer requests between arrival and reply
        self.last_run_s: dict[str, float] = {}  # each model's last run time (cfg.inline_run_ms)
        self.metrics = ServeMetrics()
        self.metrics.start()
        for info in self.models.values():
            self.metrics.budgets(info.name, [w for w in self.program.weight_streaming if w.method == info.method])
        self.batches = BatchQueue(self.run_items, rows=lambda item: int(item[1][0].shape[0]),
                                  limit=cfg.max_batch_size, wait_s=cfg.batch_wait_ms / 1000, runner=self._on_pool)
        self.texts = Tokenization(cfg.tokenizer)
        self.llm = LlmModels(self.program, {n: i.method for n, i in self.models.items()}, cfg.generation,
                             self.aliases, self.metrics)
        self.generation = GenerationCall(self.llm, self.texts, self.metrics, self._body)
        self.router = Router([  # the hot path first
            route("POST", "/v2/models/{name}/infer", self.infer),
            route("POST", "/v2/models/{name}/versions/{version}/infer", self.infer),
            route("GET", "/v2/health/live", self.live),
            route("GET", "/v2/health/ready", self.ready),
            route("GET", "/v2", self.server_metadata),
            route("GET", "/v2/models/{name}", self.model_metadata),
            route("GET", "/v2/models/{name}/versions/{version}", self.model_metadata),
            route("GET", "/v2/models/{name}/ready", self.model_ready),
            route("GET", "/v2/models/{name}/versions/{version}/ready", self.model_ready),
            route("GET", "/v2/models/{name}/stats", self.model_stats),
            *GenerateRoutes(self.generation).routes(),
            *OpenAIRoutes(self.generation).routes(),
            *ServerRoutes(self.llm, self.texts, self._body, self.metrics).routes(),
        ])
        self.slashed = routes.slashed(self.router)  # the same routes for model names with "/" (org/Model)

    def __del__(self) -> None:  # Ray Serve calls it when the replica stops: the stepping threads end
        for part in ("llm", "texts"):  # a draft file closes with the engine that opened it
            found = getattr(self, part, None)
            if found is not None:
                found.close()

    # -- running ----------------------------------------------------------------------------------
    def run(self, info: ModelInfo, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """One Program run of ``info``'s method; scalar inputs keep their exported values."""
        it = iter(arrays)
        args = [next(it) if spec.kind == "Tensor" else spec.value for spec in info.inputs]
        start = time.perf_counter()
        out = self.program.run(*args, method=info.method)
        self.last_run_s[info.name] = elapsed = time.perf_counter() - start
        self.metrics.run(info.name, int(arrays[0].shape[0]) if arrays and arrays[0].ndim else 1, elapsed)
        return [x for x in flatten(out) if isinstance(x, np.ndarray)]

    def run_items(self, items: list[Item]) -> list[Any]:
        """A batch of (model, arrays) items: each model's requests batched together, results in order."""
        results: list[Any] = [None] * len(items)
        by_model: dict[str, list[int]] = {}
        for i, (name, _) in enumerate(items):
            by_model.setdefault(name, []).append(i)
        for name, idx in by_model.items():
            info = self.models[name]
            limit = min(self.cfg.max_batch_size, info.batch_bound)
            out = run_batched(partial(self.run, info), [items[i][1] for i in idx], limit)
            for i, r in zip(idx, out, strict=True):
                results[i] = r
        return results

    async def _on_pool(self, run: Any, items: list[Item]) -> list[Any]:
        return await self.runs.call(run, items)

    async def dispatch(self, info: ModelInfo, req: InferRequest) -> list[np.ndarray]:
        """Batched where the method batches, the request fits a batch and others are in flight; else run now.

        A request that finds the replica idle runs at once: waiting ``batch_wait_ms`` for company
        that is not coming only adds latency; on the event loop itself when the method's last run
        was shorter than ``cfg.inline_run_ms``. Requests that arrive while others are in flight wait (at
        most that long) to run together.
        """
        limit = min(self.cfg.max_batch_size, info.batch_bound)
        alone = self.in_flight <= 1  # counted from the moment a request arrives, before its body is read
        if limit > 1 and req.rows <= limit and not alone:
            return list(await self.batches.submit((info.name, req.arrays)))
        short = self.cfg.inline_run_ms / 1000
        if alone and not self.runs.busy and self.last_run_s.get(info.name, short) < short:
            self.metrics.inline(info.name)
            return self.run(info, req.arrays)
        return await self.runs.call(self.run, info, req.arrays)

    def queued(self) -> int:
        """Decoded requests waiting for the run thread: in the batch queue, or for the thread itself."""
        return self.batches.waiting + self.runs.waiting

    # -- routes -----------------------------------------------------------------------------------
    async def __call__(self, request: Request) -> Response:
        """Answer one HTTP request (Ray Serve hands every request to the replica here)."""
        path = routes.route_path(request.scope)
        refused = self._unauthorized(request, path)
        if refused is not None:
            return refused
        found = routes.match(self.router, request.scope)
        if found == 404:
            found = routes.match(self.slashed, request.scope)
        if isinstance(found, int):
            what = "no such path" if found == 404 else f"{request.method} is not allowed here"
            if routes.openai_shaped(path):
                return openai_response(ApiError(f"{what}: {path}", found))
            return JSONResponse({"error": f"{what}: {path}"}, status_code=found)
        handler, params = found
        request.scope["path_params"] = params
        try:
            return await handler(request)
        except Exception as exc:  # answered, never raised: the replica keeps serving
            return error_response(exc)

    def _unauthorized(self, request: Request, path: str) -> Response | None:
        """401 for a guarded route without ``Authorization: Bearer KEY`` (compared in constant time)."""
        key = self.cfg.api_key
        if key is None or not routes.guarded(path):
            return None
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode()):
            return None
        self.metrics.error("", "Unauthorized")
        error = ApiError("no API key given: send 'Authorization: Bearer KEY'" if not given else
                         "the API key is not valid", 401, code="invalid_api_key")
        headers = {"WWW-Authenticate": "Bearer"}
        if path.startswith(routes.OPENAI_PREFIX):
            return openai_response(error, headers=headers)
        return JSONResponse({"error": str(error)}, status_code=401, headers=headers)

    async def live(self, request: Request) -> JSONResponse:
        return JSONResponse({"live": True})

    async def ready(self, request: Request) -> JSONResponse:
        ok = await asyncio.get_running_loop().run_in_executor(None, self._all_replicas_running)
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    def _all_replicas_running(self) -> bool:
        if not ray.is_initialized():  # built outside Ray (tests): no application; serve.status() would start a Ray
            return False
        try:
            status = serve.status().applications[self.cfg.app_name]
        except (KeyError, RuntimeError):
            return False
        return status.status == "RUNNING"

    async def server_metadata(self, request: Request) -> JSONResponse:
        return JSONResponse({"name": "pyrt", "version": __version__,
                             "extensions": ["binary_tensor_data", "statistics", "generate"]})

    async def model_metadata(self, request: Request) -> JSONResponse:
        name = self.aliases.get(request.path_params["name"], request.path_params["name"])
        info = self.models.get(name)
        if info is None:
            return self._unknown(name)
        return JSONResponse(describe(info, self.cfg.max_batch_size))

    async def model_ready(self, request: Request) -> JSONResponse:
        name = self.aliases.get(request.path_params["name"], request.path_params["name"])
        if name not in self.models:
            return self._unknown(name)
        ok = await asyncio.get_running_loop().run_in_executor(None, self._all_replicas_running)
        return JSONResponse({"name": name, "ready": ok}, status_code=200 if ok else 503)

    async def model_stats(self, request: Request) -> JSONResponse:
        name = self.aliases.get(request.path_params["name"], request.path_params["name"])
        if name not in self.models:
            return self._unknown(name)
        stats = {**self.metrics.stats(name), **process_stats(), "queue": self.runs.queue_stats(self.queued())}
        generation = self.generation.stats(name)
        if generation is not None:
            stats["generation"] = generation
        return JSONResponse(stats)

    async def infer(self, request: Request) -> Response:
        name = self.aliases.get(request.path_params["name"], request.path_params["name"])
        info = self.models.get(name)
        if info is None:
            return self._unknown(name)
        self.metrics.request(name)
        self.in_flight += 1
        arrived, cfg = time.monotonic(), self.cfg
        try:
            if self.llm.generates(name):
                raise InputError(f"model {name!r} generates: its runs would write the KV-cache slots that "
                                 f"generations hold; use POST /v2/models/{name}/generate (or OpenAI's /v1 API)")
            body = await self._body(request)
            req = decode_infer(info, body, request.headers.get(HEADER_LENGTH))
            self.runs.admit(self.queued(), f"model {name!r}")
            outputs = await limits.within(self.dispatch(info, req), cfg.request_timeout_s, arrived, f"model {name!r}")
            data, headers = encode_infer(info, req, outputs)
        except Exception as exc:  # answered, never raised: the replica keeps serving
            self.metrics.error(name, type(exc).__name__)
            return error_response(exc)
        finally:
            self.in_flight -= 1
        media = "application/octet-stream" if headers else "application/json"
        return Response(data, media_type=media, headers=headers)

    async def _body(self, request: Request) -> bytes:
        """The request's body within ``max_request_bytes`` (413) and ``read_timeout_s`` (408)."""
        return await limits.read_body(request, self.cfg.max_request_bytes, self.cfg.read_timeout_s)

    def _unknown(self, name: str) -> JSONResponse:
        self.metrics.error("", "UnknownModel")  # not the name: clients must not mint label values
        return JSONResponse({"error": f"no model {name!r}; models are {sorted(self.models)}"}, status_code=404)
