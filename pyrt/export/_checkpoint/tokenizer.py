"""The tokenizer kept with an exported .pte: its files copied to ``m.tokenizer/`` beside ``m.pte``.

The copy is staged in a working directory next to the target before the long export starts (a
missing or unreadable file fails it at once) and swapped into place only once the .pte is written;
an older ``m.tokenizer/`` is replaced whole, never merged, and an export that keeps no tokenizer
(``--no-tokenizer``, a checkpoint without one) removes it, saying so: a tokenizer beside a .pte is
that .pte's. The folder's mode follows the umask, as the .pte's does (a working directory is made
``0700``). Working directories are named like
the export's own, so a killed export's are swept by the next one (:mod:`pyrt.export._files.tempfiles`).

>>> import tempfile, pathlib
>>> src, out = pathlib.Path(tempfile.mkdtemp()), pathlib.Path(tempfile.mkdtemp())
>>> _ = (src / "tokenizer.json").write_text("{}")
>>> with TokenizerCopy([src / "tokenizer.json"], out / "m.tokenizer") as copy:
...     _ = copy.commit()
>>> sorted(p.name for p in (out / "m.tokenizer").iterdir())
['tokenizer.json']
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pyrt.errors import CheckpointError, ExportError
from pyrt.export._checkpoint.directory import CONFIG, TOKENIZER_FILES
from pyrt.export._files.tempfiles import engine_dir_prefix
from pyrt.format.companions import MARKERS

log = logging.getLogger("pyrt.export")
EXTRA = (CONFIG, "generation_config.json")  # small files AutoTokenizer may read to pick the tokenizer class


def tokenizer_sources(directory: str | os.PathLike[str], *, required: bool) -> list[Path]:
    """The tokenizer files of ``directory`` (with its config); ``required``: CheckpointError when it has none."""
    root = Path(directory)
    if required and not root.is_dir():
        raise CheckpointError(root, "not a directory: --tokenizer takes a Hugging Face tokenizer folder")
    files = [root / name for name in TOKENIZER_FILES + EXTRA if (root / name).is_file()]
    if not any(f.name in MARKERS for f in files):
        if required:
            raise CheckpointError(root, f"holds no tokenizer ({' or '.join(MARKERS)})")
        return []
    return files


class TokenizerCopy:
    """Stage ``files`` in a working directory now; :meth:`commit` puts them at ``target``."""

    def __init__(self, files: Sequence[Path], target: Path) -> None:
        self.files, self.target = list(files), target
        self.stage: Path | None = None

    def __enter__(self) -> TokenizerCopy:
        if self.target.is_symlink() or self.target.exists() and not self.target.is_dir():
            raise ExportError(f"{str(self.target)!r} exists and is not a folder: the tokenizer goes there (an "
                              "export that keeps none removes an older tokenizer folder there)")
        if not self.files:  # nothing to keep: nothing staged; an older folder goes at the commit
            return self
        try:
            self.stage = Path(tempfile.mkdtemp(prefix=engine_dir_prefix(), dir=self.target.parent))
            self.stage.chmod(0o777 & ~_umask())  # mkdtemp's 0700 would hide it from whoever can read the .pte
            for source in self.files:
                shutil.copyfile(source, self.stage / source.name)
        except OSError as exc:
            self._drop(self.stage)
            where = getattr(exc, "filename", None) or self.target.parent
            raise CheckpointError(where, f"cannot copy the tokenizer: {exc.strerror or exc}") from None
        return self

    def commit(self) -> Path | None:
        """Swap the staged copy into place (replacing an older one); returns the target (None: no files, and an
        older folder at the target removed)."""
        if not self.files:
            self._remove_older()
            return None
        if self.stage is None:
            raise ExportError("TokenizerCopy.commit() outside its with block")
        old = None
        try:
            if self.target.exists():
                old = Path(tempfile.mkdtemp(prefix=engine_dir_prefix(), dir=self.target.parent)) / "old"
                os.replace(self.target, old)
            os.replace(self.stage, self.target)
        except OSError as exc:
            if old is not None and not self.target.exists():
                with contextlib.suppress(OSError):
                    os.replace(old, self.target)  # the older tokenizer back where it was
            raise ExportError(f"cannot put the tokenizer at {str(self.target)!r}: {exc.strerror or exc}") from None
        self.stage = None
        if old is not None:
            self._drop(old.parent)
        return self.target

    def _remove_older(self) -> None:
        """An export that keeps no tokenizer: the older folder at the target goes (moved aside, then deleted)."""
        if not self.target.is_dir() or self.target.is_symlink():
            return
        aside = Path(tempfile.mkdtemp(prefix=engine_dir_prefix(), dir=self.target.parent))
        try:
            os.replace(self.target, aside / "old")
        except OSError as exc:
            raise ExportError(f"cannot remove the older tokenizer folder {str(self.target)!r} (this export keeps "
                              f"none): {exc.strerror or exc}") from None
        finally:
            self._drop(aside)
        log.warning("removed the older tokenizer folder %s: this export keeps no tokenizer", self.target)

    def __exit__(self, *exc: Any) -> None:
        self._drop(self.stage)

    @staticmethod
    def _drop(path: Path | None) -> None:
        if path is not None:
            with contextlib.suppress(OSError):
                shutil.rmtree(path)


def _umask() -> int:
    """This process's umask (read from /proc where there is one: setting it to read it back races threads)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
