"""A checkpoint directory as a transformers causal LM: checked against its config, then loaded once.

:func:`check_model` reads ``config.json`` with transformers, refuses what is not a decoder-only
causal LM transformers ships (custom code, encoder-decoders, other heads), builds the model on the
meta device (no weight memory) and compares every stored tensor's shape with the one the config
makes, naming the shard of any that disagrees. :func:`load_model` then loads it with
``from_pretrained``, which (transformers 5) hands each parameter the shard's memory-mapped tensor
when the dtype is kept, so the weights stay file-backed pages, never a second copy;
:func:`mapped_bytes` says how many parameter bytes are mapped from the shards (Linux).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from pyrt.errors import CheckpointError
from pyrt.export._checkpoint.directory import CONFIG, INDEX, SINGLE, CheckpointFiles
from pyrt.export._files.page_release import file_spans

log = logging.getLogger("pyrt.export")
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def check_model(files: CheckpointFiles, dtype: torch.dtype | None = None) -> Any:
    """The model on the meta device (no weights; ``.config`` its config; its parameters in ``dtype``, the one the
    weights will load in, default the config's) of a causal LM whose stored tensors fit it; CheckpointError
    otherwise."""
    config_path = files.directory / CONFIG
    if "auto_map" in files.config:
        raise CheckpointError(config_path, "asks for the model's own Python code (auto_map); pyrt export runs "
                                           "only architectures that transformers ships")
    config = _config(files)
    meta = _meta_model(config, config_path, dtype)
    _check_shapes(files, meta)
    return meta


def _config(files: CheckpointFiles) -> Any:
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    path = files.directory / CONFIG
    model_type = files.config.get("model_type")
    if not isinstance(model_type, str):
        raise CheckpointError(path, "has no model_type: not a transformers model configuration")
    try:
        config = AutoConfig.from_pretrained(files.directory, local_files_only=True)
    except (ValueError, KeyError, OSError, TypeError) as exc:
        raise CheckpointError(path, f"transformers cannot read it: {exc}") from None
    if getattr(config, "is_encoder_decoder", False):
        raise CheckpointError(path, f"model_type {model_type!r} is an encoder-decoder model; pyrt export takes "
                                    "decoder-only causal LMs")
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise CheckpointError(path, f"model_type {model_type!r} has no causal-LM class in transformers "
                                    "(AutoModelForCausalLM); pyrt export takes decoder-only causal LMs")
    known = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    named = files.config.get("architectures") or []
    if isinstance(named, list) and named and not any(a in known for a in named):
        raise CheckpointError(path, f"architectures {named} name no causal LM (a checkpoint of another head, "
                                    f"such as a classifier); transformers' causal LM for {model_type!r} is "
                                    f"{MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]}")
    return config


def _meta_model(config: Any, config_path: Path, dtype: torch.dtype | None) -> Any:
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, **({} if dtype is None else {"dtype": dtype}))
    except Exception as exc:  # transformers raises many types for configs it cannot build
        raise CheckpointError(config_path, f"transformers cannot build the model it describes: "
                                           f"{type(exc).__name__}: {exc}") from None


def _check_shapes(files: CheckpointFiles, meta: Any) -> None:
    """Each stored tensor the model has (its name as stored, or without the base model's prefix) has its shape."""
    expected = {name: tuple(t.shape) for name, t in meta.state_dict().items()}
    prefix = f"{getattr(meta, 'base_model_prefix', '')}."
    for name, (entry, shard) in files.tensors.items():
        shape = expected.get(name, expected.get(prefix + name))
        if shape is not None and entry.shape != shape:
            raise CheckpointError(shard, f"tensor {name!r} is {list(entry.shape)}, but {CONFIG} makes it "
                                         f"{list(shape)} (the shard and the config are of different models)")


def load_model(files: CheckpointFiles, dtype: torch.dtype) -> Any:
    """``from_pretrained`` in ``dtype``, in eval mode; a tensor the config needs but no shard holds is an error."""
    from transformers import AutoModelForCausalLM

    try:
        with _no_transformers_bar():
            loaded: Any = AutoModelForCausalLM.from_pretrained(files.directory, dtype=dtype, local_files_only=True,
                                                               output_loading_info=True)
    except (OSError, ValueError, RuntimeError) as exc:
        raise CheckpointError(files.directory, f"transformers could not load it: {type(exc).__name__}: {exc}"
                              ) from None
    model, info = loaded
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        where = files.directory / (INDEX if (files.directory / INDEX).is_file() else SINGLE)
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise CheckpointError(where, f"lacks {len(missing)} tensor(s) {CONFIG} needs: {shown}")
    if info.get("unexpected_keys"):
        log.info("ignored %d stored tensor(s) the model does not use: %s", len(info["unexpected_keys"]),
                 ", ".join(sorted(info["unexpected_keys"])[:5]))
    return model.eval()


@contextlib.contextmanager
def _no_transformers_bar() -> Iterator[None]:
    """transformers' own "Loading weights" bar stays off (pyrt's stage bar says what happens)."""
    from transformers.utils import logging as tf_logging

    shown = tf_logging.is_progress_bar_enabled()
    tf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            tf_logging.enable_progress_bar()


def mapped_bytes(model: Any, files: CheckpointFiles) -> tuple[int, int] | None:
    """(parameter bytes mapped from the shards, all parameter bytes); None where ``/proc/self/maps`` is absent."""
    shards = {str(Path(s.path).resolve()) for s in files.shards}
    if not Path("/proc/self/maps").exists():
        return None
    spans = [(s.start, s.end) for s in file_spans() if s.path in shards]
    total = mapped = 0
    seen: set[int] = set()
    for p in model.parameters():
        if p.data_ptr() in seen:
            continue
        seen.add(p.data_ptr())
        total += p.nbytes
        if any(lo <= p.data_ptr() < hi for lo, hi in spans):
            mapped += p.nbytes
    return mapped, total
