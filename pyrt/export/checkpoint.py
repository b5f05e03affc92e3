"""``checkpoint_to_pte``: a local Hugging Face causal-LM checkpoint directory -> a .pte, its tokenizer beside it.

What ``pyrt export DIR -o m.pte`` runs. Every input is checked before any long work, each flaw a
:class:`~pyrt.errors.CheckpointError` naming the file: the directory's files and every shard's
header (a missing config, a truncated shard), the architecture and every stored tensor's shape
against ``config.json`` (built on the meta device), and the export options (``decoder_to_pte``'s
own checks). The weights are then loaded through safetensors' memory map: parameters are the
shards' mapped pages (kept in the checkpoint's dtype), never a second copy in memory, and the ONNX
parser reads them in place. The tokenizer files are copied to ``m.tokenizer/`` once the .pte is
written (:func:`pyrt.format.companions.find_tokenizer` finds them there). ``summary.stages`` has
the time and memory of each stage (load, export, build, write).

>>> s = checkpoint_to_pte("llama-dir", "m.pte", max_seq_len=1024, builder="tensorrt_rtx")  # doctest: +SKIP
>>> s.tokenizer, [r.name for r in s.stages]                                                # doctest: +SKIP
('m.tokenizer', ['load', 'export', 'build', 'write'])
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from pyrt.checks import is_int
from pyrt.errors import ExportError
from pyrt.export import decoder
from pyrt.export._checkpoint.directory import CheckpointFiles, open_directory
from pyrt.export._checkpoint.model import DTYPES, check_model, load_model, mapped_bytes
from pyrt.export._checkpoint.tokenizer import TokenizerCopy, tokenizer_sources
from pyrt.export._engines.progress import Progress
from pyrt.export.decoder_options import decoder_options
from pyrt.export.options import DEFAULT_BUILDER, DEFAULT_DEVICE
from pyrt.export.stage_meter import StageMeter, gib
from pyrt.export.summary import ExportSummary
from pyrt.format.companions import tokenizer_dir
from pyrt.format.weight_quant import DEFAULT_GROUP_SIZE

log = logging.getLogger("pyrt.export")
# the route checkpoint_to_pte takes, not one its caller asked for (the summary's route line says so)
CHECKPOINT_ROUTE = "pyrt export of a checkpoint directory takes pyrt's wrapper"
DEFAULT_MAX_SEQ_LEN = 2048  # the cache length when neither the caller nor a smaller model limit says otherwise


def checkpoint_to_pte(
    directory: str | os.PathLike[str],
    path: str | os.PathLike[str],
    *,
    max_seq_len: int | None = None,
    max_batch_size: int = 1,
    max_tokens_per_step: int | None = None,
    dtype: str | None = None,
    builder: str = DEFAULT_BUILDER,
    weight_streaming: bool = False,
    weight_streaming_budget: Any = None,
    device: Any = DEFAULT_DEVICE,
    tokenizer: str | os.PathLike[str] | bool = True,
    progress: bool | None = None,
    quantize: str | None = None,
    group_size: int = DEFAULT_GROUP_SIZE,
    max_engine_size: int | str | None = None,
) -> ExportSummary:
    """Export the causal LM in ``directory`` (``config.json``, ``*.safetensors``) to ``path``.

    ``max_seq_len``: KV-cache positions (default: the model's position limit, at most 2048).
    ``dtype``: "float16", "bfloat16" or "float32" (default: the dtype the weights are stored in;
    another dtype converts them, a copy in memory). ``tokenizer``: True keeps the directory's tokenizer
    files (if any) in ``m.tokenizer/`` beside the .pte, a folder keeps that folder's instead, False none.
    The other options (``quantize``, ``group_size`` and ``max_engine_size`` included) mean what they mean for
    :func:`pyrt.export.decoder_to_pte`; they are checked once, against the model the config describes (on the
    meta device, in the dtype the weights load in), before the weights load.
    """
    started = time.perf_counter()
    meter = StageMeter(bars=Progress(progress).bars)
    bars = Progress(progress, stages=meter)
    try:
        with bars.task(f"checking {directory}", stage="load"):
            files = open_directory(directory)
            torch_dtype = _dtype(dtype, files)
            meta = check_model(files, torch_dtype)
            options = decoder_options(
                meta, max_seq_len=_max_seq_len(max_seq_len, meta.config), builder=builder, batch_size=1,
                max_batch_size=max_batch_size, max_tokens_per_step=max_tokens_per_step, dtype=None,
                dynamic_prefill=True, route="pyrt", bos_id=None, eos_ids=None, weight_streaming=weight_streaming,
                weight_streaming_budget=weight_streaming_budget, device=device, progress=bars, quantize=quantize,
                group_size=group_size, max_engine_size=max_engine_size)
            target = _target(path)
            sources = _tokenizer_sources(files, tokenizer)
        with TokenizerCopy(sources, tokenizer_dir(target)) as copy:
            with bars.task("loading the weights (memory-mapped)", stage="load"):
                model = load_model(files, torch_dtype)
                _log_mapping(model, files)
            summary = decoder.write_decoder(model, target, options)
            kept = copy.commit()
    finally:
        stages = meter.close()
    why = CHECKPOINT_ROUTE if summary.route_reason == decoder.ASKED else summary.route_reason  # route="pyrt" above
    return replace(summary, stages=tuple(stages), tokenizer=None if kept is None else str(kept),
                   seconds=time.perf_counter() - started, route_reason=why)


def _dtype(dtype: str | None, files: CheckpointFiles) -> torch.dtype:
    if dtype is None:
        stored = files.stored_dtype()
        return DTYPES.get(stored or "", torch.float32)
    if dtype not in DTYPES:
        raise ExportError(f"dtype={dtype!r} is not one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def _max_seq_len(max_seq_len: int | None, config: Any) -> int:
    """The caller's cache length, else the model's position limit (and sliding window), at most 2048."""
    if max_seq_len is not None:
        return max_seq_len
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    names = ("max_position_embeddings", "n_positions", "sliding_window")
    limits: list[Any] = [getattr(text, name, None) for name in names]
    return min([DEFAULT_MAX_SEQ_LEN] + [n for n in limits if is_int(n, low=2)])


def _target(path: str | os.PathLike[str]) -> Path:
    target = Path(path)
    if target.is_dir():
        raise ExportError(f"path {str(target)!r} is a directory; give the .pte file to write")
    if not target.parent.is_dir():
        raise ExportError(f"the directory of {str(target)!r} does not exist")
    return target


def _tokenizer_sources(files: CheckpointFiles, tokenizer: Any) -> list[Path]:
    if tokenizer is False:
        return []
    if tokenizer is True:
        sources = tokenizer_sources(files.directory, required=False)
        if not sources:
            log.warning("%s holds no tokenizer files: `pyrt generate --prompt` and `pyrt serve`'s text routes "
                        "will need --tokenizer DIR", files.directory)
        return sources
    return tokenizer_sources(tokenizer, required=True)


def _log_mapping(model: Any, files: CheckpointFiles) -> None:
    mapped = mapped_bytes(model, files)
    if mapped is None:
        return
    inside, total = mapped
    log.info("weights: %s in parameters, %s of them the shards' mapped pages (the rest converted copies "
             "or buffers)", gib(total), gib(inside))


__all__ = ["checkpoint_to_pte", "DEFAULT_MAX_SEQ_LEN"]
