"""A replica's generation routes: OpenAI's ``/v1`` API and Triton's generate extension, over one engine per model.

Models whose method an engine can run (``pyrt.llm.serving.serves``) get an
:class:`pyrt.serve.llm_host.EngineHost` when the replica starts; with ``--tokenizer DIR`` the
tokenizer is loaded then too (never per request). Routes:

- ``GET /v1/models``, ``GET /v1/models/{model}``, ``POST /v1/completions``,
  ``POST /v1/chat/completions`` (need the tokenizer; :mod:`pyrt.serve.openai_api`);
- ``POST /v2/models/{name}/generate`` and ``/generate_stream`` (:mod:`pyrt.serve.generate`).

Streamed answers are server-sent events (:class:`EventStream`); a client that disconnects, from
a stream or while waiting for a whole answer, cancels its generation, whose slot is free at the
engine's next step. Every request counts in the replica's metrics (requests, errors by class)
and every generation's latencies in :mod:`pyrt.serve.llm_metrics`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from pyrt.llm.serving import serves
from pyrt.serve import generate as v2
from pyrt.serve import openai_api as oa
from pyrt.serve.failures import ApiError, error_response, message_of, openai_body, openai_response
from pyrt.serve.llm_host import EngineHost, Job, Piece, pieces
from pyrt.serve.llm_metrics import GenerationMetrics
from pyrt.serve.text import TextStream, load_tokenizer

log = logging.getLogger("pyrt.serve")
MAX_MESSAGES = 10_000  # ASGI messages read while watching for a disconnect (after the body there are none)
NO_TOKENIZER = "the OpenAI routes need a tokenizer: start pyrt serve with --tokenizer DIR"


def sse(event: Any) -> bytes:
    return f"data: {json.dumps(event, ensure_ascii=False)}\n\n".encode()


DONE = b"data: [DONE]\n\n"


async def watch_disconnect(receive: Receive) -> bool:
    """Wait until the client disconnects (True); False after :data:`MAX_MESSAGES` other messages."""
    for _ in range(MAX_MESSAGES):
        message = await receive()
        if message.get("type") == "http.disconnect":
            return True
    return False


class EventStream(Response):
    """Server-sent events from ``events``; a client that disconnects ends the stream at once.

    Starlette's ``StreamingResponse`` notices a gone client only at its next write on ASGI 2.4
    servers; a generation waiting for a slot writes nothing for a while, so this one listens.
    Closing ``events`` (an async generator) runs its ``finally``, which cancels the generation.
    """

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[bytes]) -> None:
        self.events = events
        self.status_code = 200
        self.background = None
        self.init_headers({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        sending = asyncio.ensure_future(self._send_all(send))
        watching = asyncio.ensure_future(watch_disconnect(receive))
        try:
            await asyncio.wait({sending, watching}, return_when=asyncio.FIRST_COMPLETED)
            if not sending.done() and not watching.result():  # no disconnect message will come
                await sending
        finally:
            for task in (sending, watching):
                task.cancel()
            await asyncio.gather(sending, watching, return_exceptions=True)
            await self.events.aclose()  # type: ignore[attr-defined]

    async def _send_all(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        try:
            async for data in self.events:
                await send({"type": "http.response.body", "body": data, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # the client went away mid-write
            return


class LlmRoutes:
    """The generation routes of one replica's program (``read_body`` reads a request body within the limit)."""

    def __init__(self, program: Any, methods: Mapping[str, str], *, tokenizer: str | None,
                 max_queued: int | None, read_body: Callable[[Request], Awaitable[bytes]], metrics: Any) -> None:
        self.tokenizer = load_tokenizer(tokenizer) if tokenizer else None
        self.read_body, self.metrics = read_body, metrics
        self.hosts: dict[str, EngineHost] = {}
        self.refused: dict[str, str] = {}  # model -> why it does not generate
        for name, method in methods.items():
            why = serves(program, method)
            if why is None:
                self.hosts[name] = EngineHost(program, method, name, max_queued)
            else:
                self.refused[name] = why
        self.created = oa.now()
        self.generation = GenerationMetrics()
        metrics.hooks.append(lambda: self.generation.flush(self.hosts))

    def close(self) -> None:
        for host in self.hosts.values():
            host.close()

    def stats(self, name: str) -> dict[str, Any] | None:
        host = self.hosts.get(name)
        return None if host is None else self.generation.stats(name, host)

    # -- shared -----------------------------------------------------------------------------------

    def _host(self, name: str, openai: bool) -> EngineHost:
        host = self.hosts.get(name)
        if host is not None:
            return host
        self.metrics.error("", "UnknownModel")  # not the name: clients must not mint label values
        if name in self.refused:
            raise ApiError(f"model {name!r} does not generate: {self.refused[name]}", 404, param="model",
                           code="model_not_found")
        where = f"models are {sorted(self.hosts)}" if openai else "GET /v1/models lists the ones that generate"
        raise ApiError(f"no model {name!r}; {where}", 404, param="model", code="model_not_found")

    async def _json(self, request: Request) -> Any:
        data = await self.read_body(request)
        try:
            return json.loads(data)
        except (UnicodeDecodeError, ValueError) as exc:
            raise ApiError(f"the request is not valid JSON ({exc})") from None
        except RecursionError:  # json's parser recurses per nesting level: [[[[...]]]] exhausts the stack
            raise ApiError("the request's JSON nests too deeply") from None

    def _prompt(self, spec: oa.Spec) -> Any:
        tok = self.tokenizer
        if spec.messages is not None:
            assert tok is not None  # the chat route needs it
            if not getattr(tok, "chat_template", None):
                raise ApiError("the tokenizer has no chat template: use /v1/completions", param="messages")
            try:
                text = tok.apply_chat_template(spec.messages, tokenize=False, add_generation_prompt=True)
            except Exception as exc:  # jinja's TemplateError, the template's raise_exception
                raise ApiError(f"messages: the chat template refused them: {exc}", param="messages") from None
            return list(tok.encode(text, add_special_tokens=False))
        if spec.text is not None:
            if tok is None:
                raise ApiError("text_input needs a tokenizer: start pyrt serve with --tokenizer DIR, or send "
                               "input_ids", param="text_input")
            return list(tok.encode(spec.text))
        return spec.ids

    def _start(self, host: EngineHost, spec: oa.Spec) -> tuple[Job, TextStream | None]:
        """Submit ``spec`` (every value checked first: InputError naming the request's field; BusyError)."""
        options = dict(spec.options)
        if spec.stops and self.tokenizer is None:
            raise ApiError("stop strings need a tokenizer: start pyrt serve with --tokenizer DIR, or give "
                           "token-id sequences", param="stop")
        if options.get("eos_ids") is None:
            options["eos_ids"] = [] if spec.ignore_eos else self._eos(host)
        job = host.submit(self._prompt(spec), names=spec.names, **options)
        return job, (TextStream(self.tokenizer, spec.stops) if self.tokenizer is not None else None)

    def _eos(self, host: EngineHost) -> list[int]:
        """The file's EOS ids, and the tokenizer's EOS where it is in the vocabulary (as vLLM stops at both)."""
        conv = host.engine.conv
        extra = getattr(self.tokenizer, "eos_token_id", None)
        eos = list(conv.eos_ids)
        if isinstance(extra, int) and 0 <= extra < conv.vocab_size and extra not in eos:
            eos.append(extra)
        return eos

    def _ended(self, job: Job) -> None:
        """Cancel the generation if it is still going (the client left); record its latencies."""
        if not job.generation.done:
            job.cancel()
        times = job.token_times[:]
        ttft = times[0] - job.started if times else None
        self.generation.finished(job.host.model, ttft, [b - a for a, b in zip(times, times[1:], strict=False)])

    def _failed(self, name: str, exc: BaseException) -> None:
        if not (isinstance(exc, ApiError) and exc.status == 404):
            self.metrics.error(name, type(exc).__name__)

    async def _collect(self, job: Job, text: TextStream | None, request: Request) -> tuple[list[Piece], Piece]:
        """Every piece of a whole (not streamed) answer; a client that disconnects meanwhile cancels it."""
        watcher = asyncio.ensure_future(watch_disconnect(request.receive))

        def gone(task: asyncio.Future[bool]) -> None:
            if not task.cancelled() and task.exception() is None and task.result():
                job.cancel()

        watcher.add_done_callback(gone)
        got: list[Piece] = []
        try:
            async for piece in pieces(job, text):
                got.append(piece)
        finally:
            watcher.cancel()
            self._ended(job)
        return got, got[-1]

    # -- OpenAI -----------------------------------------------------------------------------------

    async def models(self, request: Request) -> Response:
        if self.tokenizer is None:
            return openai_response(ApiError(NO_TOKENIZER, 404))
        return JSONResponse({"object": "list", "data": [self._card(n) for n in sorted(self.hosts)]})

    async def model(self, request: Request, model: str) -> Response:
        try:
            if self.tokenizer is None:
                raise ApiError(NO_TOKENIZER, 404)
            self._host(model, openai=True)
        except ApiError as exc:
            return openai_response(exc)
        return JSONResponse(self._card(model))

    def _card(self, name: str) -> dict[str, Any]:
        return oa.model_card(name, self.created, self.hosts[name].engine.conv.max_context_len)

    async def completions(self, request: Request) -> Response:
        return await self._openai(request, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        return await self._openai(request, chat=True)

    async def _openai(self, request: Request, chat: bool) -> Response:
        fields = oa.CHAT_FIELDS if chat else oa.COMPLETION_FIELDS
        name = ""
        try:
            if self.tokenizer is None:
                raise ApiError(NO_TOKENIZER, 404)
            body = await self._json(request)
            spec = oa.chat_spec(body) if chat else oa.completion_spec(body)
            host = self._host(spec.model, openai=True)
            name = spec.model
            self.metrics.request(name)
            job, text = self._start(host, spec)
        except Exception as exc:  # answered, never raised: the replica keeps serving
            self._failed(name, exc)
            return openai_response(exc, fields)
        rid, created = oa.new_id(chat), oa.now()
        if spec.stream:
            return EventStream(self._openai_events(chat, spec, job, text, rid, created))
        try:
            got, last = await self._collect(job, text, request)
        except Exception as exc:
            self._failed(name, exc)
            return openai_response(exc, fields)
        use = oa.usage(len(job.generation.prompt), last.consumed)
        answer = "".join(p.text for p in got)
        shape = oa.chat if chat else oa.completion
        return JSONResponse(shape(rid, created, spec.model, answer, last.finish_reason, use))

    async def _openai_events(self, chat: bool, spec: oa.Spec, job: Job, text: TextStream | None, rid: str,
                             created: int) -> AsyncIterator[bytes]:
        model, usage = spec.model, spec.include_usage
        try:
            if chat:
                yield sse(oa.chunk(True, rid, created, model, {"role": "assistant", "content": ""}, None, usage))
            async for piece in pieces(job, text):
                if not piece.text and piece.finish_reason is None:
                    continue
                delta: Any = ({"content": piece.text} if piece.text else {}) if chat else piece.text
                event = oa.chunk(chat, rid, created, model, delta, piece.finish_reason, usage)
                if spec.continuous_usage:
                    event["usage"] = oa.usage(len(job.generation.prompt), piece.consumed)
                yield sse(event)
                if piece.finish_reason is not None and usage:
                    use = oa.usage(len(job.generation.prompt), piece.consumed)
                    yield sse(oa.usage_chunk(chat, rid, created, model, use))
        except Exception as exc:  # the status went with the first event: the error is the last one
            self._failed(model, exc)
            yield sse(openai_body(exc))
        finally:
            self._ended(job)
        yield DONE

    # -- Triton's generate extension --------------------------------------------------------------

    async def generate(self, request: Request, name: str, stream: bool) -> Response:
        try:
            host = self._host(name, openai=False)
            self.metrics.request(name)
            spec = v2.generate_spec(name, await self._json(request))
            job, text = self._start(host, spec)
        except Exception as exc:  # answered, never raised: the replica keeps serving
            self._failed(name if name in self.hosts else "", exc)
            return error_response(exc)
        if stream:
            return EventStream(self._v2_events(name, spec, job, text))
        try:
            got, last = await self._collect(job, text, request)
        except Exception as exc:
            self._failed(name, exc)
            return error_response(exc)
        tokens = [t for p in got for t in p.tokens][:last.consumed]
        whole = "".join(p.text for p in got) if text is not None else None
        return JSONResponse(v2.final_event(name, spec, last, tokens, len(job.generation.prompt), whole))

    async def _v2_events(self, name: str, spec: oa.Spec, job: Job, text: TextStream | None
                         ) -> AsyncIterator[bytes]:
        tokens: list[int] = []
        try:
            async for piece in pieces(job, text):
                if piece.finish_reason is not None:
                    rest = piece.text if text is not None else None
                    yield sse(v2.final_event(name, spec, piece, tokens, len(job.generation.prompt), rest))
                    return
                tokens.extend(piece.tokens)
                yield sse(v2.token_event(name, spec, piece, len(tokens) - 1, text is not None))
        except Exception as exc:  # the status went with the first event: the error is the last one
            self._failed(name, exc)
            yield sse({"error": message_of(exc)})
        finally:
            self._ended(job)
