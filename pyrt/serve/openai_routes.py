"""OpenAI's ``/v1`` routes of a replica: the models, completions and chat completions (they need the tokenizer).

``GET /v1/models``, ``GET /v1/models/{model}``, ``POST /v1/completions``,
``POST /v1/chat/completions`` (bodies: :mod:`pyrt.serve.openai_api`, :mod:`pyrt.serve.openai_answers`).
A request's ``n`` (or ``best_of``) generations are submitted together on one prompt: the
engine prefills them in the same steps (a slot file has no method that copies one slot's cache
into another, so each slot's cache is computed; the prompt counts once in the usage). Every
failure is answered in OpenAI's error shape, its ``param`` the field as the client spelled it; a
streamed answer's failure after the first event is its last event. Streamed answers are
server-sent events (:class:`pyrt.serve.events.EventStream`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from pyrt.llm import SamplingParams
from pyrt.serve import openai_answers as oa
from pyrt.serve.events import DONE, EventStream, sse, sse_of
from pyrt.serve.failures import ApiError, openai_body, openai_response
from pyrt.serve.llm_host import EngineHost, Job, Piece
from pyrt.serve.llm_service import LlmService
from pyrt.serve.openai_api import ChatRequest, CompletionRequest, OpenAIRequest
from pyrt.serve.openai_choices import Delta, best, deltas, merged
from pyrt.serve.routes import route
from pyrt.serve.text import TextStream
from pyrt.serve.tool_calls import ToolFilter

NO_TOKENIZER = "the OpenAI routes need a tokenizer: start pyrt serve with --tokenizer DIR"
JSON = "application/json"
SEEDS = 1 << 64
Started = list[tuple[Job, TextStream | None]]


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
        max_len = self.service.hosts[self.service.canonical(name)].engine.conv.max_context_len
        return oa.ModelCard(id=name, created=self.created, max_model_len=max_len)

    def _tokenizer(self) -> None:
        if self.service.tokenizer is None:
            raise ApiError(NO_TOKENIZER, 404)

    async def models(self, request: Request) -> Response:
        try:
            self._tokenizer()
        except ApiError as exc:
            return openai_response(exc)
        cards = oa.ModelList(data=[self._card(n) for n in self.service.names()])
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
        return await self._answer(request, CompletionRequest)

    async def chat_completions(self, request: Request) -> Response:
        return await self._answer(request, ChatRequest)

    async def _answer(self, request: Request, kind: type[CompletionRequest] | type[ChatRequest]) -> Response:
        name = ""
        try:
            self._tokenizer()
            body = await self.service.read(request, kind)
            host = self.service.host(body.model, openai=True)
            name = host.model
            self.service.metrics.request(name)
            prompt = await self._prompt(body, host)
            grammar = await self.service.off_loop(self._grammar, body, host)
            started = await self.service.start_many(host, body, prompt, self._params(body, host, grammar))
        except Exception as exc:  # answered, never raised: the replica keeps serving
            self.service.failed(name, exc)
            return openai_response(exc)
        answer = Answer(self.service, body, name, prompt)
        if body.stream:
            return EventStream(answer.events(started))
        try:
            results = await self.service.collect_all(started, request)
        except Exception as exc:
            self.service.failed(name, exc)
            return openai_response(exc)
        return Response(answer.whole(started, results).model_dump_json(), media_type=JSON)

    async def _prompt(self, body: CompletionRequest | ChatRequest, host: EngineHost) -> list[Any]:
        """The prompt's token ids: the chat template's, the tokenizer's, or as sent (checked where submitted);
        tokenized off the event loop, a text sure to overflow the cache refused before."""
        context = host.engine.conv.max_context_len
        if isinstance(body, ChatRequest):
            template: dict[str, Any] = {"add_generation_prompt": body.add_generation_prompt,
                                        **({"continue_final_message": True} if body.continue_final_message else {}),
                                        **(body.chat_template_kwargs or {})}
            if body.tools:
                template["tools"] = [t.get("function", t) for t in body.tools]
            return await self.service.chat_prompt([m.for_template() for m in body.messages], context, **template)
        if isinstance(body.prompt, str):
            return await self.service.encode_async(body.prompt, "prompt", context)
        return body.prompt

    def _grammar(self, body: OpenAIRequest, host: EngineHost) -> Any:
        """The grammar a forced tool choice or ``response_format`` asks for (None: none), compiled."""
        grammars = self.service.grammars(host)
        if isinstance(body, ChatRequest) and body.tools and body.tool_choice not in (None, "auto", "none"):
            return grammars.tool_call(body.tools, body.tool_choice, body.parallel_tool_calls)
        if isinstance(body, ChatRequest) and body.tool_choice not in (None, "auto", "none"):
            raise ApiError("tool_choice needs tools", param="tool_choice")
        return grammars.response_format(body.response_format)

    def _params(self, body: OpenAIRequest, host: EngineHost, grammar: Any) -> list[Callable[[], SamplingParams]]:
        """Each sequence's parameters: the request's, sequence i with seed + i (its own random stream)."""
        def make(i: int) -> SamplingParams:
            params = body.sampling_params(self.service.eos(host), self.service.defaults, grammar)
            if i and params.seed is not None:
                params = dataclasses.replace(params, seed=(params.seed + i) % SEEDS)
            return params
        return [lambda i=i: make(i) for i in range(body.sequences)]  # type: ignore[misc]


class Answer:
    """One request's answer: its choices whole, or as server-sent events."""

    def __init__(self, service: LlmService, body: OpenAIRequest, model: str, prompt: list[Any]) -> None:
        self.service, self.body, self.model, self.prompt = service, body, model, prompt
        self.chat = isinstance(body, ChatRequest)
        self.rid, self.created = oa.new_id(self.chat), oa.now()
        self.logprobs = body.logprobs is True if isinstance(body, ChatRequest) else \
            getattr(body, "logprobs", None) is not None  # shown; best_of computes them to rank its sequences
        self.echo = self._echo_text() if isinstance(body, CompletionRequest) and body.echo else ""

    def _echo_text(self) -> str:
        body = self.body
        assert isinstance(body, CompletionRequest)
        if isinstance(body.prompt, str):
            return body.prompt
        tokenizer: Any = self.service.tokenizer
        return str(tokenizer.decode(self.prompt, skip_special_tokens=body.skip_special_tokens))

    def whole(self, started: Started, results: list[tuple[list[Piece], Piece]]) -> oa.Completion | oa.ChatCompletion:
        """The whole (not streamed) answer: ``n`` choices (the best of ``best_of``)."""
        keep = list(range(len(results)))
        if self.body.sequences > self.body.choices:
            scores = [sum(i.logprob for i in job.generation.logprobs[:last.consumed])
                      for (job, _), (_, last) in zip(started, results, strict=True)]
            keep = best(scores, self.body.choices)
        choices = []
        for index, i in enumerate(keep):
            (job, _), (got, last) = started[i], results[i]
            items = job.generation.logprobs[:last.consumed] if self.logprobs else []
            choices.append(self._choice(index, "".join(p.text for p in got), items, last.finish_reason,
                                        self._prompt_pairs(job)))
        usage = oa.Usage.of(len(self.prompt), sum(last.consumed for _, last in results))
        if self.chat:
            return oa.ChatCompletion(id=self.rid, created=self.created, model=self.model, choices=choices, usage=usage)
        return oa.Completion(id=self.rid, created=self.created, model=self.model, choices=choices, usage=usage)

    def _tools(self) -> ToolFilter | None:
        body = self.body
        return ToolFilter(body.tool_choice) if isinstance(body, ChatRequest) and body.tools else None

    def _prompt_pairs(self, job: Job) -> list[tuple[int, Any]]:
        """(token, log-probability) of each prompt token, for ``echo`` with ``logprobs`` (else none)."""
        if not (self.echo and self.logprobs):
            return []
        return list(zip(self.prompt, job.generation.prompt_logprobs, strict=False))

    def _choice(self, index: int, text: str, items: list[Any], reason: str | None,
                prompt_pairs: Sequence[tuple[int, Any]] = ()) -> Any:
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            tools = self._tools()
            if tools is not None:
                content, calls = tools.whole(text)
                if calls:
                    message, reason = {"role": "assistant", "content": content, "tool_calls": calls}, "tool_calls"
            return oa.ChatChoice(index=index, message=message,
                                 logprobs=oa.chat_logprobs(items, self._texts) if self.logprobs else None,
                                 finish_reason=oa.finish(reason))
        pairs = [*prompt_pairs, *((i.token, i) for i in items)]
        logprobs = oa.completion_logprobs(pairs, self._texts, 0 if prompt_pairs else len(self.echo)) \
            if self.logprobs else None
        return oa.CompletionChoice(index=index, text=self.echo + text, logprobs=logprobs,
                                   finish_reason=oa.finish(reason))

    def _texts(self, token: int) -> tuple[str, list[int]]:
        assert self.service.token_texts is not None  # the OpenAI routes have a tokenizer
        return self.service.token_texts(token)

    def _chat_delta(self, delta: Delta, tools: ToolFilter | None) -> tuple[dict[str, Any], str | None]:
        """A chat chunk's ``delta`` and finish reason (tool calls go out with the last chunk)."""
        if tools is None:
            return ({"content": delta.text} if delta.text else {}), delta.finish_reason
        text = tools.add(delta.text)
        if delta.finish_reason is None:
            return ({"content": text} if text else {}), None
        rest, calls = tools.finish()
        out: dict[str, Any] = {"content": text + rest} if text + rest else {}
        if calls:
            out["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
        return out, ("tool_calls" if calls else delta.finish_reason)

    def _chunk(self, delta: Delta, offsets: list[int], usage: oa.Usage | None,
               tools: ToolFilter | None = None, prompt_pairs: list[tuple[int, Any]] | None = None) -> oa.Chunk:
        choice: Any
        if self.chat:
            content, reason = self._chat_delta(delta, tools)
            choice = oa.ChunkChoice(index=delta.index, delta=content,
                                    logprobs=oa.chat_logprobs(delta.items, self._texts) if self.logprobs else None,
                                    finish_reason=oa.finish(reason))
        else:
            pairs = [*(prompt_pairs or ()), *((i.token, i) for i in delta.items)]
            logprobs = oa.completion_logprobs(pairs, self._texts, offsets[delta.index]) if self.logprobs else None
            offsets[delta.index] += len(delta.text)
            choice = oa.CompletionChoice(index=delta.index, text=delta.text, logprobs=logprobs,
                                         finish_reason=oa.finish(delta.finish_reason))
        return oa.Chunk(id=self.rid, object=oa.chunk_kind(self.chat), created=self.created, model=self.model,
                        choices=[choice], usage=usage)

    def _first(self, index: int) -> oa.Chunk:
        """A choice's first chunk: the assistant's role (chat), or the echoed prompt (completions)."""
        choice: Any = oa.ChunkChoice(index=index, delta={"role": "assistant", "content": ""}, finish_reason=None) \
            if self.chat else oa.CompletionChoice(index=index, text=self.echo, finish_reason=None)
        return oa.Chunk(id=self.rid, object=oa.chunk_kind(self.chat), created=self.created, model=self.model,
                        choices=[choice])

    async def events(self, started: Started) -> AsyncIterator[bytes]:
        body, n = self.body, len(started)
        leave_out = None if body.include_usage else {"usage"}  # "usage": null in every chunk when asked for
        late = bool(self.echo and self.logprobs)  # the echo waits for the prompt's log-probabilities (prefill)
        consumed, offsets, echoed = [0] * n, [0 if late else len(self.echo)] * n, [not late] * n
        tools = [self._tools() for _ in range(n)]
        streams = [deltas(i, job, text, self.logprobs) for i, (job, text) in enumerate(started)]
        try:
            for i in range(n):
                if self.chat or (self.echo and not late):
                    yield sse_of(self._first(i), leave_out=leave_out)
            async for delta in merged(streams):
                consumed[delta.index] = delta.consumed
                usage = oa.Usage.of(len(self.prompt), sum(consumed)) if body.continuous_usage else None
                pairs = None
                if not echoed[delta.index]:
                    echoed[delta.index], delta.text = True, self.echo + delta.text
                    pairs = self._prompt_pairs(started[delta.index][0])
                yield sse_of(self._chunk(delta, offsets, usage, tools[delta.index], pairs), leave_out=leave_out)
            if body.include_usage:
                usage = oa.Usage.of(len(self.prompt), sum(consumed))
                yield sse_of(oa.usage_chunk(self.chat, self.rid, self.created, self.model, usage))
        except Exception as exc:  # the status went with the first event: the error is the last one
            self.service.failed(self.model, exc)
            yield sse(json.dumps(openai_body(exc)).encode())
        finally:
            for job, _ in started:
                self.service.ended(job)
        yield DONE
