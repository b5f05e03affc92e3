"""A Hugging Face checkpoint directory checked before any long work (pyrt.export._checkpoint).

Each bad input gets a CheckpointError naming the file at fault; the shard-header checks are
compared with safetensors' own reader, which refuses the same corrupted files. No export runs
here: the checks must all happen before one would start.
"""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
safetensors = pytest.importorskip("safetensors")

from pyrt.errors import CheckpointError  # noqa: E402
from pyrt.export._checkpoint.directory import INDEX, open_directory  # noqa: E402
from pyrt.export._checkpoint.model import check_model, load_model, mapped_bytes  # noqa: E402
from pyrt.export._checkpoint.safetensors_header import read_header  # noqa: E402
from pyrt.testing import archs  # noqa: E402


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``llm`` Llama saved in several shards (as ``save_pretrained(max_shard_size=...)`` writes them)."""
    path = tmp_path_factory.mktemp("ckpt") / "llama"
    archs.causal_lm("llama").save_pretrained(path, max_shard_size="40KB")
    assert len(list(path.glob("*.safetensors"))) >= 3
    return path


@pytest.fixture()
def copy(checkpoint: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(checkpoint, tmp_path / "copy"))


def _shards(path: Path) -> list[Path]:
    return sorted(path.glob("*.safetensors"))


def test_headers_agree_with_safetensors_own_reader(checkpoint: Path) -> None:
    files = open_directory(checkpoint)
    assert len(files.shards) == len(_shards(checkpoint)) and files.stored_dtype() == "float32"
    for shard in files.shards:
        with safetensors.safe_open(shard.path, framework="pt") as f:
            assert set(f.keys()) == set(shard.tensors)
            for name, entry in shard.tensors.items():
                assert tuple(f.get_slice(name).get_shape()) == entry.shape
    assert files.weight_bytes == sum(p.nbytes for p in archs.causal_lm("llama").state_dict().values())


def _rewrite(path: Path, edit: Callable[[dict, bytes], tuple[dict, bytes]]) -> None:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header, data = edit(json.loads(raw[8:8 + n]), raw[8 + n:])
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + data)


def _first(header: dict) -> str:
    return min((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])


CORRUPTIONS: dict[str, tuple[Callable[[Path], None], str]] = {
    "cut in the data": (lambda p: p.write_bytes(p.read_bytes()[:-100]), "truncated: tensor"),
    "cut in the header": (lambda p: p.write_bytes(p.read_bytes()[:40]), "exceeds the file"),
    "cut in the length": (lambda p: p.write_bytes(p.read_bytes()[:5]), "too short"),
    "not JSON": (lambda p: p.write_bytes(struct.pack("<Q", 4) + b"{{{{"), "not JSON"),
    "a JSON list": (lambda p: p.write_bytes(struct.pack("<Q", 2) + b"[]"), "not an object"),
    "unknown dtype": (lambda p: _rewrite(p, lambda h, d: ({**h, _first(h): {**h[_first(h)], "dtype": "Q7"}}, d)),
                      "dtype 'Q7'"),
    "shape disagrees with its bytes": (
        lambda p: _rewrite(p, lambda h, d: ({**h, _first(h): {**h[_first(h)], "shape": [1]}}, d)), "needs 4 bytes"),
    "trailing bytes": (lambda p: p.write_bytes(p.read_bytes() + bytes(8)), "belong to no tensor"),
}


@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_a_corrupted_shard_is_refused_naming_it_as_safetensors_refuses_it(copy: Path, case: str) -> None:
    corrupt, message = CORRUPTIONS[case]
    shard = _shards(copy)[1]
    corrupt(shard)
    with pytest.raises(CheckpointError, match=message) as info:
        read_header(shard)
    assert info.value.path == str(shard) and str(shard) in str(info.value)
    with pytest.raises(Exception):  # noqa: B017 (safetensors raises its own error types)
        with safetensors.safe_open(str(shard), framework="pt") as f:
            for name in f.keys():
                f.get_tensor(name)
    with pytest.raises(CheckpointError, match=message):
        open_directory(copy)


def _drop_config(path: Path) -> Path:
    (path / "config.json").unlink()
    return path / "config.json"


def _break_config(path: Path) -> Path:
    (path / "config.json").write_text("{not json")
    return path / "config.json"


def _no_weights(path: Path) -> Path:
    for p in [*_shards(path), path / INDEX]:
        p.unlink()
    return path


def _pickled(path: Path) -> Path:
    _no_weights(path)
    torch.save({}, path / "pytorch_model.bin")
    return path / "pytorch_model.bin"


def _missing_shard(path: Path) -> Path:
    shard = _shards(path)[0]
    shard.unlink()
    return shard


def _misplaced(path: Path) -> Path:
    index = json.loads((path / INDEX).read_text())
    name, shard = next(iter(index["weight_map"].items()))
    other = next(s.name for s in _shards(path) if s.name != shard)
    index["weight_map"][name] = other
    (path / INDEX).write_text(json.dumps(index))
    return path / other


def _twice(path: Path) -> Path:
    first, second = _shards(path)[:2]
    with safetensors.safe_open(str(first), framework="pt") as f:
        name = next(iter(f.keys()))
    _rewrite(second, lambda h, d: ({**h, name: {"dtype": "U8", "shape": [1], "data_offsets": [len(d), len(d) + 1]}},
                                   d + b"\0"))
    return second


@pytest.mark.parametrize(("damage", "message"), [
    (_drop_config, "missing: the model's configuration"),
    (_break_config, "not valid JSON"),
    (_no_weights, "no weights"),
    (_pickled, "pickle weights are not read"),
    (_missing_shard, "missing: model.safetensors.index.json lists it"),
    (_misplaced, "which model.safetensors.index.json places in it"),
    (_twice, "is also in"),
])
def test_a_directory_flaw_names_its_file(copy: Path, damage: Callable[[Path], Path], message: str) -> None:
    at_fault = damage(copy)
    with pytest.raises(CheckpointError, match=message) as info:
        open_directory(copy)
    assert info.value.path == str(at_fault)


def _config(path: Path, **changes: object) -> None:
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(("changes", "message"), [
    ({"model_type": "no_such_model"}, "transformers cannot read it"),
    ({"model_type": "t5", "is_encoder_decoder": True}, "encoder-decoder"),
    ({"architectures": ["LlamaForSequenceClassification"]}, "name no causal LM"),
    ({"auto_map": {"AutoModelForCausalLM": "modeling.Mine"}}, "own Python code"),
])
def test_an_unsupported_architecture_names_the_config(copy: Path, changes: dict, message: str) -> None:
    _config(copy, **changes)
    with pytest.raises(CheckpointError, match=message) as info:
        check_model(open_directory(copy))
    assert info.value.path == str(copy / "config.json")


def test_a_tensor_that_disagrees_with_the_config_names_its_shard(copy: Path) -> None:
    _config(copy, vocab_size=archs.VOCAB + 28)
    files = open_directory(copy)
    embed, shard = files.tensors["model.embed_tokens.weight"]
    with pytest.raises(CheckpointError, match=r"tensor 'model.embed_tokens.weight' is \[100, 32\], but config.json "
                                              r"makes it \[128, 32\]") as info:
        check_model(files)
    assert info.value.path == shard


def test_a_tensor_no_shard_holds_is_refused_naming_the_index(copy: Path) -> None:
    index = json.loads((copy / INDEX).read_text())
    name = "model.layers.1.mlp.down_proj.weight"
    shard = copy / index["weight_map"].pop(name)
    (copy / INDEX).write_text(json.dumps(index))
    _rewrite(shard, lambda h, d: _without(h, d, name))
    files = open_directory(copy)
    check_model(files)  # every tensor present has its shape: only loading finds the gap
    with pytest.raises(CheckpointError, match=f"lacks 1 tensor.*{name}") as info:
        load_model(files, torch.float32)
    assert info.value.path == str(copy / INDEX)


def _without(header: dict, data: bytes, name: str) -> tuple[dict, bytes]:
    begin, end = header.pop(name)["data_offsets"]
    for entry in header.values():
        if isinstance(entry, dict) and "data_offsets" in entry and entry["data_offsets"][0] >= end:
            entry["data_offsets"] = [o - (end - begin) for o in entry["data_offsets"]]
    return header, data[:begin] + data[end:]


def test_the_weights_load_as_the_shards_mapped_pages(checkpoint: Path) -> None:
    """Kept in the stored dtype, every parameter is a view of a shard's memory map: no copy in memory."""
    files = open_directory(checkpoint)
    model = load_model(files, torch.float32)
    mapped = mapped_bytes(model, files)
    if mapped is None:
        pytest.skip("no /proc/self/maps here")
    inside, total = mapped
    assert inside == total > 0
    converted = load_model(files, torch.float16)  # another dtype converts: the copy the docs warn of
    assert mapped_bytes(converted, files) == (0, total // 2)
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, archs.causal_lm("llama")(ids).logits)
