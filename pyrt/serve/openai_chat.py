"""OpenAI's chat completions (``POST /v1/chat/completions``): the chat template's prompt, tools, chat's shapes.

:class:`ChatAdapter` renders ``messages`` through the tokenizer's chat template (off the event
loop), compiles the grammar a forced ``tool_choice`` or ``response_format`` asks for, and makes
a :class:`ChatReply`: ``message`` choices (an assistant's text, or its ``tool_calls`` when the
model wrote calls of the given tools: :class:`pyrt.serve.tool_calls.ToolFilter`), chunks whose
``delta`` starts with the assistant's role and carries tool calls with the last one, and chat's
log-probabilities (``logprobs: true``, ``top_logprobs``).
"""

from __future__ import annotations

from typing import Any

from pyrt.serve import openai_answers as oa
from pyrt.serve.failures import ApiError
from pyrt.serve.generation_call import Started
from pyrt.serve.llm_host import EngineHost, Job, Piece
from pyrt.serve.openai_api import ChatRequest
from pyrt.serve.openai_choices import Delta
from pyrt.serve.openai_reply import OpenAIAdapter, OpenAIReply
from pyrt.serve.tokenization import template_options
from pyrt.serve.tool_calls import ToolFilter

UNFORCED = (None, "auto", "none")  # tool choices that constrain nothing


class ChatAdapter(OpenAIAdapter):
    """Chat completions' side of a generation call."""

    body = ChatRequest

    async def prompt(self, body: ChatRequest, host: EngineHost) -> list[Any]:
        """The ids of the messages through the chat template (a text sure to overflow the cache refused before)."""
        template = template_options(body.add_generation_prompt, body.continue_final_message,
                                    body.chat_template_kwargs, body.tools)
        messages = [m.for_template() for m in body.messages]
        return await self.texts.chat_prompt(messages, host.engine.conv.max_context_len, template)

    def grammar(self, body: ChatRequest, vocab: int) -> Any:
        """The grammar a forced tool choice or ``response_format`` asks for (None: none), compiled."""
        grammars = self.texts.grammars(vocab)
        if body.tool_choice not in UNFORCED:
            if not body.tools:
                raise ApiError("tool_choice needs tools", param="tool_choice")
            return grammars.tool_call(body.tools, body.tool_choice, body.parallel_tool_calls)
        return grammars.requested(body.response_format, body.guided)

    def reply(self, body: ChatRequest, model: str, prompt: list[Any]) -> ChatReply:
        return ChatReply(body, model, prompt, self.texts, logprobs=body.logprobs is True)


class ChatReply(OpenAIReply):
    """One chat completion, whole or streamed."""

    id_prefix = "chatcmpl-"
    chunk_object = "chat.completion.chunk"
    body: ChatRequest

    def tools(self) -> ToolFilter | None:
        """A choice's filter of tool calls out of its text (None: the request gave no tools)."""
        return ToolFilter(self.body.tool_choice) if self.body.tools else None

    def logprobs_of(self, items: list[Any]) -> oa.ChatLogprobs | None:
        return oa.chat_logprobs(items, self.token_text) if self.logprobs else None

    def choice(self, index: int, job: Job, got: list[Piece], last: Piece) -> oa.ChatChoice:
        text, reason = "".join(p.text for p in got), last.finish_reason
        message: dict[str, Any] = {"role": "assistant", "content": text}
        tools = self.tools()
        if tools is not None:
            content, calls = tools.whole(text)
            if calls:
                message, reason = {"role": "assistant", "content": content, "tool_calls": calls}, "tool_calls"
        return oa.ChatChoice(index=index, message=message, logprobs=self.logprobs_of(self.items(job, last)),
                             finish_reason=oa.finish(reason))

    def completed(self, choices: list[Any], usage: oa.Usage) -> oa.ChatCompletion:
        return oa.ChatCompletion(id=self.rid, created=self.created, model=self.model, choices=choices, usage=usage)

    def begin(self, started: Started) -> None:
        self.filters = [self.tools() for _ in started]

    def first(self, index: int) -> oa.ChunkChoice:
        """The assistant's role."""
        return oa.ChunkChoice(index=index, delta={"role": "assistant", "content": ""}, finish_reason=None)

    def chunk_choice(self, delta: Delta, started: Started) -> oa.ChunkChoice:
        content, reason = self._delta(delta, self.filters[delta.index])
        return oa.ChunkChoice(index=delta.index, delta=content, logprobs=self.logprobs_of(delta.items),
                              finish_reason=oa.finish(reason))

    @staticmethod
    def _delta(delta: Delta, tools: ToolFilter | None) -> tuple[dict[str, Any], str | None]:
        """A chunk's ``delta`` and finish reason (tool calls go out with the last chunk)."""
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
