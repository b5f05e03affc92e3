"""What a replica's generation routes share: one engine per generating model, the tokenizer, the metrics.

Models whose method an engine can run (``pyrt.llm.serves``) get an
:class:`pyrt.serve.llm_host.EngineHost` when the replica starts; with ``--tokenizer DIR`` the
tokenizer is loaded then too (never per request). The routes (:mod:`pyrt.serve.openai_routes`,
:mod:`pyrt.serve.generate_routes`) read a request body into its protocol's model
(:func:`pyrt.serve.validation.parse`), and :meth:`LlmService.start` submits it: the prompt's ids
(from the tokenizer, the chat template, or as sent) and the one
:class:`pyrt.llm.SamplingParams` the request makes, whose errors (and the engine's) name the
field the way the client spelled it. A client that disconnects while waiting for a whole answer
cancels its generation (:meth:`LlmService.collect`), whose slot is free at the engine's next
step. Every request counts in the replica's metrics (requests, errors by class) and every
generation's latencies in :mod:`pyrt.serve.llm_metrics`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from starlette.requests import Request

from pyrt.errors import InputError
from pyrt.llm import SamplingParams, serves
from pyrt.serve.events import watch_disconnect
from pyrt.serve.failures import ApiError
from pyrt.serve.llm_host import EngineHost, Job, Piece, pieces
from pyrt.serve.llm_metrics import GenerationMetrics
from pyrt.serve.text import TextStream, load_tokenizer
from pyrt.serve.validation import Body, parse

B = TypeVar("B", bound=Body)


class GenerationRequest(Protocol):
    """What :meth:`LlmService.start` needs of a protocol's request model."""

    def sampling_params(self, eos_ids: tuple[int, ...]) -> SamplingParams: ...

    def spelled(self, field: str) -> str: ...

    @property
    def stop_strings(self) -> tuple[str, ...]: ...


class LlmService:
    """The generating models of one replica's program (``read_body`` reads a request body within the limits)."""

    def __init__(self, program: Any, methods: Mapping[str, str], *, tokenizer: str | None,
                 max_queued: int | None, read_body: Callable[[Request], Awaitable[bytes]], metrics: Any,
                 draft: Any = None, draft_tokens: int = 4) -> None:
        self.tokenizer = load_tokenizer(tokenizer) if tokenizer else None
        self.read_body, self.metrics = read_body, metrics
        self.hosts: dict[str, EngineHost] = {}
        self.refused: dict[str, str] = {}  # model -> why it does not generate
        for name, method in methods.items():
            why = serves(program, method)
            if why is None:
                self.hosts[name] = EngineHost(program, method, name, max_queued, draft, draft_tokens)
            else:
                self.refused[name] = why
        self.generation = GenerationMetrics()
        metrics.hooks.append(lambda: self.generation.flush(self.hosts))

    def close(self) -> None:
        for host in self.hosts.values():
            host.close()

    def stats(self, name: str) -> dict[str, Any] | None:
        host = self.hosts.get(name)
        return None if host is None else self.generation.stats(name, host)

    def host(self, name: str, openai: bool) -> EngineHost:
        """``name``'s engine host; 404 naming the model (``openai``: listing the models that generate)."""
        host = self.hosts.get(name)
        if host is not None:
            return host
        self.metrics.error("", "UnknownModel")  # not the name: clients must not mint label values
        if name in self.refused:
            raise ApiError(f"model {name!r} does not generate: {self.refused[name]}", 404, param="model",
                           code="model_not_found")
        where = f"models are {sorted(self.hosts)}" if openai else "GET /v1/models lists the ones that generate"
        raise ApiError(f"no model {name!r}; {where}", 404, param="model", code="model_not_found")

    async def read(self, request: Request, model: type[B]) -> B:
        """The request's body as ``model`` (InputError naming the field the client sent)."""
        return parse(model, await self.read_body(request))

    def encode(self, text: str, field: str, **options: Any) -> list[int]:
        """``text``'s token ids (InputError naming ``field`` when the server has no tokenizer)."""
        if self.tokenizer is None:
            raise ApiError(f"{field} needs a tokenizer: start pyrt serve with --tokenizer DIR, or send input_ids",
                           param=field)
        return list(self.tokenizer.encode(text, **options))

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """The ids of ``messages`` through the tokenizer's chat template (the chat route has a tokenizer)."""
        tok = self.tokenizer
        if tok is None or not getattr(tok, "chat_template", None):
            raise ApiError("the tokenizer has no chat template: use /v1/completions", param="messages")
        try:
            text = tok.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
        except Exception as exc:  # jinja's TemplateError, the template's raise_exception
            raise ApiError(f"messages: the chat template refused them: {exc}", param="messages") from None
        return self.encode(text, "messages", add_special_tokens=False)

    def start(self, host: EngineHost, request: GenerationRequest, prompt_ids: Any) -> tuple[Job, TextStream | None]:
        """Submit ``request`` on ``prompt_ids``: its :class:`SamplingParams` and the engine's checks, errors named
        as the client spelled the field (InputError); BusyError past the queue's bound."""
        if request.stop_strings and self.tokenizer is None:
            raise ApiError("stop strings need a tokenizer: start pyrt serve with --tokenizer DIR, or give "
                           "token-id sequences", param="stop")
        try:
            job = host.submit(prompt_ids, request.sampling_params(self.eos(host)))
        except InputError as exc:
            if exc.field is None or isinstance(exc, ApiError):
                raise
            raise exc.renamed(request.spelled(exc.field)) from None
        return job, (TextStream(self.tokenizer, request.stop_strings) if self.tokenizer is not None else None)

    def eos(self, host: EngineHost) -> tuple[int, ...]:
        """The file's EOS ids, and the tokenizer's EOS where it is in the vocabulary (as vLLM stops at both)."""
        conv = host.engine.conv
        extra = getattr(self.tokenizer, "eos_token_id", None)
        eos = tuple(conv.eos_ids)
        if isinstance(extra, int) and 0 <= extra < conv.vocab_size and extra not in eos:
            eos += (extra,)
        return eos

    def ended(self, job: Job) -> None:
        """Cancel the generation if it is still going (the client left); record its latencies."""
        if not job.generation.done:
            job.cancel()
        times = job.token_times
        ttft = times[0] - job.started if times else None
        self.generation.finished(job.host.model, ttft, [b - a for a, b in zip(times, times[1:], strict=False)])

    def failed(self, name: str, exc: BaseException) -> None:
        """Count a failed request (an unknown model was counted where it was found)."""
        if not (isinstance(exc, ApiError) and exc.status == 404):
            self.metrics.error(name, type(exc).__name__)

    async def collect(self, job: Job, text: TextStream | None, request: Request) -> tuple[list[Piece], Piece]:
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
            self.ended(job)
        return got, got[-1]
