"""One generation call for every protocol: find the model, read the body, submit, stream or collect, count.

Each route that generates (OpenAI's completions and chat completions, Triton's generate and
generate_stream) hands :meth:`GenerationCall.answer` its request and its protocol's
:class:`Adapter`, which owns what differs between protocols: the request model, where the model
is named, the prompt, each sequence's :class:`pyrt.llm.SamplingParams`, the text options, the
answer's shape (its :class:`Reply`) and the errors'. The rest is written here once: the model is
looked up (404s: :class:`pyrt.serve.llm_models.LlmModels`; one named in the path before the body
is read), the body is read within the replica's limits and parsed
(:func:`pyrt.serve.validation.parse`: InputError naming the field as the client sent it), one
generation per sequence is submitted on the prompt (all or none; an InputError of the parameters
or of the engine names the field as the client spelled it), then the reply streams (a failure
after the first event is the last event) or the call collects every piece (a client that
disconnects meanwhile cancels the generations, whose slots are free at the engine's next step).
Every request counts in the replica's metrics (requests, errors by class) and every generation's
latencies in :mod:`pyrt.serve.llm_metrics`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import Response

from pyrt.errors import InputError
from pyrt.llm import SamplingParams
from pyrt.serve.events import EventStream, watch_disconnect
from pyrt.serve.failures import ApiError
from pyrt.serve.llm_host import EngineHost, Job, Piece, pieces
from pyrt.serve.llm_metrics import GenerationMetrics
from pyrt.serve.llm_models import LlmModels
from pyrt.serve.text import TextStream
from pyrt.serve.tokenization import Tokenization
from pyrt.serve.validation import Body, parse

Started = list[tuple[Job, TextStream | None]]  # each sequence's job and its text (None: no tokenizer)
Collected = list[tuple[list[Piece], Piece]]  # each sequence's pieces and its last piece
MakeParams = Callable[[], SamplingParams]  # one sequence's parameters, made where it is submitted


class Generating(Protocol):
    """What the call needs of a protocol's request model."""

    def spelled(self, field: str) -> str: ...

    @property
    def stop_strings(self) -> tuple[str, ...]: ...


class Reply(Protocol):
    """One request's answer in its protocol's shape."""

    @property
    def ending(self) -> bytes:
        """What a stream sends after its last event (OpenAI's ``[DONE]``; empty: nothing)."""

    def whole(self, started: Started, results: Collected) -> Response:
        """The whole (not streamed) answer."""

    def events(self, started: Started) -> AsyncIterator[bytes]:
        """The streamed answer's events (server-sent); a failure is raised."""

    def error_event(self, exc: BaseException) -> bytes:
        """The last event of a stream that failed after its first."""


class Adapter(Protocol):
    """One protocol's side of a generation call: its prompt, parameters, rendering and field spelling."""

    @property
    def body(self) -> type[Body]:
        """The request model a body is read as."""

    @property
    def list_names(self) -> bool:
        """Whether an unknown model's 404 lists the names that generate (else it points to ``GET /v1/models``)."""

    def model(self, request: Request, body: Any = None) -> str | None:
        """The model the request names: in its path, or in ``body`` once read (None: not known before)."""

    async def prompt(self, body: Any, host: EngineHost) -> list[Any]:
        """The prompt's token ids (checked against the vocabulary where they are submitted)."""

    async def params(self, body: Any, host: EngineHost) -> list[MakeParams]:
        """What makes each sequence's parameters (one per sequence of the request)."""

    def text(self, body: Any) -> TextStream | None:
        """A new text stream for one sequence (None without a tokenizer)."""

    def streamed(self, body: Any) -> bool: ...

    def reply(self, body: Any, model: str, prompt: list[Any]) -> Reply: ...

    def refusal(self, exc: BaseException) -> Response:
        """The answer to a request that failed before its first byte."""


class GenerationCall:
    """The generation call of one replica: over ``models``' engines, with ``texts``; ``metrics`` (the replica's
    :class:`pyrt.serve.metrics.ServeMetrics`) counts the requests; ``read_body`` reads a body within the limits."""

    def __init__(self, models: LlmModels, texts: Tokenization, metrics: Any,
                 read_body: Callable[[Request], Awaitable[bytes]]) -> None:
        self.models, self.texts, self.metrics, self.read_body = models, texts, metrics, read_body
        self.latencies = GenerationMetrics(metrics.registry)
        metrics.hooks.append(lambda: self.latencies.flush(models.hosts))

    def stats(self, name: str) -> dict[str, Any] | None:
        """The stats route's ``generation`` object of model ``name`` (None: it does not generate)."""
        host = self.models.hosts.get(name)
        return None if host is None else self.latencies.stats(name, host)

    async def answer(self, request: Request, adapter: Adapter) -> Response:
        """Answer one generation request of ``adapter``'s protocol (failures in its shape, never raised)."""
        name = ""
        try:
            host, body = await self._read(request, adapter)
            name = host.model
            prompt = await adapter.prompt(body, host)
            started = await self.start(host, body, prompt, await adapter.params(body, host), adapter.text)
        except Exception as exc:  # answered, never raised: the replica keeps serving
            self.failed(name, exc)
            return adapter.refusal(exc)
        reply = adapter.reply(body, name, prompt)
        if adapter.streamed(body):
            return EventStream(self._events(reply, started, name))
        try:
            results = await self.collect(started, request)
        except Exception as exc:
            self.failed(name, exc)
            return adapter.refusal(exc)
        return reply.whole(started, results)

    async def _read(self, request: Request, adapter: Adapter) -> tuple[EngineHost, Any]:
        """The model's engine host and the request's body. A model the path names is found (and the request
        counted) before the body is read: an unknown one is 404 whatever the body holds."""
        named = adapter.model(request)
        host = None if named is None else self._found(named, adapter)
        body = parse(adapter.body, await self.read_body(request))
        return host or self._found(adapter.model(request, body), adapter), body

    def _found(self, name: str | None, adapter: Adapter) -> EngineHost:
        host = self.models.host(name, adapter.list_names)
        self.metrics.request(host.model)
        return host

    async def start(self, host: EngineHost, body: Generating, prompt: Any, params: Sequence[MakeParams],
                    text: Callable[[Any], TextStream | None]) -> Started:
        """Submit one generation per ``params`` on ``prompt``, each with its ``text(body)`` stream: all or none
        (those submitted before a refusal are cancelled). A refusal of the parameters (InputError) names the
        field as ``body`` spells it; BusyError past the queue's bound."""
        if body.stop_strings and self.texts.tokenizer is None:
            raise ApiError("stop strings need a tokenizer: start pyrt serve with --tokenizer DIR, or give "
                           "token-id sequences", param="stop")
        out: Started = []
        try:
            for make in params:
                out.append((host.submit(prompt, make()), text(body)))
            for job, _ in out:  # the core's verdict: queued, or refused (BusyError past the queue's bound)
                await job.accepted()
        except InputError as exc:
            for job, _ in out:
                job.cancel()
            if exc.field is None or isinstance(exc, ApiError):
                raise
            raise exc.renamed(body.spelled(exc.field)) from None
        except BaseException:
            for job, _ in out:
                job.cancel()
            raise
        return out

    async def collect(self, started: Started, request: Request) -> Collected:
        """Every piece of each generation of a whole (not streamed) answer, in order; a client that disconnects
        meanwhile cancels them."""
        watcher = asyncio.ensure_future(watch_disconnect(request.receive))

        def gone(task: asyncio.Future[bool]) -> None:
            if not task.cancelled() and task.exception() is None and task.result():
                for job, _ in started:
                    job.cancel()

        async def one(job: Job, text: TextStream | None) -> tuple[list[Piece], Piece]:
            got = [piece async for piece in pieces(job, text)]
            return got, got[-1]

        watcher.add_done_callback(gone)
        try:
            return list(await asyncio.gather(*(one(job, text) for job, text in started)))
        finally:
            watcher.cancel()
            for job, _ in started:
                self.ended(job)

    async def _events(self, reply: Reply, started: Started, name: str) -> AsyncIterator[bytes]:
        events = reply.events(started)
        try:
            async for event in events:
                yield event
        except Exception as exc:  # the status went with the first event: the error is the last one
            self.failed(name, exc)
            yield reply.error_event(exc)
        finally:
            for job, _ in started:
                self.ended(job)
            await events.aclose()  # type: ignore[attr-defined]
        if reply.ending:
            yield reply.ending

    def ended(self, job: Job) -> None:
        """Cancel the generation if it is still going (the client left); record its latencies."""
        if not job.generation.done:
            job.cancel()
        times = job.token_times
        ttft = times[0] - job.started if times else None
        self.latencies.finished(job.host.model, ttft, [b - a for a, b in zip(times, times[1:], strict=False)])

    def failed(self, name: str, exc: BaseException) -> None:
        """Count a failed request (an unknown model was counted where it was found)."""
        if not (isinstance(exc, ApiError) and exc.status == 404):
            self.metrics.error(name, type(exc).__name__)
