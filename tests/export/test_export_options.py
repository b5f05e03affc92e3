"""One export, one :class:`ExportOptions`: made once at the outermost entry point, with one quantization plan.

``to_pte``, ``decoder_to_pte``, ``checkpoint_to_pte`` and ``pyrt export`` each check their options
once (the checkpoint path before the weights load, and not again in the decoder), and the
builder the engines come from is made with that plan; rules between fields hold however an
``ExportOptions`` is made.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("executorch")
pytest.importorskip("transformers")

from pyrt.errors import ExportError  # noqa: E402
from pyrt.export import options  # noqa: E402
from pyrt.export._engines import builders  # noqa: E402
from pyrt.testing import archs  # noqa: E402
from pyrt.tools.cli import main  # noqa: E402


@pytest.fixture()
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """Every ExportOptions made (its rules run once per value), every quantization plan, every builder."""
    seen: dict[str, list[Any]] = {"options": [], "plans": [], "builders": []}
    together, plan, make = options.check_together, options.check_quantize, builders.make_builder

    def check_together(value: Any) -> None:
        seen["options"].append(value)
        together(value)

    def check_quantize(*args: Any) -> Any:
        seen["plans"].append(plan(*args))
        return seen["plans"][-1]

    def make_builder(*args: Any) -> Any:
        seen["builders"].append(make(*args))
        return seen["builders"][-1]

    monkeypatch.setattr(options, "check_together", check_together)
    monkeypatch.setattr(options, "check_quantize", check_quantize)
    monkeypatch.setattr("pyrt.export._engines.engine_graph.make_builder", make_builder)
    return seen


def _one_of_each(seen: dict[str, list[Any]], scheme: str) -> None:
    (made,), (plan,), (builder,) = seen["options"], seen["plans"], seen["builders"]
    assert plan is not None and plan.name == scheme
    assert made.quantize is plan and builder.quantize is plan  # the one plan, not an equal copy


@pytest.mark.export
def test_to_pte_makes_one_options_value(tmp_path: Path, counted: dict[str, list[Any]]) -> None:
    from pyrt.export import to_pte

    model = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.ReLU()).eval()
    to_pte(model, tmp_path / "m.pte", (torch.randn(2, 32),), builder="reference", quantize="int8", group_size=16,
           progress=False)
    _one_of_each(counted, "int8")


@pytest.mark.export
def test_decoder_to_pte_makes_one_options_value(tmp_path: Path, counted: dict[str, list[Any]]) -> None:
    from pyrt.export import decoder_to_pte

    decoder_to_pte(archs.causal_lm("llama"), tmp_path / "m.pte", max_seq_len=16, builder="reference",
                   quantize="int4", group_size=16, progress=False)
    _one_of_each(counted, "int4")


@pytest.mark.export
def test_pyrt_export_of_a_checkpoint_makes_one_options_value(tmp_path: Path, counted: dict[str, list[Any]]) -> None:
    archs.causal_lm("llama").save_pretrained(tmp_path / "ckpt", max_shard_size="40KB")
    status = main(["export", str(tmp_path / "ckpt"), "-o", str(tmp_path / "m.pte"), "--builder", "reference",
                   "--max-seq-len", "16", "--quantize", "int8", "--group-size", "16", "--no-tokenizer",
                   "--no-progress"])
    assert status == 0
    _one_of_each(counted, "int8")


class _Stop(Exception):
    """Raised where the export's work would start."""


def test_a_portable_decoder_makes_one_plan_and_no_engine_options(tmp_path: Path, counted: dict[str, list[Any]],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from pyrt.export import decoder, decoder_options

    written: list[Any] = []

    def write_decoder(model: Any, path: Any, chosen: Any) -> Any:
        written.append(chosen)
        raise _Stop

    monkeypatch.setattr(decoder_options, "check_quantize", options.check_quantize)  # the counting one
    monkeypatch.setattr(decoder, "write_decoder", write_decoder)
    with pytest.raises(_Stop):
        decoder.decoder_to_pte(archs.causal_lm("llama"), tmp_path / "m.pte", max_seq_len=16, builder="portable",
                               quantize="int8", progress=False)
    (plan,), (chosen,) = counted["plans"], written
    assert counted["options"] == [] and chosen.export is None and chosen.quantize is plan and plan.name == "int8"


def test_rules_between_fields_hold_however_options_are_made() -> None:
    made = options.make_options(builder="reference", compile_specs={"weight_streaming_budget": "4096"},
                                progress=False)
    budget = options.PerPartition(1 << 20, "weight_streaming_budget", options.check_optional_budget, missing=None)
    with pytest.raises(ExportError, match="given both as an argument and as a raw compile spec"):
        dataclasses.replace(made, budget=budget)
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.min_block_size = 2  # type: ignore[misc]


def test_builders_are_made_with_their_final_settings() -> None:
    plan = options.check_quantize("int4", 32)
    builder = builders.make_builder("reference", plan, [{}])
    assert (builder.quantize, builder.symbol_profiles) == (plan, [{}])
    with pytest.raises(dataclasses.FrozenInstanceError):
        builder.quantize = None  # type: ignore[misc]
