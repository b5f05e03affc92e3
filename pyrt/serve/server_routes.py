"""The server routes vLLM's OpenAI server has beside ``/v1``: health, version, tokenizing, Prometheus metrics.

``GET /health`` (200, empty, while the replica serves), ``GET /ping`` (the same, SageMaker's),
``GET /version`` (``{"version"}``), ``POST /tokenize`` (``{"prompt"}`` or ``{"messages"}`` through
the chat template; ``add_special_tokens``, ``return_token_strs``, chat's ``add_generation_prompt``,
``continue_final_message``, ``chat_template_kwargs``, ``tools``; answers ``{"count", "max_model_len",
"tokens", "token_strs"}``, ``token_strs`` the tokens' vocabulary pieces as vLLM gives them:
``convert_ids_to_tokens``, ``Ġworld`` for a byte-level BPE's " world"), ``POST /detokenize``
(``{"tokens"}`` -> ``{"prompt"}``), ``GET /metrics`` (the replica's counters in Prometheus' text format,
:mod:`pyrt.serve.twin_metrics`).
``model`` is optional in the tokenizing bodies (default: the first model that generates).
Tokenizing runs off the event loop; failures are OpenAI errors.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import Field, StrictBool, StrictInt
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from pyrt._version import __version__
from pyrt.serve.failures import ApiError, openai_response
from pyrt.serve.llm_models import LlmModels
from pyrt.serve.openai_api import Message
from pyrt.serve.routes import route
from pyrt.serve.tokenization import Tokenization, template_options
from pyrt.serve.twin_metrics import CONTENT_TYPE, exposition
from pyrt.serve.validation import Body, parse


class TokenizeRequest(Body):
    """``POST /tokenize``: a prompt, or chat messages."""

    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = None
    add_special_tokens: StrictBool | None = None  # default: true for a prompt, false for messages (as vLLM)
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    return_token_strs: StrictBool = False


class DetokenizeRequest(Body):
    """``POST /detokenize``."""

    model: str | None = None
    tokens: list[StrictInt] = Field(default_factory=list)


class ServerRoutes:
    """Health, version, tokenizing (``texts``, for ``models``) and metrics (``metrics``: the replica's
    ServeMetrics); ``read_body`` reads a body within the replica's limits."""

    def __init__(self, models: LlmModels, texts: Tokenization, read_body: Callable[[Request], Awaitable[bytes]],
                 metrics: Any) -> None:
        self.models, self.texts, self.read_body, self.metrics = models, texts, read_body, metrics

    def routes(self) -> list[Route]:
        return [route("GET", "/health", self.health), route("GET", "/ping", self.health),
                route("GET", "/version", self.version), route("GET", "/metrics", self.prometheus),
                route("POST", "/tokenize", self.tokenize), route("POST", "/detokenize", self.detokenize)]

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": __version__})

    async def prometheus(self, request: Request) -> Response:
        data = await self.texts.off_loop(self._exposition)
        return Response(data, media_type=CONTENT_TYPE)

    def _exposition(self) -> bytes:
        self.metrics.flush()  # what changed since the last flush, counted now
        return exposition(self.metrics.registry)

    def _context(self, model: str | None) -> tuple[str, int]:
        """The model a tokenizing body names (default: the first that generates) and its cache's positions."""
        if self.texts.tokenizer is None:
            raise ApiError("tokenizing needs a tokenizer: start pyrt serve with --tokenizer DIR", 404)
        names = self.models.names()
        if model is None and not names:
            raise ApiError("no model generates here", 404, param="model")
        host = self.models.host(model if model is not None else names[0], list_names=True)
        return host.model, host.engine.conv.max_context_len

    async def tokenize(self, request: Request) -> Response:
        try:
            body = parse(TokenizeRequest, await self.read_body(request))
            _, context = self._context(body.model)
            ids = await self._ids(body)
        except Exception as exc:  # answered, never raised: the replica keeps serving
            return openai_response(exc)
        tokenizer: Any = self.texts.tokenizer  # there is one: _context refused the request otherwise
        strs = list(tokenizer.convert_ids_to_tokens(ids)) if body.return_token_strs else None  # vLLM's pieces
        return JSONResponse({"count": len(ids), "max_model_len": context, "tokens": ids, "token_strs": strs})

    async def _ids(self, body: TokenizeRequest) -> list[int]:
        if (body.prompt is None) == (body.messages is None):
            raise ApiError("give prompt (text) or messages, once", param="prompt")
        if body.prompt is not None:
            special = True if body.add_special_tokens is None else body.add_special_tokens
            return await self.texts.encode_async(body.prompt, "prompt", add_special_tokens=special)
        assert body.messages is not None
        template = template_options(body.add_generation_prompt, body.continue_final_message,
                                    body.chat_template_kwargs, body.tools)
        return await self.texts.chat_prompt([m.for_template() for m in body.messages], None, template)

    async def detokenize(self, request: Request) -> Response:
        try:
            body = parse(DetokenizeRequest, await self.read_body(request))
            self._context(body.model)
            tokenizer: Any = self.texts.tokenizer  # there is one: _context refused the request otherwise
            vocab = len(tokenizer)
            bad = [t for t in body.tokens if not 0 <= t < vocab]
            if bad:
                raise ApiError(f"tokens: {bad[0]} is outside the vocabulary [0, {vocab})", param="tokens")
            text = await self.texts.off_loop(self.texts.decode, body.tokens)
        except Exception as exc:  # answered, never raised: the replica keeps serving
            return openai_response(exc)
        return JSONResponse({"prompt": text})
