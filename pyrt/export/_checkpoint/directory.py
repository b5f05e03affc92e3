"""A Hugging Face checkpoint directory's files, found and checked before any long work.

What ``save_pretrained`` writes: ``config.json``; the weights as ``model.safetensors`` or shards
named by ``model.safetensors.index.json``; ``generation_config.json``; the tokenizer's files.
:func:`open_directory` reads the JSON files and every shard's header (never its tensors), so a
missing config, a shard the index names but the directory lacks, a truncated shard or a tensor in
two shards is a :class:`~pyrt.errors.CheckpointError` naming the file, in well under a second.

>>> open_directory("/nonexistent")                      # doctest: +ELLIPSIS
Traceback (most recent call last):
pyrt.errors.CheckpointError: /nonexistent: not a directory ...
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyrt.errors import CheckpointError
from pyrt.export._checkpoint.safetensors_header import FLOATING, ShardHeader, TensorEntry, read_header

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
# A tokenizer's files as transformers saves them (the fast, slow and sentencepiece kinds, chat templates).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "tokenizer.model", "spiece.model", "vocab.json", "merges.txt", "vocab.txt",
                   "chat_template.jinja", "chat_template.json")
PICKLED = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt", "model.pth")


@dataclass(frozen=True)
class CheckpointFiles:
    """A checked checkpoint directory: its config, shards (headers read) and tokenizer files."""

    directory: Path
    config: dict[str, Any]
    shards: tuple[ShardHeader, ...]
    tokenizer_files: tuple[Path, ...]

    @property
    def tensors(self) -> dict[str, tuple[TensorEntry, str]]:
        """Tensor name -> (its entry, the shard file holding it)."""
        return {name: (entry, shard.path) for shard in self.shards for name, entry in shard.tensors.items()}

    @property
    def weight_bytes(self) -> int:
        return sum(shard.data_bytes for shard in self.shards)

    def stored_dtype(self) -> str | None:
        """The floating dtype most of the weights' bytes are stored in (``"float16"``, ...), if any."""
        sizes: Counter[str] = Counter()
        for shard in self.shards:
            for entry in shard.tensors.values():
                if entry.dtype in FLOATING:
                    sizes[FLOATING[entry.dtype]] += entry.end - entry.begin
        return sizes.most_common(1)[0][0] if sizes else None


def open_directory(directory: str | os.PathLike[str]) -> CheckpointFiles:
    """Find and check a checkpoint directory's files (headers only); CheckpointError names the file at fault."""
    root = Path(directory)
    if not root.is_dir():
        raise CheckpointError(root, "not a directory (pyrt export takes a Hugging Face checkpoint directory "
                                    "or a torch.export .pt2 file)")
    config = _json(root / CONFIG, "the model's configuration (save_pretrained writes it)")
    paths, weight_map = _shard_paths(root)
    shards = tuple(read_header(p) for p in paths)
    _check_unique(shards)
    _check_index(root / INDEX, weight_map, shards)
    tokenizer = tuple(root / name for name in TOKENIZER_FILES if (root / name).is_file())
    return CheckpointFiles(root, config, shards, tokenizer)


def _json(path: Path, what: str) -> dict[str, Any]:
    if not path.is_file():
        raise CheckpointError(path, f"missing: {what}")
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CheckpointError(path, f"cannot read: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(path, f"not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise CheckpointError(path, f"a JSON {type(value).__name__}, expected an object")
    return value


def _shard_paths(root: Path) -> tuple[list[Path], dict[str, str]]:
    """The shards the index names (each present) and its weight map, else ``model.safetensors``."""
    index = root / INDEX
    if index.is_file():
        weight_map = _json(index, "the shard index").get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map or not all(
                isinstance(v, str) for v in weight_map.values()):
            raise CheckpointError(index, "has no weight_map of tensor name -> shard file")
        names = sorted(set(weight_map.values()))
        for name in names:
            if Path(name).name != name:
                raise CheckpointError(index, f"names shard {name!r} outside the directory")
            if not (root / name).is_file():
                raise CheckpointError(root / name, f"missing: {INDEX} lists it as a shard")
        return [root / name for name in names], weight_map
    if (root / SINGLE).is_file():
        return [root / SINGLE], {}
    pickled = [name for name in PICKLED if (root / name).exists()]
    if pickled:
        raise CheckpointError(root / pickled[0], "PyTorch pickle weights are not read (unsafe to load, and loaded "
                                                 "whole); save the model with safetensors: "
                                                 "model.save_pretrained(dir, safe_serialization=True)")
    raise CheckpointError(root, f"no weights: neither {INDEX} nor {SINGLE}")


def _check_unique(shards: tuple[ShardHeader, ...]) -> None:
    seen: dict[str, str] = {}
    for shard in shards:
        for name in shard.tensors:
            if name in seen:
                raise CheckpointError(shard.path, f"tensor {name!r} is also in {seen[name]}")
            seen[name] = shard.path


def _check_index(index: Path, weight_map: dict[str, str], shards: tuple[ShardHeader, ...]) -> None:
    """Each tensor the index places in a shard is in that shard's header."""
    held = {Path(shard.path).name: shard for shard in shards}
    for name, file in weight_map.items():
        if name not in held[file].tensors:
            raise CheckpointError(held[file].path, f"lacks tensor {name!r}, which {index.name} places in it")
