"""``pt2_to_pte``: a ``torch.export.save``d program (.pt2) -> a .pte, as ``to_pte`` writes it.

What ``pyrt export prog.pt2 -o m.pte`` runs. The archive is checked before it is loaded (it must be
a file and a zip archive, what ``torch.export.save`` writes); any failure to load it is a
:class:`~pyrt.errors.CheckpointError` naming the file. ``tokenizer``: a folder whose tokenizer files
are kept in ``m.tokenizer/`` beside the .pte (a program carries none of its own).

>>> pt2_to_pte("prog.pt2", "m.pte", builder="tensorrt_rtx")   # doctest: +SKIP
"""

from __future__ import annotations

import os
import time
import zipfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from pyrt.errors import CheckpointError
from pyrt.export._checkpoint.tokenizer import TokenizerCopy, tokenizer_sources
from pyrt.export._engines.progress import Progress
from pyrt.export.api import write_pte
from pyrt.export.options import DEFAULT_BUILDER, DEFAULT_DEVICE, make_options
from pyrt.export.stage_meter import StageMeter
from pyrt.export.summary import ExportSummary
from pyrt.format.companions import tokenizer_dir


def load_pt2(source: str | os.PathLike[str]) -> torch.export.ExportedProgram:
    """The program in ``source``; CheckpointError naming the file when it is not one ``torch.export.load`` reads."""
    path = Path(source)
    if not path.is_file():
        raise CheckpointError(path, "not a file (a .pt2 from torch.export.save, or a checkpoint directory)")
    if not zipfile.is_zipfile(path):
        raise CheckpointError(path, "not a zip archive: not a program saved by torch.export.save")
    try:
        program = torch.export.load(path)
    except Exception as exc:  # torch.export.load raises many types for archives it cannot read
        raise CheckpointError(path, f"torch.export.load failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(program, torch.export.ExportedProgram):
        raise CheckpointError(path, f"holds a {type(program).__name__}, not an ExportedProgram")
    return program


def pt2_to_pte(source: str | os.PathLike[str], path: str | os.PathLike[str], *, builder: str = DEFAULT_BUILDER,
               weight_streaming: bool = False, weight_streaming_budget: Any = None, device: Any = DEFAULT_DEVICE,
               tokenizer: str | os.PathLike[str] | None = None, progress: bool | None = None) -> ExportSummary:
    """Export the program in ``source`` to ``path`` (options as for :func:`pyrt.export.to_pte`, checked once,
    before the program loads)."""
    started = time.perf_counter()
    meter = StageMeter(bars=Progress(progress).bars)
    bars = Progress(progress, stages=meter)
    try:
        options = make_options(device=device, weight_streaming=weight_streaming, builder=builder,
                               weight_streaming_budget=weight_streaming_budget, progress=bars)
        sources = [] if tokenizer is None else tokenizer_sources(tokenizer, required=True)
        with TokenizerCopy(sources, tokenizer_dir(path)) as copy:
            with bars.task(f"loading {Path(source).name}", stage="load"):
                program = load_pt2(source)
            summary = write_pte(program, Path(path), options)
            kept = copy.commit()
    finally:
        stages = meter.close()
    return replace(summary, stages=tuple(stages), tokenizer=None if kept is None else str(kept),
                   seconds=time.perf_counter() - started)


__all__ = ["pt2_to_pte", "load_pt2"]
