"""vLLM's ``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar`` on the structured-output path
(:meth:`pyrt.serve.structured.Grammars.requested`): each compiles to the grammar that allows exactly what it says,
checked by walking a text's tokens through the generation's matcher (the mask sampling uses, then the token).
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("llguidance")
pytest.importorskip("pydantic")

from pyrt.errors import InputError  # noqa: E402
from pyrt.serve.openai_api import ChatRequest, CompletionRequest  # noqa: E402
from pyrt.serve.structured import Grammar, Grammars  # noqa: E402
from pyrt.serve.validation import parse  # noqa: E402
from tests.fixtures import llm_serve as S  # noqa: E402

EOS = (2,)


@pytest.fixture(scope="module")
def grammars() -> Grammars:
    from pyrt.serve.text import load_tokenizer

    tok = load_tokenizer(str(S.json_tokenizer_dir()))
    return Grammars(tok, len(tok))


def takes(grammars: Grammars, grammar: Grammar | None, text: str) -> bool:
    """Whether the grammar allows ``text``'s tokens one by one and may end after them."""
    assert grammar is not None
    matcher = grammar.matcher()
    for token in grammars.hf.encode(text, add_special_tokens=False):
        if not matcher.allowed(EOS)[token]:
            return False
        matcher.accept(token)
    return bool(matcher.finished or matcher.allowed(EOS)[EOS[0]])


def asked(grammars: Grammars, body: bytes) -> Grammar | None:
    request: Any = parse(CompletionRequest, body)
    return grammars.requested(request.response_format, request.guided)


def test_guided_choice_takes_exactly_one_of_the_choices(grammars: Grammars) -> None:
    g = asked(grammars, b'{"prompt": "x", "guided_choice": ["yes", "no", "a \\"quoted\\" one"]}')
    assert takes(grammars, g, "yes") and takes(grammars, g, "no") and takes(grammars, g, 'a "quoted" one')
    assert not takes(grammars, g, "maybe") and not takes(grammars, g, "yesno")


def test_guided_regex_and_grammar(grammars: Grammars) -> None:
    g = asked(grammars, b'{"prompt": "x", "guided_regex": "[0-9]{3}-[a-z]+"}')
    assert takes(grammars, g, "123-abc") and not takes(grammars, g, "12-abc") and not takes(grammars, g, "123-4")
    lark = b'{"prompt": "x", "guided_grammar": "start: \\"(\\" NUMBER (\\",\\" NUMBER)* \\")\\"\\nNUMBER: /[0-9]+/"}'
    g = asked(grammars, lark)
    assert takes(grammars, g, "(1,22,333)") and not takes(grammars, g, "(1,,2)")


def test_guided_json_takes_a_schema_or_its_text(grammars: Grammars) -> None:
    schema = (b'{"type": "object", "required": ["n"], "additionalProperties": false, '
              b'"properties": {"n": {"enum": [1, 2]}}}')
    for value in (schema, b'"' + schema.replace(b'"', b'\\"') + b'"'):
        g = asked(grammars, b'{"prompt": "x", "guided_json": ' + value + b"}")
        assert takes(grammars, g, '{"n":2}') and not takes(grammars, g, '{"n":3}')
    chat: Any = parse(ChatRequest, b'{"messages": [{"role": "user", "content": "x"}], "guided_json": ' + schema + b"}")
    assert takes(grammars, grammars.requested(chat.response_format, chat.guided), '{"n":1}')


@pytest.mark.parametrize(("body", "message"), [
    (b'"guided_regex": "a", "guided_choice": ["a"]', "guided_regex, guided_choice: give one of them"),
    (b'"response_format": {"type": "json_object"}, "guided_regex": "a"', "response_format, guided_regex: give one"),
    (b'"guided_choice": []', "guided_choice must be a list of non-empty strings"),
    (b'"guided_json": "{not json"', "guided_json: not JSON"),
    (b'"guided_json": [1]', "guided_json must be a JSON schema"),
    (b'"guided_regex": 3', "guided_regex must be a non-empty string"),
])
def test_bad_guided_fields_are_named(grammars: Grammars, body: bytes, message: str) -> None:
    with pytest.raises(InputError, match=message):
        asked(grammars, b'{"prompt": "x", ' + body + b"}")
