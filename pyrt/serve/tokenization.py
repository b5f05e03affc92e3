"""A replica's tokenizer: loaded once at start, run off the event loop, its views for sampling and output.

:class:`Tokenization` holds what the ``--tokenizer DIR`` of ``pyrt serve`` gives the generation
routes: the tokenizer itself (None without one), the sampling defaults of the directory's
``generation_config.json`` (:func:`pyrt.serve.tokens.generation_defaults`), token texts for
log-probabilities, the grammar compilers of structured output (one per vocabulary), and the
threads that tokenize and render chat templates while the event loop serves other requests. A
prompt text sure to overflow the cache is refused before it is tokenized (:meth:`check_length`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pyrt.checks import is_int
from pyrt.errors import InputError
from pyrt.serve.failures import ApiError
from pyrt.serve.structured import Grammars
from pyrt.serve.text import TextStream, load_tokenizer, read_chat_template
from pyrt.serve.tokens import TokenTexts, generation_defaults, most_chars

TOKENIZE_THREADS = 2  # tokenizing and chat templates run here, off the event loop


def template_options(add_generation_prompt: bool, continue_final_message: bool,
                     chat_template_kwargs: dict[str, Any] | None, tools: list[dict[str, Any]] | None
                     ) -> dict[str, Any]:
    """A chat template's keywords from a request's fields (chat completions', ``/tokenize``'s).

    >>> template_options(False, True, {"thinking": 1}, [{"type": "function", "function": {"name": "f"}}])
    {'add_generation_prompt': False, 'continue_final_message': True, 'thinking': 1, 'tools': [{'name': 'f'}]}
    """
    template: dict[str, Any] = {"add_generation_prompt": add_generation_prompt,
                                **({"continue_final_message": True} if continue_final_message else {}),
                                **(chat_template_kwargs or {})}
    if tools:
        template["tools"] = [t.get("function", t) for t in tools]
    return template


class Tokenization:
    """The tokenizer in ``directory`` (None: the server has none; ``chat_template``: a Jinja file that replaces its
    chat template) and the threads it runs on (until :meth:`close`)."""

    def __init__(self, directory: str | None, chat_template: str | None = None) -> None:
        self.tokenizer = load_tokenizer(directory) if directory else None
        if self.tokenizer is not None and chat_template is not None:
            self.tokenizer.chat_template = read_chat_template(chat_template)
        self.defaults = generation_defaults(directory)  # generation_config.json's sampling defaults
        self.token_texts = TokenTexts(self.tokenizer) if self.tokenizer is not None else None
        self.most_chars = most_chars(self.tokenizer) if self.tokenizer is not None else 1
        self.pool = ThreadPoolExecutor(TOKENIZE_THREADS, thread_name_prefix="pyrt-tokenize")
        self._grammars: dict[int, Grammars] = {}  # vocabulary size -> the grammar compiler (structured output)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    def grammars(self, vocab: int) -> Grammars:
        """The grammar compiler for a vocabulary of ``vocab`` tokens (structured output, forced tool calls)."""
        if vocab not in self._grammars:
            self._grammars[vocab] = Grammars(self.tokenizer, vocab)
        return self._grammars[vocab]

    def text_stream(self, stops: Sequence[str], *, skip_special_tokens: bool = True,
                    include_stop: bool = False) -> TextStream | None:
        """One generation's text as its tokens come (None without a tokenizer)."""
        if self.tokenizer is None:
            return None
        return TextStream(self.tokenizer, stops, skip_special_tokens=skip_special_tokens, include_stop=include_stop)

    def eos(self, eos_ids: Sequence[int], vocab: int) -> tuple[int, ...]:
        """A file's EOS ids (``eos_ids``), and the tokenizer's EOS where it is in the vocabulary (as vLLM stops at
        both)."""
        extra: Any = getattr(self.tokenizer, "eos_token_id", None)
        eos = tuple(eos_ids)
        if is_int(extra, low=0, end=vocab) and extra not in eos:
            eos += (int(extra),)
        return eos

    def encode(self, text: str, field: str, add_special_tokens: bool = True) -> list[int]:
        """``text``'s token ids (ApiError naming ``field`` when the server has no tokenizer)."""
        if self.tokenizer is None:
            raise ApiError(f"{field} needs a tokenizer: start pyrt serve with --tokenizer DIR, or send input_ids",
                           param=field)
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """The text of ``ids`` (the server has a tokenizer: the routes that decode need one)."""
        tokenizer: Any = self.tokenizer
        return str(tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def check_length(self, chars: int, field: str, context: int | None) -> None:
        """Refuse a text of ``chars`` characters that is sure to be more tokens than ``context`` (before any
        tokenizing: each token stands for at most ``most_chars`` characters)."""
        if context is not None and chars > context * self.most_chars:
            least = -(-chars // self.most_chars)
            raise InputError(f"{field} has {chars} characters: at least {least} tokens, more than the cache's "
                             f"{context} positions (get_max_context_len)", field=field)

    async def off_loop(self, work: Callable[..., Any], *args: Any) -> Any:
        """``work(*args)`` on the tokenizing threads (the event loop serves other requests meanwhile)."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, functools.partial(work, *args))

    async def encode_async(self, text: str, field: str, context: int | None = None,
                           add_special_tokens: bool = True) -> list[int]:
        """:meth:`encode` off the event loop, after :meth:`check_length`."""
        self.check_length(len(text), field, context)
        ids: list[int] = await self.off_loop(self.encode, text, field, add_special_tokens)
        return ids

    async def chat_prompt(self, messages: Sequence[dict[str, Any]], context: int | None,
                          template: dict[str, Any]) -> list[int]:
        """The ids of ``messages`` through the tokenizer's chat template, off the event loop (``template``: its
        keywords, :func:`template_options`)."""
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
