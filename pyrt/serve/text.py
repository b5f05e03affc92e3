"""Text for the generation routes: a local Hugging Face tokenizer, text deltas as tokens come, stop strings.

:func:`load_tokenizer` loads a tokenizer directory once per replica (no download, no torch).
:class:`TextStream` turns a generation's token ids into text deltas: whatever ends in an
incomplete UTF-8 sequence (a character whose bytes are split across tokens decodes to U+FFFD
until its last byte comes) is held back, and so is a tail that could be the start of a stop
string; the text stops before the first stop string. The deltas joined are the text of the
tokens decoded at once (``tokenizer.decode(ids, skip_special_tokens=True)``), cut at a stop string.

>>> stop = StopText(("END",))
>>> stop.add("one E"), stop.add("N"), stop.add("D two"), stop.stopped
('one ', '', '', True)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pyrt.errors import InputError, PyrtError

REPLACEMENT = "\ufffd"  # what a decoder gives for bytes that are not (yet) a whole UTF-8 character


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")


def load_tokenizer(directory: str, flag: str = "--tokenizer") -> Any:
    """The tokenizer in ``directory`` as ``AutoTokenizer.from_pretrained(directory, local_files_only=True)`` loads it.

    The class ``tokenizer_config.json`` names is imported from ``transformers`` by that name:
    ``AutoTokenizer``'s module imports torch (its model configurations) and a replica of a
    numpy-kernel program would pay for torch to read a tokenizer. A directory that names no
    class goes through ``AutoTokenizer`` itself. InputError naming the directory (given with ``flag``) and the
    reason on one line when it cannot load: not a folder, no tokenizer file in it, what transformers says.
    """
    path = Path(directory)
    if not path.is_dir():
        raise InputError(f"{flag} {directory!r} is not a directory (a local Hugging Face tokenizer: "
                         "tokenizer.json, tokenizer_config.json)")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise InputError(f"{flag} {directory!r} holds no tokenizer files (none of {', '.join(TOKENIZER_FILES)})")
    try:
        import transformers
    except ImportError:
        raise PyrtError(f"{flag} needs transformers: pip install transformers") from None
    cls = tokenizer_class(path, transformers)
    try:
        return cls.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # transformers raises many types for a directory it cannot read
        said = " ".join(str(exc).split())  # one line: transformers' messages run over several
        raise InputError(f"{flag} {directory!r} could not be loaded: {type(exc).__name__}: {said}") from None


def read_chat_template(path: str) -> str:
    """The text of a chat template file (InputError naming ``--chat-template`` when it cannot be read)."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"--chat-template {path!r}: cannot be read ({getattr(exc, 'strerror', None) or exc})") \
            from None


def tokenizer_class(path: Path, transformers: Any) -> Any:
    """The class ``AutoTokenizer`` would pick for ``path`` (``tokenizer_config.json``'s ``tokenizer_class``)."""
    try:
        config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    name = config.get("tokenizer_class") if isinstance(config, dict) else None
    for candidate in ((name, name.removesuffix("Fast")) if isinstance(name, str) else ()):
        cls = getattr(transformers, candidate, None) if candidate.isidentifier() else None
        if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedTokenizerBase):
            return cls
    return transformers.AutoTokenizer


class Detokenizer:
    """Text deltas of a growing list of token ids (the prefix-window method of TGI and vLLM).

    Each call decodes two short windows: the tokens since the last clean point, with and
    without the new ones; the difference is the new text, held back while it ends in U+FFFD.
    """

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self.tokenizer, self.skip = tokenizer, skip_special_tokens
        self.ids: list[int] = []
        self.prefix = self.read = 0  # ids[prefix:read] decoded to text already given out

    def decode(self, ids: Sequence[int]) -> str:
        text: str = self.tokenizer.decode(list(ids), skip_special_tokens=self.skip, clean_up_tokenization_spaces=False)
        return text

    def add(self, ids: Sequence[int]) -> str:
        """The text the new ``ids`` complete ("" while a character is incomplete)."""
        self.ids.extend(ids)
        before = self.decode(self.ids[self.prefix:self.read])
        after = self.decode(self.ids[self.prefix:])
        if len(after) > len(before) and not after.endswith(REPLACEMENT):
            self.prefix, self.read = self.read, len(self.ids)
            return after[len(before):]
        return ""

    def flush(self) -> str:
        """Whatever is held back (the generation ended: an incomplete character stays U+FFFD)."""
        before = self.decode(self.ids[self.prefix:self.read])
        after = self.decode(self.ids[self.prefix:])
        self.prefix = self.read = len(self.ids)
        return after[len(before):]


class StopText:
    """Text up to the first stop string (``include``: and the stop string itself, vLLM's
    ``include_stop_str_in_output``); a tail that could begin one is held back until it cannot."""

    def __init__(self, stops: Sequence[str], include: bool = False) -> None:
        self.stops, self.include = tuple(stops), include
        self.held = ""
        self.stopped = False

    def add(self, text: str) -> str:
        """The part of ``text`` (with what was held) that is safe to give out."""
        if self.stopped:
            return ""
        self.held += text
        found = [(i, len(s)) for i, s in ((self.held.find(s), s) for s in self.stops) if i >= 0]
        if found:
            at, size = min(found)
            out, self.held, self.stopped = self.held[:at + (size if self.include else 0)], "", True
            return out
        keep = self._partial()
        out, self.held = self.held[:len(self.held) - keep], self.held[len(self.held) - keep:]
        return out

    def _partial(self) -> int:
        """The length of the longest tail of the held text that begins some stop string."""
        best = 0
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(self.held)), best, -1):
                if self.held.endswith(stop[:k]):
                    best = k
                    break
        return best

    def flush(self) -> str:
        out, self.held = ("" if self.stopped else self.held), ""
        return out


class TextStream:
    """A generation's text: :class:`Detokenizer` then :class:`StopText`; ``tokens``: ids taken so far."""

    def __init__(self, tokenizer: Any, stops: Sequence[str] = (), *, skip_special_tokens: bool = True,
                 include_stop: bool = False) -> None:
        self.detok = Detokenizer(tokenizer, skip_special_tokens)
        self.stop = StopText(stops, include_stop)
        self.tokens = 0

    @property
    def stopped(self) -> bool:
        return self.stop.stopped

    def add(self, ids: Sequence[int]) -> str:
        """The text to give out after ``ids`` (nothing once a stop string was found)."""
        if self.stop.stopped:
            return ""
        self.tokens += len(ids)
        return self.stop.add(self.detok.add(ids))

    def flush(self) -> str:
        """The rest, once the generation ended."""
        if self.stop.stopped:
            return ""
        return self.stop.add(self.detok.flush()) + self.stop.flush()
