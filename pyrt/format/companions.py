"""Files that travel with a .pte: where ``pyrt export`` keeps an LLM's tokenizer, and where
``pyrt generate`` and ``pyrt serve`` look for it when ``--tokenizer`` is not given.

``pyrt export DIR -o out/m.pte`` copies the checkpoint's tokenizer files to ``out/m.tokenizer/``
(:func:`tokenizer_dir`), and :func:`find_tokenizer` looks there and nowhere else: one place, named
after the file, so a program never picks up an unrelated tokenizer that shares its folder.
Paths only: nothing here reads a tokenizer or imports transformers.

>>> str(tokenizer_dir("out/m.pte"))
'out/m.tokenizer'
>>> find_tokenizer("/nonexistent/m.pte") is None
True
"""

from __future__ import annotations

import os
from pathlib import Path

SUFFIX = ".tokenizer"
# Any one of these in a folder makes it a Hugging Face tokenizer folder (AutoTokenizer loads it).
MARKERS = ("tokenizer.json", "tokenizer_config.json")


def tokenizer_dir(pte_path: str | os.PathLike[str]) -> Path:
    """Where the tokenizer of ``pte_path`` goes: ``m.pte`` -> ``m.tokenizer`` beside it."""
    path = Path(pte_path)
    return path.with_name(path.stem + SUFFIX)


def find_tokenizer(pte_path: str | os.PathLike[str]) -> str | None:
    """The tokenizer folder of ``pte_path`` (``m.tokenizer/`` beside it, holding tokenizer files), else None."""
    folder = tokenizer_dir(pte_path)
    return str(folder) if any((folder / name).is_file() for name in MARKERS) else None
