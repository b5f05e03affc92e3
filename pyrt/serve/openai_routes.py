"""OpenAI's ``/v1`` routes of a replica: the models, completions and chat completions (they need the tokenizer).

``GET /v1/models``, ``GET /v1/models/{model}``, ``POST /v1/completions``,
``POST /v1/chat/completions`` (bodies: :mod:`pyrt.serve.openai_api`, :mod:`pyrt.serve.openai_answers`).
Each generation route is one :meth:`pyrt.serve.generation_call.GenerationCall.answer` with its
adapter (:mod:`pyrt.serve.openai_completions`, :mod:`pyrt.serve.openai_chat`). A request's ``n``
(or ``best_of``) generations are submitted together on one prompt: the engine prefills them in
the same steps (a slot file has no method that copies one slot's cache into another, so each
slot's cache is computed; the prompt counts once in the usage). Every failure is answered in
OpenAI's error shape, its ``param`` the field as the client spelled it; a streamed answer's
failure after the first event is its last event. Streamed answers are server-sent events
(:class:`pyrt.serve.events.EventStream`).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from pyrt.serve import openai_answers as oa
from pyrt.serve.failures import ApiError, openai_response
from pyrt.serve.generation_call import Adapter, GenerationCall
from pyrt.serve.openai_chat import ChatAdapter
from pyrt.serve.openai_completions import CompletionAdapter
from pyrt.serve.routes import route

NO_TOKENIZER = "the OpenAI routes need a tokenizer: start pyrt serve with --tokenizer DIR"
JSON = "application/json"


class OpenAIRoutes:
    """The ``/v1`` routes over ``call``'s models."""

    def __init__(self, call: GenerationCall) -> None:
        self.call, self.models, self.texts = call, call.models, call.texts
        self.chat, self.completion = ChatAdapter(call.texts), CompletionAdapter(call.texts)
        self.created = oa.now()

    def routes(self) -> list[Route]:
        return [route("POST", "/v1/chat/completions", self.chat_completions),
                route("POST", "/v1/completions", self.completions),
                route("GET", "/v1/models", self.list_models),
                route("GET", "/v1/models/{model}", self.model)]

    def _card(self, name: str) -> oa.ModelCard:
        max_len = self.models.hosts[self.models.canonical(name)].engine.conv.max_context_len
        return oa.ModelCard(id=name, created=self.created, max_model_len=max_len)

    def _no_tokenizer(self) -> Response | None:
        return openai_response(ApiError(NO_TOKENIZER, 404)) if self.texts.tokenizer is None else None

    async def list_models(self, request: Request) -> Response:
        refused = self._no_tokenizer()
        if refused is not None:
            return refused
        cards = oa.ModelList(data=[self._card(n) for n in self.models.names()])
        return Response(cards.model_dump_json(), media_type=JSON)

    async def model(self, request: Request) -> Response:
        name = request.path_params["model"]
        refused = self._no_tokenizer()
        if refused is not None:
            return refused
        try:
            self.models.host(name, list_names=True)
        except ApiError as exc:
            return openai_response(exc)
        return Response(self._card(name).model_dump_json(), media_type=JSON)

    async def completions(self, request: Request) -> Response:
        return await self._generation(request, self.completion)

    async def chat_completions(self, request: Request) -> Response:
        return await self._generation(request, self.chat)

    async def _generation(self, request: Request, adapter: Adapter) -> Response:
        refused = self._no_tokenizer()
        return refused if refused is not None else await self.call.answer(request, adapter)
