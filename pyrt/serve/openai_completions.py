"""OpenAI's completions (``POST /v1/completions``): a prompt as text or ids, ``echo``, completions' shapes.

:class:`CompletionAdapter` tokenizes a text prompt (off the event loop; token ids go as sent),
compiles the grammar of ``response_format``, and makes a :class:`CompletionReply`: ``text``
choices (after the prompt with ``echo``), and completions' log-probabilities (``logprobs: N``;
with ``echo``, the prompt's tokens first, the first without one), whose ``text_offset`` counts
characters from the start of the choice's text (a prompt token the echoed text leaves out, as the BOS, takes none).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyrt.serve import openai_answers as oa
from pyrt.serve.generation_call import Started
from pyrt.serve.llm_host import EngineHost, Job, Piece
from pyrt.serve.openai_api import CompletionRequest
from pyrt.serve.openai_choices import Delta
from pyrt.serve.openai_reply import OpenAIAdapter, OpenAIReply


class CompletionAdapter(OpenAIAdapter):
    """Completions' side of a generation call."""

    body = CompletionRequest

    async def prompt(self, body: CompletionRequest, host: EngineHost) -> list[Any]:
        """The prompt's ids: the tokenizer's (a text sure to overflow the cache refused before), or as sent."""
        if isinstance(body.prompt, str):
            return await self.texts.encode_async(body.prompt, "prompt", host.engine.conv.max_context_len)
        return body.prompt

    def reply(self, body: CompletionRequest, model: str, prompt: list[Any]) -> CompletionReply:
        # shown when asked for; best_of computes them to rank its sequences
        reply = CompletionReply(body, model, prompt, self.texts, logprobs=body.logprobs is not None)
        if body.echo:
            reply.echo = body.prompt if isinstance(body.prompt, str) else \
                self.texts.decode(prompt, skip_special_tokens=body.skip_special_tokens)
        return reply


class CompletionReply(OpenAIReply):
    """One completion, whole or streamed; ``echo``: the prompt's text, which each choice's text starts with."""

    id_prefix = "cmpl-"
    chunk_object = "text_completion"
    echo = ""

    def prompt_pairs(self, job: Job) -> list[tuple[int, Any]]:
        """(token, log-probability) of each prompt token, for ``echo`` with ``logprobs`` (else none)."""
        if not (self.echo and self.logprobs):
            return []
        return list(zip(self.prompt, job.generation.prompt_logprobs, strict=False))

    def logprobs_of(self, prompt_pairs: Sequence[tuple[int, Any]], items: list[Any],
                    offset: int) -> oa.CompletionLogprobs | None:
        """Log-probabilities of the prompt's tokens (echoed: their offsets are in the echoed text) and ``items``."""
        pairs = [*prompt_pairs, *((i.token, i) for i in items)]
        echo = self.echo if prompt_pairs else ""
        return oa.completion_logprobs(pairs, self.token_text, offset, echo, len(prompt_pairs)) if self.logprobs \
            else None

    def choice(self, index: int, job: Job, got: list[Piece], last: Piece) -> oa.CompletionChoice:
        pairs = self.prompt_pairs(job)
        logprobs = self.logprobs_of(pairs, self.items(job, last), 0 if pairs else len(self.echo))
        return oa.CompletionChoice(index=index, text=self.echo + "".join(p.text for p in got), logprobs=logprobs,
                                   finish_reason=oa.finish(last.finish_reason))

    def completed(self, choices: list[Any], usage: oa.Usage) -> oa.Completion:
        return oa.Completion(id=self.rid, created=self.created, model=self.model, choices=choices, usage=usage)

    def begin(self, started: Started) -> None:
        late = bool(self.echo and self.logprobs)  # the echo waits for the prompt's log-probabilities (prefill)
        self.late = late
        self.offsets = [0 if late else len(self.echo)] * len(started)  # each choice's text so far
        self.echoed = [not late] * len(started)

    def first(self, index: int) -> oa.CompletionChoice | None:
        """The echoed prompt, when it need not wait for its log-probabilities."""
        if not self.echo or self.late:
            return None
        return oa.CompletionChoice(index=index, text=self.echo, finish_reason=None)

    def chunk_choice(self, delta: Delta, started: Started) -> oa.CompletionChoice:
        i, pairs = delta.index, []
        if not self.echoed[i]:  # the late echo goes with the choice's first delta
            self.echoed[i], delta.text = True, self.echo + delta.text
            pairs = self.prompt_pairs(started[i][0])
        logprobs = self.logprobs_of(pairs, delta.items, self.offsets[i])
        self.offsets[i] += len(delta.text)
        return oa.CompletionChoice(index=i, text=delta.text, logprobs=logprobs,
                                   finish_reason=oa.finish(delta.finish_reason))
