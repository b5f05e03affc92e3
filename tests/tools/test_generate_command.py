"""``pyrt generate``'s checks before a program is opened: the file, the tokenizer folder, flags that need others.

In process (:func:`pyrt.tools.cli.main`); no program is needed, as each is refused before one is loaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pyrt.tools.cli import main


def run(capsys: pytest.CaptureFixture[str], *args: Any) -> tuple[int, str]:
    status = main([str(a) for a in args])
    return status, capsys.readouterr().err


def one_line(err: str) -> str:
    assert err.startswith("pyrt: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_a_missing_file_is_named_as_missing_not_as_a_missing_tokenizer(capsys: Any, tmp_path: Path) -> None:
    missing = tmp_path / "nothere.pte"
    status, err = run(capsys, "generate", missing, "--prompt", "hi")
    assert status == 1 and f"{missing}: no such file" in one_line(err) and "--tokenizer" not in err


def test_a_folder_without_tokenizer_files_is_refused_on_one_line(capsys: Any, tmp_path: Path) -> None:
    pte, empty = tmp_path / "m.pte", tmp_path / "empty"
    pte.write_bytes(b"not read: the tokenizer is refused first")
    empty.mkdir()
    status, err = run(capsys, "generate", pte, "--prompt", "hi", "--tokenizer", empty)
    assert status == 1 and f"--tokenizer '{empty}' holds no tokenizer files" in one_line(err)


def test_transformers_many_lines_become_one(capsys: Any, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    pte, broken = tmp_path / "m.pte", tmp_path / "broken"
    pte.write_bytes(b"not read")
    broken.mkdir()
    (broken / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast"}')
    status, err = run(capsys, "generate", pte, "--prompt", "hi", "--tokenizer", broken)
    assert status == 1 and f"--tokenizer '{broken}' could not be loaded: " in one_line(err)
