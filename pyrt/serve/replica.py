"""The Ray Serve deployment: each replica loads one ``pyrt.Program`` and answers the protocol itself.

One hop: the replica answers HTTP itself (``__call__`` takes Ray Serve's
Starlette request; its routes are declared once, with Starlette's router, :mod:`pyrt.serve.routes`, and
each protocol's routes are a module of their own), with a batch queue inside it
(:mod:`pyrt.serve.inference`), so a request goes HAProxy (or Ray's proxy, see :mod:`pyrt.serve.ingress`)
-> replica -> Program and back. The replica wires the parts and checks the API key; the routes answer.
Runs happen on one worker thread per replica (a Program's runs of one method
take turns anyway) while the event loop keeps decoding requests, so the next
batch fills during a run; a request that finds the replica idle runs at once
(on the event loop when its method's runs are short). Status codes: 404
unknown model (or path), 405 a path the protocol has for another method (the Open Inference
Protocol's routes: :mod:`pyrt.serve.infer_routes`), 400
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


import hmac
from collections.abc import Callable
from typing import Any

from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Router

from pyrt.pte_reader import PteFile
from pyrt.runtime.program import Program
from pyrt.serve import limits, routes
from pyrt.serve.config import ServeConfig
from pyrt.serve.failures import ApiError, error_response, openai_response
from pyrt.serve.generate_routes import GenerateRoutes
from pyrt.serve.generation_call import GenerationCall
from pyrt.serve.infer_routes import InferRoutes
from pyrt.serve.inference import Inference
from pyrt.serve.limits import RunThread
from pyrt.serve.llm_models import LlmModels
from pyrt.serve.metrics import ServeMetrics
from pyrt.serve.openai_routes import OpenAIRoutes
from pyrt.serve.protocol import ModelInfo, models_of
from pyrt.serve.replica_grpc import bind_like_the_node
from pyrt.serve.server_routes import ServerRoutes
from pyrt.serve.tokenization import Tokenization

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
    """One replica: a Program, its models (``NAME`` = forward, ``NAME.METHOD``), the protocol routes; it wires them.

    ``devices``: makes the devices its Program runs on (None: the GPUs Ray assigned it).
    """

    def __init__(self, cfg: ServeConfig, devices: Devices | None = None) -> None:
        bind_like_the_node()  # before Serve starts this replica's gRPC server: on a loopback node, loopback only
        self.cfg = cfg
        with PteFile.open(cfg.path) as pte:
            self.models: dict[str, ModelInfo] = models_of(pte, cfg.name)
        self.aliases = aliases_of(self.models, cfg.name, cfg.aliases)
        self.program = load_program(cfg, None if devices is None else devices())
        self.runs = RunThread(cfg.max_queued_requests)  # the run thread, and the queue limit of requests for it
        self.pool = self.runs.pool
        self.metrics = ServeMetrics()
        self.metrics.start()
        for info in self.models.values():
            self.metrics.budgets(info.name, [w for w in self.program.weight_streaming if w.method == info.method])
        self.inference = Inference(cfg, self.program, self.models, self.runs, self.metrics)
        self.texts = Tokenization(cfg.tokenizer, cfg.chat_template)
        self.llm = LlmModels(self.program, {n: i.method for n, i in self.models.items()}, cfg.generation,
                             self.aliases, self.metrics)
        self.generation = GenerationCall(self.llm, self.texts, self.metrics, self._body)
        self.infer_routes = InferRoutes(cfg, self.models, self.aliases, self.inference, self.metrics, self._body,
                                        self.llm.generates, self.generation.stats)
        self.router = Router([
            *self.infer_routes.routes(),  # the hot path first
            *GenerateRoutes(self.generation).routes(),
            *OpenAIRoutes(self.generation).routes(),
            *ServerRoutes(self.llm, self.texts, self._body, self.metrics).routes(),
        ])
        self.slashed = routes.slashed(self.router)  # the same routes for model names with "/" (org/Model)

    def __del__(self) -> None:  # Ray Serve calls it when the replica stops: the stepping threads end
        for part in ("llm", "texts"):
            found = getattr(self, part, None)
            if found is not None:
                found.close()

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

    async def _body(self, request: Request) -> bytes:
        """The request's body within ``max_request_bytes`` (413) and ``read_timeout_s`` (408)."""
        return await limits.read_body(request, self.cfg.max_request_bytes, self.cfg.read_timeout_s)
