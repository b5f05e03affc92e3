"""Tool calls in a chat answer: OpenAI's ``tool_calls`` from the text a model wrote.

- ``tool_choice`` ``"auto"``: the Hermes format (Hermes, Qwen2.5 and other chat templates; vLLM's
  ``--tool-call-parser hermes``): each call is ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
  in the text; the text before the first is the message's content. :class:`HermesStream` does the same
  on a stream: content goes out as it comes (a tail that could begin ``<tool_call>`` is held back),
  the calls at the end.
- ``"required"``: the text is the JSON array of ``{"name", "parameters"}`` the grammar forced;
  a named function: the text is that function's arguments (:mod:`pyrt.serve.structured`).

>>> content, calls = hermes('Sure. <tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>')
>>> content, calls[0]["function"]
('Sure. ', {'name': 'f', 'arguments': '{"x": 1}'})
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

TAG, END = "<tool_call>", "</tool_call>"
CALL = re.compile(re.escape(TAG) + r"(.*?)(?:" + re.escape(END) + r"|$)", re.DOTALL)


def openai_call(name: str, arguments: str) -> dict[str, Any]:
    """One of OpenAI's ``tool_calls``: an id, ``function.name``, ``function.arguments`` (JSON text)."""
    return {"id": "call_" + uuid.uuid4().hex[:24], "type": "function", "function": {"name": name,
                                                                                    "arguments": arguments}}


def hermes(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, tool calls) of a Hermes-format text; a block that is not a JSON call stays in the content."""
    start = text.find(TAG)
    if start < 0:
        return text, []
    calls = []
    for block in CALL.findall(text[start:]):
        try:
            call = json.loads(block.strip())
        except ValueError:
            return text, []
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return text, []
        calls.append(openai_call(call["name"], json.dumps(call.get("arguments", {}), ensure_ascii=False)))
    content = text[:start]
    return (content or None), calls


def forced(text: str, choice: Any) -> list[dict[str, Any]]:
    """The calls of a forced choice's text: ``"required"``'s array, or a named function's arguments."""
    if choice == "required":
        return [openai_call(c["name"], json.dumps(c["parameters"], ensure_ascii=False)) for c in json.loads(text)]
    return [openai_call(choice["function"]["name"], text)]


class HermesStream:
    """Content deltas of a streamed Hermes-format text, then its calls (:meth:`finish`)."""

    def __init__(self) -> None:
        self.text, self.sent, self.calling = "", 0, False

    def add(self, delta: str) -> str:
        """The content to send now."""
        self.text += delta
        if self.calling:
            return ""
        at = self.text.find(TAG)
        if at >= 0:
            self.calling = True
            out, self.sent = self.text[self.sent:at], at
            return out
        keep = next((k for k in range(min(len(TAG) - 1, len(self.text)), 0, -1) if self.text.endswith(TAG[:k])), 0)
        out = self.text[self.sent:len(self.text) - keep]
        self.sent = len(self.text) - keep
        return out

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """(the content held back, the calls)."""
        content, calls = hermes(self.text)
        if not calls:
            rest, self.sent = self.text[self.sent:], len(self.text)
            return rest, []
        return (content or "")[self.sent:], calls


class ToolFilter:
    """A chat choice's text with ``tools``: ``"auto"`` parses Hermes calls (:class:`HermesStream`), a forced
    choice (``"required"``, a named function) holds the whole text back and turns it into calls (:func:`forced`;
    a text cut short by ``max_tokens``, which parses as no call, stays the content)."""

    def __init__(self, choice: Any) -> None:
        self.choice = "auto" if choice is None else choice
        self.stream = HermesStream()

    @property
    def is_forced(self) -> bool:
        return self.choice not in ("auto", "none")

    def add(self, delta: str) -> str:
        if self.is_forced:
            self.stream.text += delta
            return ""
        return self.stream.add(delta)

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """(content not sent yet, the calls)."""
        if not self.is_forced:
            return self.stream.finish()
        try:
            return "", forced(self.stream.text, self.choice)
        except (ValueError, KeyError, TypeError):
            return self.stream.text, []

    def whole(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """(content, calls) of a whole answer."""
        self.add(text)
        rest, calls = self.finish()
        if self.is_forced:
            return (None if calls else rest), calls
        content, _ = hermes(text) if calls else (text, [])
        return content, calls
