"""Triton's generate routes of a replica: ``POST /v2/models/{name}/generate`` and ``/generate_stream``.

Bodies: :mod:`pyrt.serve.generate`. :class:`GenerateAdapter` is the protocol's side of a
:class:`pyrt.serve.generation_call.GenerationCall`: the model named in the path (found before the
body is read), the prompt as ``text_input`` (tokenized off the event loop; a text sure to
overflow the cache is refused before) or ``input_ids`` as sent, one sequence, and
:class:`GenerateReply`'s events and response. Failures are answered in the Open Inference
Protocol's shape (``{"error": "text"}``, the text naming the field as the client spelled it); a
streamed answer's failure after the first event is its last event.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from pyrt.serve.events import sse, sse_of
from pyrt.serve.failures import error_response, message_of
from pyrt.serve.generate import FinalEvent, GenerateRequest, TokenEvent, Usage
from pyrt.serve.generation_call import Collected, GenerationCall, MakeParams, Started
from pyrt.serve.llm_host import EngineHost, Piece, pieces
from pyrt.serve.routes import route
from pyrt.serve.text import TextStream
from pyrt.serve.tokenization import Tokenization

NONE = {"id", "text_output"}  # left out of an event's JSON when None (no request id; no tokenizer)


class GenerateRoutes:
    """The generate routes, each one :meth:`GenerationCall.answer` with its adapter."""

    def __init__(self, call: GenerationCall) -> None:
        self.call = call
        self.whole, self.stream = GenerateAdapter(call.texts, stream=False), GenerateAdapter(call.texts, stream=True)

    def routes(self) -> list[Route]:
        return [route("POST", "/v2/models/{name}/generate", self.generate),
                route("POST", "/v2/models/{name}/generate_stream", self.generate_stream)]

    async def generate(self, request: Request) -> Response:
        return await self.call.answer(request, self.whole)

    async def generate_stream(self, request: Request) -> Response:
        return await self.call.answer(request, self.stream)


class GenerateAdapter:
    """The generate extension's side of a generation call (``stream``: the ``generate_stream`` route's)."""

    body = GenerateRequest
    list_names = False

    def __init__(self, texts: Tokenization, stream: bool) -> None:
        self.texts, self.stream = texts, stream

    def model(self, request: Request, body: GenerateRequest | None = None) -> str | None:
        name: str = request.path_params["name"]
        return name

    async def prompt(self, body: GenerateRequest, host: EngineHost) -> list[Any]:
        """``input_ids`` as sent (checked where submitted), or ``text_input`` encoded."""
        if body.text_input is None:
            return body.input_ids or []
        return await self.texts.encode_async(body.text_input, "text_input", host.engine.conv.max_context_len)

    async def params(self, body: GenerateRequest, host: EngineHost) -> list[MakeParams]:
        conv = host.engine.conv
        return [lambda: body.sampling_params(self.texts.eos(conv.eos_ids, conv.vocab_size))]

    def text(self, body: GenerateRequest) -> TextStream | None:
        return self.texts.text_stream(body.stop_strings)

    def streamed(self, body: GenerateRequest) -> bool:
        return self.stream

    def reply(self, body: GenerateRequest, model: str, prompt: list[Any]) -> GenerateReply:
        return GenerateReply(body, model)

    def refusal(self, exc: BaseException) -> Response:
        return error_response(exc)


class GenerateReply:
    """One generate answer: a token event per new token and the final event, or the response (the final event
    with the whole text)."""

    ending = b""

    def __init__(self, body: GenerateRequest, model: str) -> None:
        self.body, self.model = body, model

    def whole(self, started: Started, results: Collected) -> Response:
        (job, text), (got, last) = started[0], results[0]
        tokens = [t for p in got for t in p.tokens][:last.consumed]
        whole = "".join(p.text for p in got) if text is not None else None
        final = final_event(self.model, self.body, last, tokens, len(job.generation.prompt), whole)
        return Response(final.model_dump_json(exclude=none_of(final)), media_type="application/json")

    async def events(self, started: Started) -> AsyncIterator[bytes]:
        ((job, text),) = started
        tokens: list[int] = []
        async for piece in pieces(job, text):
            if piece.finish_reason is not None:
                rest = piece.text if text is not None else None
                final = final_event(self.model, self.body, piece, tokens, len(job.generation.prompt), rest)
                yield sse_of(final, leave_out=none_of(final))
                return
            tokens.extend(piece.tokens)
            event = TokenEvent(model_name=self.model, id=self.body.id, token_id=piece.tokens[0],
                               index=len(tokens) - 1, text_output=piece.text if text is not None else None)
            yield sse_of(event, leave_out=none_of(event))

    def error_event(self, exc: BaseException) -> bytes:
        return sse(json.dumps({"error": message_of(exc)}, ensure_ascii=False).encode())


def final_event(model: str, body: GenerateRequest, piece: Piece, tokens: list[int], prompt: int, text: str | None
                ) -> FinalEvent:
    """The last event (``text``: the text held back until the end) or, with the whole text, the response."""
    return FinalEvent(model_name=model, id=body.id, finish_reason=piece.finish_reason, token_ids=tokens,
                      timings=piece.result.timings.as_dict() if piece.result is not None else {},
                      usage=Usage(prompt_tokens=prompt, completion_tokens=len(tokens)), text_output=text)


def none_of(event: TokenEvent | FinalEvent) -> set[str]:
    """The optional fields of ``event`` that are None (left out of its JSON)."""
    return {name for name in NONE if getattr(event, name) is None}
