"""What a replica knows about its tokenizer beyond text: token texts and bytes, a prompt's least token count,
the sampling defaults of the tokenizer directory.

- :class:`TokenTexts`: a token id's text (``decode([id])``) and its bytes (a byte-level BPE's token
  string mapped back through the GPT-2 byte alphabet, a SentencePiece ``<0xNN>`` byte token, else the
  text's UTF-8), cached: what ``logprobs`` report per token.
- :func:`most_chars`: the most characters one token stands for (its vocabulary's longest token
  string): a text of C characters is at least C / that many tokens, so a prompt sure to overflow the
  context is refused before it is tokenized (a tokenizer whose normalizer deletes characters could
  make this bound too high; none of the byte-level or SentencePiece tokenizers LLMs use does).
- :func:`generation_defaults`: ``generation_config.json``'s ``temperature``, ``top_p``, ``top_k``,
  ``repetition_penalty`` and ``min_p``, which a request that leaves them out gets (as vLLM).

>>> byte_alphabet()[ord("A")], byte_alphabet()[ord(" ")], len(byte_alphabet())
('A', 'Ġ', 256)
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

from pyrt.checks import is_number

DEFAULTS = ("temperature", "top_p", "top_k", "repetition_penalty", "min_p")
_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@functools.cache
def byte_alphabet() -> dict[int, str]:
    """The byte-level BPE alphabet (GPT-2's): printable Latin-1 bytes stand for themselves, the other bytes for
    the code points from 256 on, in byte order."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, extra = {b: chr(b) for b in kept}, 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + extra)
            extra += 1
    return dict(sorted(out.items()))


@functools.cache
def byte_of() -> dict[str, int]:
    return {c: b for b, c in byte_alphabet().items()}


class TokenTexts:
    """Token id -> (text, bytes) of ``tokenizer``, cached."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token: int) -> tuple[str, list[int]]:
        found = self._cache.get(token)
        if found is None:
            found = self._cache[token] = self._make(token)
        return found

    def _make(self, token: int) -> tuple[str, list[int]]:
        text = str(self.tokenizer.decode([token], skip_special_tokens=False, clean_up_tokenization_spaces=False))
        piece = self.tokenizer.convert_ids_to_tokens(token)
        if isinstance(piece, str) and piece not in self.tokenizer.all_special_tokens:
            byte = _BYTE_TOKEN.match(piece)
            if byte:
                return text, [int(byte.group(1), 16)]
            table = byte_of()
            if "\ufffd" in text and all(c in table for c in piece):
                return text, [table[c] for c in piece]
        return text, list(text.encode("utf-8", "surrogatepass"))


def most_chars(tokenizer: Any) -> int:
    """The most characters one token of ``tokenizer`` stands for (at least 1)."""
    vocab = tokenizer.get_vocab()
    return max([1, *(len(piece) for piece in vocab)])


def generation_defaults(directory: str | None) -> dict[str, Any]:
    """The sampling defaults of ``directory/generation_config.json`` (absent or unreadable: none)."""
    if directory is None:
        return {}
    try:
        config = json.loads((Path(directory) / "generation_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(config, dict):
        return {}
    return {k: config[k] for k in DEFAULTS if is_number(config.get(k))}  # as vLLM reads them (do_sample aside)
