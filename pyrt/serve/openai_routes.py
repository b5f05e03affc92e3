"""OpenAI's ``/v1`` routes of a replica: the models, completions and chat completions (they need the tokenizer).

``GET /v1/models``, ``GET /v1/models/{model}``, ``POST /v1/completions``,
``POST /v1/chat/completions`` (bodies: :mod:`pyrt.serve.openai_api`). Every failure is answered in
OpenAI's error shape, its ``param`` the field as the client spelled it; a streamed answer's
failure after the first event is its last event. Streamed answers are server-sent events
(:class:`pyrt.serve.events.EventStream`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from pyrt.serve import openai_api as oa
from pyrt.serve.events import DONE, EventStream, sse, sse_of
from pyrt.serve.failures import ApiError, openai_body, openai_response
from pyrt.serve.llm_host import Job, pieces
from pyrt.serve.llm_service import LlmService
from pyrt.serve.routes import route
from pyrt.serve.text import TextStream

NO_TOKENIZER = "the OpenAI routes need a tokenizer: start pyrt serve with --tokenizer DIR"
JSON = "application/json"


class OpenAIRoutes:
    """The ``/v1`` routes over ``service``'s engines."""

    def __init__(self, service: LlmService) -> None:
        self.service = service
        self.created = oa.now()

    def routes(self) -> list[Route]:
        return [route("POST", "/v1/chat/completions", self.chat_completions),
                route("POST", "/v1/completions", self.completions),
                route("GET", "/v1/models", self.models),
                route("GET", "/v1/models/{model}", self.model)]

    def _card(self, name: str) -> oa.ModelCard:
        max_len = self.service.hosts[name].engine.conv.max_context_len
        return oa.ModelCard(id=name, created=self.created, max_model_len=max_len)

    def _tokenizer(self) -> None:
        if self.service.tokenizer is None:
            raise ApiError(NO_TOKENIZER, 404)

    async def models(self, request: Request) -> Response:
        try:
            self._tokenizer()
        except ApiError as exc:
            return openai_response(exc)
        cards = oa.ModelList(data=[self._card(n) for n in sorted(self.service.hosts)])
        return Response(cards.model_dump_json(), media_type=JSON)

    async def model(self, request: Request) -> Response:
        name = request.path_params["model"]
        try:
            self._tokenizer()
            self.service.host(name, openai=True)
        except ApiError as exc:
            return openai_response(exc)
        return Response(self._card(name).model_dump_json(), media_type=JSON)

    async def completions(self, request: Request) -> Response:
        return await self._answer(request, oa.CompletionRequest)

    async def chat_completions(self, request: Request) -> Response:
        return await self._answer(request, oa.ChatRequest)

    async def _answer(self, request: Request, kind: type[oa.CompletionRequest] | type[oa.ChatRequest]) -> Response:
        name = ""
        try:
            self._tokenizer()
            body = await self.service.read(request, kind)
            host = self.service.host(body.model, openai=True)
            name = body.model
            self.service.metrics.request(name)
            job, text = self.service.start(host, body, self._prompt(body))
        except Exception as exc:  # answered, never raised: the replica keeps serving
            self.service.failed(name, exc)
            return openai_response(exc)
        chat = isinstance(body, oa.ChatRequest)
        rid, created = oa.new_id(chat), oa.now()
        if body.stream:
            return EventStream(self._events(chat, body, job, text, rid, created))
        try:
            got, last = await self.service.collect(job, text, request)
        except Exception as exc:
            self.service.failed(name, exc)
            return openai_response(exc)
        usage = oa.Usage.of(len(job.generation.prompt), last.consumed)
        whole = oa.answer(chat, rid, created, body.model, "".join(p.text for p in got), last.finish_reason, usage)
        return Response(whole.model_dump_json(), media_type=JSON)

    def _prompt(self, body: oa.CompletionRequest | oa.ChatRequest) -> list[Any]:
        """The prompt's token ids: the chat template's, the tokenizer's, or as sent (checked where submitted)."""
        if isinstance(body, oa.ChatRequest):
            return self.service.chat_prompt([m.for_template() for m in body.messages])
        return self.service.encode(body.prompt, "prompt") if isinstance(body.prompt, str) else body.prompt

    async def _events(self, chat: bool, body: oa.OpenAIRequest, job: Job, text: TextStream | None, rid: str,
                      created: int) -> AsyncIterator[bytes]:
        model, prompt = body.model, len(job.generation.prompt)
        leave_out = None if body.include_usage else {"usage"}  # "usage": null in every chunk when asked for
        try:
            if chat:
                yield sse_of(oa.chunk(True, rid, created, model, {"role": "assistant", "content": ""}, None),
                             leave_out=leave_out)
            async for piece in pieces(job, text):
                if not piece.text and piece.finish_reason is None:
                    continue
                delta = ({"content": piece.text} if piece.text else {}) if chat else piece.text
                usage = oa.Usage.of(prompt, piece.consumed) if body.continuous_usage else None
                yield sse_of(oa.chunk(chat, rid, created, model, delta, piece.finish_reason, usage),
                             leave_out=leave_out)
                if piece.finish_reason is not None and body.include_usage:
                    yield sse_of(oa.usage_chunk(chat, rid, created, model, oa.Usage.of(prompt, piece.consumed)))
        except Exception as exc:  # the status went with the first event: the error is the last one
            self.service.failed(model, exc)
            yield sse(json.dumps(openai_body(exc)).encode())
        finally:
            self.service.ended(job)
        yield DONE
