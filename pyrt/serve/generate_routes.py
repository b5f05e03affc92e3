"""Triton's generate routes of a replica: ``POST /v2/models/{name}/generate`` and ``/generate_stream``.

Bodies: :mod:`pyrt.serve.generate`. Failures are answered in the Open Inference Protocol's shape
(``{"error": "text"}``, the text naming the field as the client spelled it); a streamed answer's
failure after the first event is its last event.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from pyrt.serve.events import EventStream, sse, sse_of
from pyrt.serve.failures import error_response, message_of
from pyrt.serve.generate import FinalEvent, GenerateRequest, TokenEvent, Usage
from pyrt.serve.llm_host import Job, Piece, pieces
from pyrt.serve.llm_service import LlmService
from pyrt.serve.routes import route
from pyrt.serve.text import TextStream

NONE = {"id", "text_output"}  # left out of an event's JSON when None (no request id; no tokenizer)


class GenerateRoutes:
    """The generate routes over ``service``'s engines."""

    def __init__(self, service: LlmService) -> None:
        self.service = service

    def routes(self) -> list[Route]:
        return [route("POST", "/v2/models/{name}/generate", self.generate),
                route("POST", "/v2/models/{name}/generate_stream", self.generate_stream)]

    async def generate(self, request: Request) -> Response:
        return await self._answer(request, stream=False)

    async def generate_stream(self, request: Request) -> Response:
        return await self._answer(request, stream=True)

    async def _answer(self, request: Request, stream: bool) -> Response:
        name = request.path_params["name"]
        try:
            host = self.service.host(name, openai=False)
            name = host.model
            self.service.metrics.request(name)
            body = await self.service.read(request, GenerateRequest)
            prompt = await self._prompt(body, host.engine.conv.max_context_len)
            job, text = await self.service.start(host, body, prompt,
                                                 lambda: body.sampling_params(self.service.eos(host)))
        except Exception as exc:  # answered, never raised: the replica keeps serving
            self.service.failed(name if name in self.service.hosts else "", exc)
            return error_response(exc)
        if stream:
            return EventStream(self._events(name, body, job, text))
        try:
            got, last = await self.service.collect(job, text, request)
        except Exception as exc:
            self.service.failed(name, exc)
            return error_response(exc)
        tokens = [t for p in got for t in p.tokens][:last.consumed]
        whole = "".join(p.text for p in got) if text is not None else None
        final = final_event(name, body, last, tokens, len(job.generation.prompt), whole)
        return Response(final.model_dump_json(exclude=none_of(final)), media_type="application/json")

    async def _prompt(self, body: GenerateRequest, context: int) -> list[Any]:
        """The prompt's token ids: ``input_ids`` as sent (checked where submitted), or ``text_input`` encoded (off
        the event loop; a text sure to overflow the cache is refused before)."""
        if body.text_input is None:
            return body.input_ids or []
        return await self.service.encode_async(body.text_input, "text_input", context)

    async def _events(self, name: str, body: GenerateRequest, job: Job, text: TextStream | None
                      ) -> AsyncIterator[bytes]:
        tokens: list[int] = []
        try:
            async for piece in pieces(job, text):
                if piece.finish_reason is not None:
                    rest = piece.text if text is not None else None
                    final = final_event(name, body, piece, tokens, len(job.generation.prompt), rest)
                    yield sse_of(final, leave_out=none_of(final))
                    return
                tokens.extend(piece.tokens)
                event = TokenEvent(model_name=name, id=body.id, token_id=piece.tokens[0], index=len(tokens) - 1,
                                   text_output=piece.text if text is not None else None)
                yield sse_of(event, leave_out=none_of(event))
        except Exception as exc:  # the status went with the first event: the error is the last one
            self.service.failed(name, exc)
            yield sse(json.dumps({"error": message_of(exc)}, ensure_ascii=False).encode())
        finally:
            self.service.ended(job)


def final_event(model: str, body: GenerateRequest, piece: Piece, tokens: list[int], prompt: int, text: str | None
                ) -> FinalEvent:
    """The last event (``text``: the text held back until the end) or, with the whole text, the response."""
    return FinalEvent(model_name=model, id=body.id, finish_reason=piece.finish_reason, token_ids=tokens,
                      timings=piece.result.timings.as_dict() if piece.result is not None else {},
                      usage=Usage(prompt_tokens=prompt, completion_tokens=len(tokens)), text_output=text)


def none_of(event: TokenEvent | FinalEvent) -> set[str]:
    """The optional fields of ``event`` that are None (left out of its JSON)."""
    return {name for name in NONE if getattr(event, name) is None}
