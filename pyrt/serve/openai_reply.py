"""What OpenAI's completions and chat completions share: the adapter's request side and the reply's lifecycle.

:class:`OpenAIAdapter` (a :class:`pyrt.serve.generation_call.Adapter`) reads the model from the
body, makes each of the ``n`` (or ``best_of``) sequences' parameters (the request's; sequence i
with seed + i, its own random stream) with the grammar a request asks for compiled off the event
loop, gives each sequence a text stream with the request's text options, and answers failures
in OpenAI's error shape. :class:`OpenAIReply` is one answer: whole (the best ``n`` of
``best_of``, the usage counting the prompt once) or streamed (the first chunk of each choice, a
chunk per delta as the choices' deltas come, the usage with ``stream_options``, ``[DONE]``).
Each API's own shapes are its subclasses' (:mod:`pyrt.serve.openai_chat`,
:mod:`pyrt.serve.openai_completions`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from pyrt.llm import SamplingParams
from pyrt.serve import openai_answers as oa
from pyrt.serve.events import DONE, sse, sse_of
from pyrt.serve.failures import openai_body, openai_response
from pyrt.serve.generation_call import Collected, MakeParams, Started
from pyrt.serve.llm_host import EngineHost, Job, Piece
from pyrt.serve.openai_api import OpenAIRequest
from pyrt.serve.openai_choices import Delta, best, deltas, merged
from pyrt.serve.text import TextStream
from pyrt.serve.tokenization import Tokenization

JSON = "application/json"
SEEDS = 1 << 64


class OpenAIAdapter:
    """The request side both OpenAI generation routes share (``texts``: the replica's tokenizer)."""

    list_names = True

    def __init__(self, texts: Tokenization) -> None:
        self.texts = texts

    def model(self, request: Request, body: OpenAIRequest | None = None) -> str | None:
        return None if body is None else body.model

    def streamed(self, body: OpenAIRequest) -> bool:
        return bool(body.stream)

    def refusal(self, exc: BaseException) -> Response:
        return openai_response(exc)

    def text(self, body: OpenAIRequest) -> TextStream | None:
        return self.texts.text_stream(body.stop_strings, skip_special_tokens=body.skip_special_tokens,
                                      include_stop=body.include_stop_str_in_output)

    def grammar(self, body: Any, vocab: int) -> Any:
        """The grammar ``body`` asks for (None: none), compiled for a vocabulary of ``vocab`` tokens."""
        return self.texts.grammars(vocab).requested(body.response_format, body.guided)

    async def params(self, body: OpenAIRequest, host: EngineHost) -> list[MakeParams]:
        """Each sequence's parameters: the request's, sequence i with seed + i (its own random stream)."""
        conv = host.engine.conv
        grammar = await self.texts.off_loop(self.grammar, body, conv.vocab_size)
        eos = self.texts.eos(conv.eos_ids, conv.vocab_size)

        def make(i: int) -> SamplingParams:
            params = body.sampling_params(eos, self.texts.defaults, grammar)
            if i and params.seed is not None:
                params = dataclasses.replace(params, seed=(params.seed + i) % SEEDS)
            return params
        return [functools.partial(make, i) for i in range(body.sequences)]


class OpenAIReply:
    """One request's answer, whole or as server-sent events; a subclass writes its API's choices and chunks.

    ``id_prefix`` starts the answer's id; ``chunk_object`` is its chunks' ``object``; ``logprobs``: whether the
    choices show log-probabilities (``best_of`` computes them to rank its sequences even when they are not shown).
    """

    id_prefix = ""
    chunk_object = ""
    ending = DONE

    def __init__(self, body: OpenAIRequest, model: str, prompt: list[Any], texts: Tokenization,
                 logprobs: bool) -> None:
        self.body, self.model, self.prompt, self.texts, self.logprobs = body, model, prompt, texts, logprobs
        self.rid, self.created = oa.new_id(self.id_prefix), oa.now()

    # -- what a subclass writes ------------------------------------------------------------------------
    def choice(self, index: int, job: Job, got: list[Piece], last: Piece) -> Any:
        """The whole answer's choice ``index``: sequence ``job``'s pieces ``got``, ending with ``last``."""
        raise NotImplementedError

    def completed(self, choices: list[Any], usage: oa.Usage) -> oa.Completion | oa.ChatCompletion:
        """The whole answer around its ``choices``."""
        raise NotImplementedError

    def begin(self, started: Started) -> None:
        """Before the first chunk of a stream of ``started``'s choices."""

    def first(self, index: int) -> Any:
        """The first chunk's choice of choice ``index`` (None: no first chunk)."""
        raise NotImplementedError

    def chunk_choice(self, delta: Delta, started: Started) -> Any:
        """The chunk's choice that carries ``delta``."""
        raise NotImplementedError

    # -- the lifecycle ---------------------------------------------------------------------------------
    def token_text(self, token: int) -> tuple[str, list[int]]:
        assert self.texts.token_texts is not None  # the OpenAI routes have a tokenizer
        return self.texts.token_texts(token)

    def items(self, job: Job, last: Piece) -> list[Any]:
        """The log-probabilities of the tokens a whole choice shows (none unless asked for)."""
        return job.generation.logprobs[:last.consumed] if self.logprobs else []

    def whole(self, started: Started, results: Collected) -> Response:
        """The whole (not streamed) answer: ``n`` choices (the best of ``best_of``)."""
        keep = list(range(len(results)))
        if self.body.sequences > self.body.choices:
            scores = [sum(i.logprob for i in job.generation.logprobs[:last.consumed])
                      for (job, _), (_, last) in zip(started, results, strict=True)]
            keep = best(scores, self.body.choices)
        choices = [self.choice(index, started[i][0], *results[i]) for index, i in enumerate(keep)]
        usage = oa.Usage.of(len(self.prompt), sum(last.consumed for _, last in results), cached(started))
        return Response(self.completed(choices, usage).model_dump_json(), media_type=JSON)

    def chunk(self, choices: list[Any], usage: oa.Usage | None = None) -> oa.Chunk:
        return oa.Chunk(id=self.rid, object=self.chunk_object, created=self.created, model=self.model,
                        choices=choices, usage=usage)

    async def events(self, started: Started) -> AsyncIterator[bytes]:
        body, n = self.body, len(started)
        leave_out = None if body.include_usage else {"usage"}  # "usage": null in every chunk when asked for
        consumed = [0] * n
        self.begin(started)
        streams = [deltas(i, job, text, self.logprobs) for i, (job, text) in enumerate(started)]
        for i in range(n):
            first = self.first(i)
            if first is not None:
                yield sse_of(self.chunk([first]), leave_out=leave_out)
        async for delta in merged(streams):
            consumed[delta.index] = delta.consumed
            usage = oa.Usage.of(len(self.prompt), sum(consumed), cached(started)) if body.continuous_usage else None
            yield sse_of(self.chunk([self.chunk_choice(delta, started)], usage), leave_out=leave_out)
        if body.include_usage:
            yield sse_of(self.chunk([], oa.Usage.of(len(self.prompt), sum(consumed), cached(started))))

    def error_event(self, exc: BaseException) -> bytes:
        return sse(json.dumps(openai_body(exc)).encode())


def cached(started: Started) -> int:
    """The usage's ``prompt_tokens_details.cached_tokens``: the most prompt tokens any of the request's sequences
    found in a KV-cache slot (prefix caching; the prompt counts once), of those that ended."""
    found = [job.generation.result.cached_tokens for job, _ in started if job.generation.result is not None]
    return max(found, default=0)
