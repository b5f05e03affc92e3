"""Request bodies as pydantic models; a refused body is an InputError naming the field as the client spelled it.

Every JSON request body the replica reads (OpenAI's, Triton's generate request, the Open
Inference Protocol's infer request) is a :class:`Body`: its fields carry their types (strict:
no string for a number, no bool for an int), :func:`parse` reads and validates it in one pass
(pydantic's JSON parser), and the first problem becomes a :class:`pyrt.errors.InputError` whose
``field`` is the value's path as the client wrote it (``messages[0].content[0]``, ``max_tokens``)
and whose message reads ``name=value must be ...``, not pydantic's report. A validator refuses a
value with :class:`Bad` (the rest of that sentence), or raises the InputError itself when the
problem is between fields. Bounds of the sampling parameters are not checked here:
:class:`pyrt.llm.SamplingParams` checks each, once; :meth:`Body.spelled` names its fields the
client's way (a model field's alias).

>>> class Ask(Body):
...     max_new_tokens: StrictInt | None = Field(None, alias="max_tokens")
>>> parse(Ask, b'{"max_tokens": "8"}')
Traceback (most recent call last):
...
pyrt.errors.InputError: max_tokens='8' must be an int
>>> parse(Ask, b'{"max_tokens": 8, "colour": 1}')
Traceback (most recent call last):
...
pyrt.errors.InputError: unknown parameter 'colour' (pyrt serve takes: max_tokens)
>>> ask = parse(Ask, b'{"max_tokens": 8}')
>>> ask.max_new_tokens, ask.spelled("max_new_tokens")
(8, 'max_tokens')
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictInt, ValidationError
from pydantic_core import ErrorDetails

from pyrt.checks import shown
from pyrt.errors import InputError

B = TypeVar("B", bound="Body")
MAX_STOPS = 16  # stop strings a request may give
WANTED = {  # pydantic's error type -> what the value must be
    "int_type": "an int", "int_parsing": "an int", "float_type": "a number", "float_parsing": "a number",
    "bool_type": "true or false", "bool_parsing": "true or false", "string_type": "a string",
    "list_type": "a list", "tuple_type": "a list", "dict_type": "a JSON object", "model_type": "a JSON object",
    "model_attributes_type": "a JSON object",
}


class Body(BaseModel):
    """A request body: unknown fields refused, fields as the client spells them (aliases)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def spelled(self, field: str) -> str:
        """How the client spelled ``field`` (a field of this model, or a :class:`pyrt.llm.SamplingParams` one)."""
        info = type(self).model_fields.get(field)
        return info.alias if info is not None and info.alias else field

    @classmethod
    def accepted(cls) -> list[str]:
        """The field names a client may send."""
        return sorted(info.alias or name for name, info in cls.model_fields.items())


class Bad(ValueError):
    """A validator's refusal: ``tail`` ends the sentence ``name=value`` (``show_value=False``: ``name``) begins."""

    def __init__(self, tail: str, *, show_value: bool = True) -> None:
        super().__init__(tail)
        self.tail, self.show_value = tail, show_value


def stop_strings(value: Any) -> tuple[str, ...]:
    """``stop`` (OpenAI's, Triton's): None, a string, or a list of up to :data:`MAX_STOPS` non-empty strings."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise Bad(" must be a string or a list of strings")
    if len(items) > MAX_STOPS or any(not s for s in items):
        raise Bad(f": give at most {MAX_STOPS} non-empty stop strings")
    return tuple(items)


StopStrings = Annotated[tuple[str, ...], BeforeValidator(stop_strings)]


SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]", re.ASCII)  # a JSON escape of a UTF-16 surrogate


def lone_surrogate(data: bytes) -> str | None:
    r"""Where ``data`` (JSON) has a text with an unpaired UTF-16 surrogate (``"\ud800"``: no UTF-8 can carry
    it, so no tokenizer takes it): the value's path (``messages[0].content``), ``"a field name"`` for a key,
    else None. A pair (``"\ud83d\ude00"``) is one character and fine.

    >>> lone_surrogate(rb'{"prompt": "hi \ud800"}'), lone_surrogate(rb'{"prompt": "\ud83d\ude00"}')
    ('prompt', None)
    """
    if not SURROGATE_ESCAPE.search(data):
        return None
    try:
        doc = json.loads(data)
    except ValueError:
        return None  # pydantic names what is wrong with it

    def find(value: Any, loc: tuple[int | str, ...]) -> str | None:
        if isinstance(value, str):
            return path(loc) or "the request" if not bare(value) else None
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, item in items:
            if isinstance(key, str) and not bare(key):
                return "a field name" + (f" in {path(loc)}" if loc else "")
            found = find(item, (*loc, key))
            if found is not None:
                return found
        return None

    return find(doc, ())


def bare(text: str) -> bool:
    """Whether ``text`` has no unpaired surrogate (it encodes as UTF-8)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse(model: type[B], data: bytes, where: str = "") -> B:
    """``data`` (JSON) validated as ``model``; InputError naming the first field it cannot take (its message
    after ``where: `` when given). A text with an unpaired UTF-16 surrogate is refused, naming where."""
    bad = lone_surrogate(data)
    if bad is not None:
        field = None if bad.startswith(("a field name", "the request")) else bad
        error = InputError(f"{bad}: a text with an unpaired UTF-16 surrogate (\\ud800-\\udfff) is not text",
                           field=field)
        raise (InputError(f"{where}: {error}", field=field) if where else error)
    try:
        return model.model_validate_json(data)
    except ValidationError as exc:
        error = refusal(exc.errors(include_url=False), model)
        raise (InputError(f"{where}: {error}", field=error.field) if where else error) from None


def refusal(errors: Sequence[ErrorDetails], model: type[Body]) -> InputError:
    """The first of ``errors`` as an InputError; an unknown field first (it explains the others)."""
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    return describe((unknown or list(errors))[0], model)


def describe(error: ErrorDetails, model: type[Body]) -> InputError:
    kind, loc, value = error["type"], error["loc"], error.get("input")
    if kind == "json_invalid":
        why = str(error.get("ctx", {}).get("error", error["msg"]))
        if "recursion limit" in why:
            return InputError("the request's JSON nests too deeply")
        return InputError(f"the request is not valid JSON ({why})")
    if not loc:
        if kind in ("model_type", "dict_type"):
            return InputError(f"the request must be a JSON object, got {type(value).__name__}")
        return _raised(error, "the request") or InputError(f"the request: {error['msg']}")
    name = path(loc)
    if kind == "extra_forbidden":
        takes = f" (pyrt serve takes: {', '.join(model.accepted())})" if len(loc) == 1 else ""
        return InputError(f"unknown parameter {name!r}{takes}", field=name)
    if kind == "missing":
        return InputError(f"{name} is required", field=name)
    raised = _raised(error, name)
    if raised is not None:
        return raised
    wanted = WANTED.get(kind)
    said = f"must be {wanted}" if wanted else f"is refused: {error['msg']}"
    return InputError(f"{name}={shown(value)} {said}", field=name)


def _raised(error: ErrorDetails, name: str) -> InputError | None:
    """A validator's own refusal (:class:`Bad`, or an InputError it raised), else None."""
    raised = error.get("ctx", {}).get("error")
    if isinstance(raised, InputError):
        return raised
    if isinstance(raised, Bad):
        head = f"{name}={shown(error.get('input'))}" if raised.show_value else name
        return InputError(head + raised.tail, field=name if name != "the request" else None)
    if isinstance(raised, Exception):
        return InputError(f"{name}: {raised}", field=name)
    return None


def path(loc: Sequence[int | str]) -> str:
    """A location as a client reads it: ``("messages", 0, "content")`` -> ``messages[0].content``.

    >>> path(("messages", 0, "content", 1))
    'messages[0].content[1]'
    """
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


__all__ = ["Body", "Bad", "Field", "StrictInt", "StopStrings", "parse", "refusal", "path", "shown", "stop_strings"]
