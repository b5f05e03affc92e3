"""Structured output and forced tool calls: grammar-constrained decoding with ``llguidance`` (the ``serve`` extra).

:class:`Grammars` wraps the replica's tokenizer once (``llguidance.hf.from_tokenizer``, about a
second, at the first request that needs it) and compiles what a request asks into a
:class:`Grammar`, the ``grammar`` of its :class:`pyrt.llm.SamplingParams`:

- ``response_format`` ``{"type": "json_object"}``: any JSON object; ``{"type": "json_schema",
  "json_schema": {"name", "schema", "strict"}}``: JSON valid against the schema (OpenAI's shapes);
  ``{"type": "text"}``: nothing;
- vLLM's extra fields (one at most, and not with ``response_format``): ``guided_json`` (a schema, or its
  JSON text), ``guided_regex`` (text matching the regular expression), ``guided_choice`` (exactly one of
  the strings), ``guided_grammar`` (a Lark grammar, llguidance's dialect, as vLLM's guidance backend takes);
- ``tools`` with ``tool_choice`` ``"required"``: a JSON array of one or more ``{"name", "parameters"}``
  calls of the given functions (each call's ``parameters`` valid against that function's schema),
  or a named function (``{"type": "function", "function": {"name"}}``): that function's arguments.

Each generation gets its own :class:`Matcher` (``Grammar.matcher()``): before every token the ids
the grammar allows next (a boolean mask of the model's vocabulary; the generation's EOS ids where
the grammar may end), advanced by each token chosen; when the grammar is complete the generation
stops ("stop"). JSON is written compactly (no free whitespace, which a model could repeat without
end). A constrained generation guesses no tokens under speculative decoding.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Collection
from typing import Any

import numpy as np

from pyrt.errors import InputError, PyrtError

GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")  # vLLM's structured-output fields
JSON_OPTIONS = {"whitespace_flexible": False}  # compact JSON: a model cannot spin on whitespace


class Grammar:
    """A compiled grammar (llguidance's) for one request; :meth:`matcher` makes each generation's state."""

    def __init__(self, tokenizer: Any, grammar: str, vocab: int, what: str) -> None:
        self.tokenizer, self.grammar, self.vocab, self.what = tokenizer, grammar, vocab, what

    def matcher(self) -> Matcher:
        return Matcher(self)


class Matcher:
    """One generation's grammar state (:class:`pyrt.llm.processors.Matcher`)."""

    def __init__(self, grammar: Grammar) -> None:
        import llguidance  # extra: serve

        self.vocab = grammar.vocab
        self.state = llguidance.LLMatcher(grammar.tokenizer, grammar.grammar, log_level=0)
        if self.state.is_error():
            raise InputError(f"{grammar.what}: {self.state.get_error()}", field=grammar.what)
        self._done = False
        self._ends: set[int] = set()

    def allowed(self, eos_ids: Collection[int]) -> np.ndarray:
        """The ids allowed next, as a boolean mask of the vocabulary (the EOS ids where the grammar may end)."""
        bits = np.frombuffer(self.state.compute_bitmask(), dtype=np.uint8)
        mask = np.unpackbits(bits, bitorder="little")[:self.vocab].astype(bool)
        if mask.size < self.vocab:
            mask = np.concatenate([mask, np.zeros(self.vocab - mask.size, bool)])
        ends = [t for t in eos_ids if t < self.vocab]
        self._ends = set(ends)
        mask[ends] = self.state.is_accepting()
        if not mask.any():  # an error state: let it end rather than sample from nothing
            mask[ends] = True
        return mask

    def accept(self, token: int) -> None:
        if token in self._ends:
            self._done = True  # an EOS id where the grammar may end
            return
        self.state.consume_token(token)

    @property
    def finished(self) -> bool:
        return self._done or self.state.is_stopped()


class Grammars:
    """Compiles requests' grammars for ``tokenizer`` (a fast Hugging Face tokenizer) over a vocabulary of ``vocab``."""

    def __init__(self, tokenizer: Any, vocab: int) -> None:
        self.hf, self.vocab = tokenizer, vocab
        self._llg: Any = None
        self._lock = threading.Lock()

    def _tokenizer(self) -> Any:
        with self._lock:
            if self._llg is None:
                try:
                    import llguidance.hf  # extra: serve
                except ImportError:
                    raise PyrtError("structured output needs llguidance: pip install 'pyrt-executorch[serve]'") \
                        from None
                self._llg = llguidance.hf.from_tokenizer(self.hf, n_vocab=self.vocab)
            return self._llg

    def schema(self, schema: Any, what: str) -> Grammar:
        """A grammar of JSON valid against ``schema`` (``True``: any JSON object)."""
        import llguidance  # extra: serve

        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)  # type: ignore
        except (ValueError, TypeError) as exc:
            raise InputError(f"{what}: not a JSON schema: {exc}", field=what) from None
        return self._compiled(grammar, what)

    def _compiled(self, grammar: str, what: str) -> Grammar:
        import llguidance  # extra: serve

        tokenizer = self._tokenizer()
        error = llguidance.LLMatcher.validate_grammar(grammar, tokenizer)
        if error and not error.startswith("WARNING"):
            raise InputError(f"{what}: the grammar cannot be compiled: {error}", field=what)
        return Grammar(tokenizer, grammar, self.vocab, what)

    def requested(self, response_format: dict[str, Any] | None, guided: dict[str, Any]) -> Grammar | None:
        """What a request asks for: ``response_format``, or one of vLLM's ``guided_*`` fields (``guided``: name ->
        value, None where not given); InputError naming them when it asks for more than one."""
        asked = [name for name, value in guided.items() if value is not None]
        if response_format not in (None, {"type": "text"}):
            asked.insert(0, "response_format")
        if len(asked) > 1:
            raise InputError(f"{', '.join(asked)}: give one of them (each asks for a structured output)",
                             field=asked[1])
        if asked and asked[0] != "response_format":
            return self.guided(asked[0], guided[asked[0]])
        return self.response_format(response_format)

    def guided(self, name: str, value: Any) -> Grammar:
        """vLLM's ``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar`` (:data:`GUIDED`)."""
        import llguidance  # extra: serve

        matcher: Any = llguidance.LLMatcher
        if name == "guided_json":
            schema = value
            if isinstance(value, str):
                try:
                    schema = json.loads(value)
                except ValueError as exc:
                    raise InputError(f"guided_json: not JSON: {exc}", field=name) from None
            if not isinstance(schema, dict):
                raise InputError("guided_json must be a JSON schema (an object, or its JSON text)", field=name)
            return self.schema(schema, name)
        if name == "guided_choice":
            if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
                raise InputError("guided_choice must be a list of non-empty strings", field=name)
            return self._compiled(matcher.grammar_from_lark("start: " + " | ".join(map(json.dumps, value))), name)
        if name not in ("guided_regex", "guided_grammar") or not isinstance(value, str) or not value:
            raise InputError(f"{name} must be a non-empty string", field=name)
        try:
            grammar = matcher.grammar_from_regex(value) if name == "guided_regex" else matcher.grammar_from_lark(value)
        except (ValueError, TypeError) as exc:
            raise InputError(f"{name}: {exc}", field=name) from None
        return self._compiled(grammar, name)

    def response_format(self, value: dict[str, Any] | None) -> Grammar | None:
        """OpenAI's ``response_format``: None for text."""
        if value is None or value.get("type") == "text":
            return None
        kind = value.get("type")
        if kind == "json_object":
            return self.schema({"type": "object"}, "response_format")
        if kind == "json_schema":
            spec = value.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
                raise InputError("response_format.json_schema must be an object with a schema",
                                 field="response_format")
            return self.schema(spec.get("schema", {"type": "object"}), "response_format")
        raise InputError(f"response_format type {kind!r}: pyrt serve takes text, json_object and json_schema",
                         field="response_format")

    def tool_call(self, tools: list[dict[str, Any]], choice: Any, parallel: bool | None = None) -> Grammar | None:
        """``tool_choice`` ``"required"`` (``parallel`` False: exactly one call) or a named function as a grammar;
        None for ``"auto"`` / ``"none"``."""
        functions = {f["name"]: f for f in (tool_function(t, i) for i, t in enumerate(tools))}
        if choice in (None, "auto", "none"):
            return None
        if choice == "required":
            calls = [{"type": "object", "additionalProperties": False, "required": ["name", "parameters"],
                      "properties": {"name": {"const": name}, "parameters": parameters(f)}}
                     for name, f in functions.items()]
            array = {"type": "array", "minItems": 1, "items": {"anyOf": calls}, **({"maxItems": 1} if parallel is False
                                                                                   else {})}
            return self.schema(array, "tool_choice")
        name = named(choice)
        if name not in functions:
            raise InputError(f"tool_choice names {name!r}, which is not one of the tools ({sorted(functions)})",
                             field="tool_choice")
        return self.schema(parameters(functions[name]), "tool_choice")


def tool_function(tool: Any, index: int) -> dict[str, Any]:
    """The function of ``tools[index]`` (``{"type": "function", "function": {"name", "parameters"}}``)."""
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or tool.get("type") != "function":
        raise InputError(f"tools[{index}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}",
                         field="tools")
    return function


def parameters(function: dict[str, Any]) -> Any:
    schema = function.get("parameters")
    return schema if isinstance(schema, dict) else {"type": "object"}


def named(choice: Any) -> str:
    """The function a named ``tool_choice`` names."""
    function = choice.get("function") if isinstance(choice, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise InputError(f"tool_choice={json.dumps(choice)[:100]}: give \"none\", \"auto\", \"required\" or "
                         "{\"type\": \"function\", \"function\": {\"name\": ...}}", field="tool_choice")
    return str(function["name"])
