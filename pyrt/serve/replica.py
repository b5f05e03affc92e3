"""The Ray Serve deployment: each replica loads one ``pyrt.Program`` and answers the protocol itself.

One hop: the replica answers HTTP itself (``__call__`` takes Ray Serve's
Starlette request; :mod:`pyrt.serve.routes` picks the method), with a batch
queue inside it (:mod:`pyrt.serve.batch_queue`), so a request goes HAProxy (or
Ray's proxy, see :mod:`pyrt.serve.ingress`) -> replica -> Program and back.
Runs happen on one worker thread per replica (a Program's runs of one method
take turns anyway) while the event loop keeps decoding requests, so the next
batch fills during a run; a request that finds the replica idle runs at once
(on the event loop when its method's runs are short). Status codes: 404
unknown model (or path), 405 a path the protocol has for another method, 400
a bad request (the ``InputError`` text), 413 a body over ``max_request_bytes``,
500 a failed run (the typed error), 503 not ready; and the limits of
:mod:`pyrt.serve.limits`: 503 with ``Retry-After`` a full queue, 504 a request past
``request_timeout_s``, 408 a body slower than ``read_timeout_s``.
"""


import asyncio
import time
from functools import partial
from typing import Any

import numpy as np
import ray
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from pyrt._version import __version__
from pyrt.errors import PyrtError
from pyrt.format.method_io import flatten
from pyrt.pte_reader import PteFile
from pyrt.runtime.program import Program
from pyrt.serve import generate, limits, routes
from pyrt.serve.batch_queue import BatchQueue
from pyrt.serve.batching import run_batched
from pyrt.serve.config import ServeConfig
from pyrt.serve.limits import RunThread
from pyrt.serve.metrics import ServeMetrics, process_stats
from pyrt.serve.protocol import HEADER_LENGTH, InferRequest, ModelInfo, decode_infer, encode_infer, models_of
from pyrt.serve.protocol import model_metadata as describe
from pyrt.testing import simulated_devices

Item = tuple[str, list[np.ndarray]]


status_of = limits.http_status  # the HTTP status a failure is answered with


def error_response(exc: BaseException) -> JSONResponse:
    text = str(exc) if isinstance(exc, PyrtError) else f"{type(exc).__name__}: {exc}"
    return JSONResponse({"error": text}, status_code=status_of(exc), headers=limits.headers_of(exc))


def load_program(cfg: ServeConfig) -> Program:
    """The replica's Program, on the GPUs Ray assigned it (or simulated ones)."""
    devices = None
    if cfg.simulated_gpus is not None:
        devices = simulated_devices(int(cfg.gpus_per_replica or 0) or cfg.simulated_gpus)
    data = list(cfg.data) or None
    return Program(cfg.path, data=data, budget=cfg.budget, kernels=cfg.kernels, devices=devices)


@serve.deployment
class PyrtReplica:
    """One replica: a Program, its models (``NAME`` = forward, ``NAME.METHOD``), the protocol routes."""

    def __init__(self, cfg: ServeConfig) -> None:
        self.cfg = cfg
        with PteFile.open(cfg.path) as pte:
            self.models: dict[str, ModelInfo] = models_of(pte, cfg.name)
        self.program = load_program(cfg)
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
        self.generation = generate.Generation(self.program, self.models, self.pool)

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
        found = routes.match(request.method, path)
        if isinstance(found, int):
            what = "no such path" if found == 404 else f"{request.method} is not allowed here"
            return JSONResponse({"error": f"{what}: {path}"}, status_code=found)
        handler, params = found
        try:
            return await getattr(self, handler)(request, **params)
        except Exception as exc:  # answered, never raised: the replica keeps serving
            return error_response(exc)

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

    async def model_metadata(self, request: Request, name: str, version: str = "") -> JSONResponse:
        info = self.models.get(name)
        if info is None:
            return self._unknown(name)
        return JSONResponse(describe(info, self.cfg.max_batch_size))

    async def model_ready(self, request: Request, name: str, version: str = "") -> JSONResponse:
        if name not in self.models:
            return self._unknown(name)
        ok = await asyncio.get_running_loop().run_in_executor(None, self._all_replicas_running)
        return JSONResponse({"name": name, "ready": ok}, status_code=200 if ok else 503)

    async def model_stats(self, request: Request, name: str) -> JSONResponse:
        if name not in self.models:
            return self._unknown(name)
        return JSONResponse({**self.metrics.stats(name), **process_stats()})

    async def infer(self, request: Request, name: str, version: str = "") -> Response:
        info = self.models.get(name)
        if info is None:
            return self._unknown(name)
        self.metrics.request(name)
        self.in_flight += 1
        arrived, cfg = time.monotonic(), self.cfg
        try:
            body = await limits.read_body(request, cfg.max_request_bytes, cfg.read_timeout_s)
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

    async def generate(self, request: Request, name: str) -> Response:
        return await self.generation.generate(name, request, stream=False)

    async def generate_stream(self, request: Request, name: str) -> Response:
        return await self.generation.generate(name, request, stream=True)

    def _unknown(self, name: str) -> JSONResponse:
        self.metrics.error("", "UnknownModel")  # not the name: clients must not mint label values
        return JSONResponse({"error": f"no model {name!r}; models are {sorted(self.models)}"}, status_code=404)
