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
import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from starlette.requests import Request

from pyrt.errors import InputError
from pyrt.llm import SamplingParams, serves
from pyrt.llm.config import GenerationConfig
from pyrt.serve.events import watch_disconnect
from pyrt.serve.failures import ApiError
from pyrt.serve.llm_host import EngineHost, Job, Piece, pieces
from pyrt.serve.llm_metrics import GenerationMetrics
from pyrt.serve.structured import Grammars
from pyrt.serve.text import TextStream, load_tokenizer
from pyrt.serve.tokens import TokenTexts, generation_defaults, most_chars
from pyrt.serve.validation import Body, parse

B = TypeVar("B", bound=Body)
TOKENIZE_THREADS = 2  # tokenizing and chat templates run here, off the event loop


class GenerationRequest(Protocol):
    """What :meth:`LlmService.start` needs of a protocol's request model."""

    def spelled(self, field: str) -> str: ...

    @property
    def stop_strings(self) -> tuple[str, ...]: ...


def text_options(request: Any) -> dict[str, bool]:
    """A request's text options (vLLM's ``skip_special_tokens``, ``include_stop_str_in_output``) where it has them."""
    return {"skip_special_tokens": bool(getattr(request, "skip_special_tokens", True)),
            "include_stop": bool(getattr(request, "include_stop_str_in_output", False))}


class LlmService:
    """The generating models of one replica's program (``read_body`` reads a request body within the limits)."""

    def __init__(self, program: Any, methods: Mapping[str, str], *, tokenizer: str | None,
                 generation: GenerationConfig, read_body: Callable[[Request], Awaitable[bytes]], metrics: Any,
                 aliases: Mapping[str, str] | None = None) -> None:
        self.tokenizer = load_tokenizer(tokenizer) if tokenizer else None
        self.defaults = generation_defaults(tokenizer)  # generation_config.json's sampling defaults
        self.token_texts = TokenTexts(self.tokenizer) if self.tokenizer is not None else None
        self.most_chars = most_chars(self.tokenizer) if self.tokenizer is not None else 1
        self.pool = ThreadPoolExecutor(TOKENIZE_THREADS, thread_name_prefix="pyrt-tokenize")
        self._grammars: dict[int, Grammars] = {}  # vocabulary size -> the grammar compiler (structured output)
        self.read_body, self.metrics = read_body, metrics
        self.hosts: dict[str, EngineHost] = {}
        self.refused: dict[str, str] = {}  # model -> why it does not generate
        self.aliases = dict(aliases or {})  # another name -> the model it names (pyrt serve --name NAME ALIAS...)
        for name, method in methods.items():
            why = serves(program, method)
            if why is None:
                self.hosts[name] = EngineHost(program, method, name, generation)
            else:
                self.refused[name] = why
        self.generation = GenerationMetrics(metrics.registry)
        metrics.hooks.append(lambda: self.generation.flush(self.hosts))

    def close(self) -> None:
        for host in self.hosts.values():
            host.close()
        self.pool.shutdown(wait=False, cancel_futures=True)

    def stats(self, name: str) -> dict[str, Any] | None:
        host = self.hosts.get(name)
        return None if host is None else self.generation.stats(name, host)

    def grammars(self, host: EngineHost) -> Grammars:
        """The grammar compiler for ``host``'s vocabulary (structured output, forced tool calls)."""
        vocab = host.engine.conv.vocab_size
        if vocab not in self._grammars:
            self._grammars[vocab] = Grammars(self.tokenizer, vocab)
        return self._grammars[vocab]

    def canonical(self, name: str) -> str:
        """The model ``name`` names (itself, or the model it is an alias of)."""
        return self.aliases.get(name, name)

    def names(self) -> list[str]:
        """Every name of a model that generates (aliases too), sorted."""
        return sorted([*self.hosts, *(a for a, m in self.aliases.items() if m in self.hosts)])

    def host(self, name: str, openai: bool) -> EngineHost:
        """``name``'s engine host (an alias's model's); 404 naming the model (``openai``: listing the models that
        generate)."""
        host = self.hosts.get(self.canonical(name))
        if host is not None:
            return host
        self.metrics.error("", "UnknownModel")  # not the name: clients must not mint label values
        if name in self.refused:
            raise ApiError(f"model {name!r} does not generate: {self.refused[name]}", 404, param="model",
                           code="model_not_found")
        where = f"models are {self.names()}" if openai else "GET /v1/models lists the ones that generate"
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

    def check_length(self, chars: int, field: str, context: int | None) -> None:
        """Refuse a text of ``chars`` characters that is sure to be more tokens than ``context`` (before any
        tokenizing: each token stands for at most ``most_chars`` characters)."""
        if context is not None and chars > context * self.most_chars:
            least = -(-chars // self.most_chars)
            raise InputError(f"{field} has {chars} characters: at least {least} tokens, more than the cache's "
                             f"{context} positions (get_max_context_len)", field=field)

    async def off_loop(self, work: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``work(*args, **kwargs)`` on the tokenizing threads (the event loop serves other requests meanwhile)."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, functools.partial(work, *args, **kwargs))

    async def encode_async(self, text: str, field: str, context: int | None = None, **options: Any) -> list[int]:
        """:meth:`encode` off the event loop, after :meth:`check_length`."""
        self.check_length(len(text), field, context)
        ids: list[int] = await self.off_loop(self.encode, text, field, **options)
        return ids

    async def chat_prompt(self, messages: Sequence[dict[str, Any]], context: int | None = None,
                          **template: Any) -> list[int]:
        """The ids of ``messages`` through the tokenizer's chat template, off the event loop (``template``: its
        keywords: ``add_generation_prompt``, ``continue_final_message``, ``tools``, ``chat_template_kwargs``')."""
        tok = self.tokenizer
        if tok is None or not getattr(tok, "chat_template", None):
            raise ApiError("the tokenizer has no chat template: use /v1/completions", param="messages")
        self.check_length(sum(len(str(m.get("content", ""))) for m in messages), "messages", context)
        text = await self.off_loop(self._render, list(messages), template)
        return await self.encode_async(text, "messages", context, add_special_tokens=False)

    def _render(self, messages: list[dict[str, Any]], template: dict[str, Any]) -> str:
        tokenizer: Any = self.tokenizer
        try:
            text: str = tokenizer.apply_chat_template(messages, tokenize=False, **template)
        except Exception as exc:  # jinja's TemplateError, the template's raise_exception
            raise ApiError(f"messages: the chat template refused them: {exc}", param="messages") from None
        return text

    def start(self, host: EngineHost, request: GenerationRequest, prompt_ids: Any,
              params: SamplingParams | Callable[[], SamplingParams]) -> tuple[Job, TextStream | None]:
        """Submit ``request`` on ``prompt_ids`` with ``params`` (or what makes them: their errors too are named
        as the client spelled the field, InputError); BusyError past the queue's bound."""
        return self.start_many(host, request, prompt_ids, [params])[0]

    def start_many(self, host: EngineHost, request: GenerationRequest, prompt_ids: Any,
                   params: Sequence[SamplingParams | Callable[[], SamplingParams]]
                   ) -> list[tuple[Job, TextStream | None]]:
        """:meth:`start` of one generation per ``params`` on the same prompt, all or none (those submitted before
        a refusal are cancelled)."""
        if request.stop_strings and self.tokenizer is None:
            raise ApiError("stop strings need a tokenizer: start pyrt serve with --tokenizer DIR, or give "
                           "token-id sequences", param="stop")
        out: list[tuple[Job, TextStream | None]] = []
        try:
            for each in params:
                job = host.submit(prompt_ids, each if isinstance(each, SamplingParams) else each())
                text = None if self.tokenizer is None else TextStream(self.tokenizer, request.stop_strings,
                                                                      **text_options(request))
                out.append((job, text))
        except InputError as exc:
            for job, _ in out:
                job.cancel()
            if exc.field is None or isinstance(exc, ApiError):
                raise
            raise exc.renamed(request.spelled(exc.field)) from None
        except BaseException:
            for job, _ in out:
                job.cancel()
            raise
        return out

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
        return (await self.collect_all([(job, text)], request))[0]

    async def collect_all(self, started: Sequence[tuple[Job, TextStream | None]], request: Request
                          ) -> list[tuple[list[Piece], Piece]]:
        """:meth:`collect` of several generations at once (``n`` choices), each job's pieces in order."""
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
