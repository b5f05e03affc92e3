"""The tokenizer kept beside an exported .pte (:class:`pyrt.export._checkpoint.tokenizer.TokenizerCopy`): its
folder's mode follows the umask as the .pte's does, and an export that keeps none removes an older one (issue 46:
``drwx------`` beside a ``-rw-r--r--`` .pte; ``--no-tokenizer`` left ``m.tokenizer/`` for ``pyrt generate`` to use)."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyrt.errors import ExportError
from pyrt.export._checkpoint.tokenizer import TokenizerCopy


@pytest.fixture
def source(tmp_path: Path) -> list[Path]:
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "tokenizer.json").write_text("{}")
    return [folder / "tokenizer.json"]


@pytest.fixture
def umask() -> Iterator[None]:
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o077])
def test_the_folder_s_mode_follows_the_umask(tmp_path: Path, source: list[Path], umask: None, mask: int) -> None:
    os.umask(mask)
    out = tmp_path / "out"
    out.mkdir()
    pte = out / "m.pte"
    pte.write_bytes(b"")  # as the .pte is created: 0666 less the umask
    with TokenizerCopy(source, out / "m.tokenizer") as copy:
        kept = copy.commit()
    assert kept is not None
    assert stat.S_IMODE(kept.stat().st_mode) == 0o777 & ~mask
    assert stat.S_IMODE((kept / "tokenizer.json").stat().st_mode) == stat.S_IMODE(pte.stat().st_mode) == 0o666 & ~mask


def test_an_export_that_keeps_no_tokenizer_removes_an_older_one_and_says_so(
        tmp_path: Path, source: list[Path], caplog: pytest.LogCaptureFixture) -> None:
    with TokenizerCopy(source, tmp_path / "m.tokenizer") as copy:
        old = copy.commit()
    assert old is not None and (old / "tokenizer.json").is_file()
    with caplog.at_level(logging.WARNING, logger="pyrt.export"), TokenizerCopy([], old) as copy:
        assert old.is_dir()  # until the .pte is written
        assert copy.commit() is None
    assert not old.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]  # no working dir left
    assert f"removed the older tokenizer folder {old}" in caplog.text


def test_a_file_where_the_folder_goes_is_refused_before_the_export(tmp_path: Path) -> None:
    (tmp_path / "m.tokenizer").write_text("not a folder")
    with pytest.raises(ExportError, match="m.tokenizer' exists and is not a folder"):
        TokenizerCopy([], tmp_path / "m.tokenizer").__enter__()
