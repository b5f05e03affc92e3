"""Layer-group engines (``max_engine_size``): a decoder cut at layer boundaries into the fewest engines whose
weights fit, each group's KV cache its own engine's state, the hidden state passed engine to engine on the device;
tokens equal to the one-engine file and to transformers. Bad sizes are typed errors before any work.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("executorch")

import pyrt  # noqa: E402
from pyrt.errors import ExportError  # noqa: E402
from pyrt.export import decoder_to_pte  # noqa: E402
from pyrt.export._graph.layer_groups import EngineSizeWarning, plan_groups  # noqa: E402
from pyrt.export.engine_size import (  # noqa: E402
    BUILD_FACTOR,
    IMPORT_BYTES,
    MARGIN,
    choose_engine_size,
    estimated_peak,
)
from pyrt.export.options import check_engine_size  # noqa: E402
from pyrt.pte_reader import PteFile  # noqa: E402
from pyrt.sim import simulated_gpus  # noqa: E402
from pyrt.testing import archs  # noqa: E402
from pyrt.tools.cli import main  # noqa: E402

LAYERS = 4
SEQ = 32
PROMPT = [5, 6, 7, 8, 9]
NEW = 10
PROMPTS = [[5, 6, 7, 8, 9], [11, 12], list(range(20, 40)), [3], [30, 31, 32]]


# -- the cut, on numbers ---------------------------------------------------------------------------------------


def test_items_pack_in_order_into_the_fewest_groups() -> None:
    layers = [(f"layer {k}", 10) for k in range(6)]
    assert plan_groups([*layers, ("head", 5)], 30) == [[0, 1, 2], [3, 4, 5], [6]]  # the head alone
    assert plan_groups([*layers, ("head", 5)], 35) == [[0, 1, 2], [3, 4, 5, 6]]  # the head with the last layers
    assert plan_groups([*layers, ("head", 5)], 1000) == [[0, 1, 2, 3, 4, 5, 6]]
    assert plan_groups([*layers, ("head", 5)], 10) == [[0], [1], [2], [3], [4], [5], [6]]


def test_a_layer_bigger_than_the_size_is_an_engine_of_its_own_with_a_warning_naming_it() -> None:
    with pytest.warns(EngineSizeWarning, match=r"layer 1 has 50 bytes of weights, more than max_engine_size=20"):
        assert plan_groups([("layer 0", 10), ("layer 1", 50), ("layer 2", 10), ("head", 5)], 20) == \
            [[0], [1], [2, 3]]


@pytest.mark.parametrize(("text", "size"), [("2GiB", 2 << 30), ("500MB", 500 * 10**6), ("1.5KiB", 1536),
                                            (4096, 4096), ("4096", 4096)])
def test_sizes_parse_once(text: Any, size: int) -> None:
    assert check_engine_size(text, "--max-engine-size") == size


@pytest.mark.parametrize("bad", [0, -1, "0", "-1", "abc", "50%", "auto", "", True, 1.5, [1]])
def test_bad_sizes_are_typed_errors_naming_the_value(bad: Any) -> None:
    with pytest.raises(ExportError, match=r"^max_engine_size=.* (is not a size|pass a size)"):
        check_engine_size(bad, "max_engine_size")


def test_without_a_size_one_engine_when_its_estimated_peak_fits_else_the_groups_that_fit() -> None:
    fits = choose_engine_size(None, weight_bytes=1 << 30, available=16 << 30)
    assert fits.limit is None and fits.reason.startswith("one engine: its estimated peak")
    big = choose_engine_size(None, weight_bytes=13 << 30, available=24 << 30)
    assert big.limit is not None and big.reason.startswith("layer groups of at most")
    assert estimated_peak(big.limit) <= MARGIN * (24 << 30) < estimated_peak(13 << 30)
    assert big.limit == int((int(MARGIN * (24 << 30)) - IMPORT_BYTES) / BUILD_FACTOR)
    asked = choose_engine_size(1 << 20, weight_bytes=13 << 30, available=24 << 30)
    assert asked.limit == 1 << 20 and "asked for" in asked.reason


def test_bad_sizes_are_refused_before_any_work(tmp_path: Path, capsys: Any) -> None:
    model = archs.causal_lm("llama")
    for bad in (0, -1, "abc"):
        with pytest.raises(ExportError, match="max_engine_size"):
            decoder_to_pte(model, tmp_path / "x.pte", max_seq_len=SEQ, builder="reference", max_engine_size=bad)
    with pytest.raises(ExportError, match="builder='portable' builds none"):
        decoder_to_pte(model, tmp_path / "x.pte", max_seq_len=SEQ, builder="portable", max_engine_size="1MiB")
    assert not list(tmp_path.iterdir())
    for bad in ("0", "-1", "abc"):
        status = main(["export", str(tmp_path), "-o", str(tmp_path / "m.pte"), f"--max-engine-size={bad}"])
        err = capsys.readouterr().err
        assert status == 2 and f"--max-engine-size={bad!r} is not a size" in err, err


# -- exports --------------------------------------------------------------------------------------------------


@functools.cache
def _model() -> Any:
    return archs.causal_lm("llama", layers=LAYERS)


@functools.cache
def _layer_bytes() -> int:
    layer = _model().model.layers[0]
    return sum(p.numel() * p.element_size() for p in layer.parameters())


@functools.cache
def _export(tmp: Path, groups_of: int | None, max_batch_size: int = 1) -> tuple[Path, Any]:
    """The test Llama exported (reference engines) with engines of about ``groups_of`` layers (None: one)."""
    path = tmp / f"llama-{groups_of}-b{max_batch_size}.pte"
    size = None if groups_of is None else groups_of * _layer_bytes() + _layer_bytes() // 2
    slots = {} if max_batch_size == 1 else {"max_batch_size": max_batch_size, "max_tokens_per_step": 16}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EngineSizeWarning)
        summary = decoder_to_pte(_model(), path, max_seq_len=SEQ, builder="reference", route="pyrt",
                                 progress=False, max_engine_size=size if size is not None else 1 << 40, **slots)
    return path, summary


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("groups")


@contextlib.contextmanager
def opened(path: Path) -> Iterator[Any]:
    with simulated_gpus(1), pyrt.Program(path) as prog:
        yield prog


def _plan(path: Path) -> tuple[list[list[int]], list[tuple[str, list[int]]], Any]:
    """(each delegate call's values, the et_copy / copy_ kernels (name, args) in order, the method's plan)."""
    plan = PteFile.open(path).program.method("forward")
    ops = [o.name for o in plan.operators]
    delegates, copies = [], []
    for chain in plan.chains:
        for ins in chain.instructions:
            kind = type(ins).__name__
            if kind == "DelegateCall":
                delegates.append(list(ins.args))
            elif kind == "KernelCall" and ops[ins.op_index] in ("et_copy::_h2d_copy", "et_copy::_d2h_copy",
                                                                 "aten::copy_"):
                copies.append((ops[ins.op_index], list(ins.args)))
    return delegates, copies, plan


def check_state_and_hidden_stay_on_device(path: Path, groups: list[str], layers: int = LAYERS,
                                         devices: int = 1) -> None:
    """No host round trip between the groups: every host -> device copy reads a method input, once per device the
    groups use (not once per group), and every device -> host copy writes a method output; each KV-cache buffer
    (a ``copy_`` write-back's destination) is read by one delegate only: its group's (``groups``: each delegate's
    layers)."""
    delegates, copies, plan = _plan(path)
    assert len(delegates) == len(groups)
    copied = Counter(args[0] for name, args in copies if name == "et_copy::_h2d_copy")
    assert copied and max(copied.values()) <= devices, copied
    for name, args in copies:
        if name == "et_copy::_h2d_copy":
            assert args[0] in plan.inputs, (name, args)
        elif name == "et_copy::_d2h_copy":
            assert args[-1] in plan.outputs, (name, args)
    state = {args[0] for name, args in copies if name == "aten::copy_"}
    assert len(state) == 2 * layers  # a key and a value cache per layer
    readers = {v: [i for i, d in enumerate(delegates) if v in d] for v in state}
    assert all(len(r) == 1 for r in readers.values()), readers
    assert {r[0] for r in readers.values()} == {i for i, g in enumerate(groups) if g != "head"}


@pytest.mark.export
@pytest.mark.parametrize("groups_of", [1, 2, 3])
def test_groups_hold_whole_layers_and_give_transformers_tokens(tmp: Path, groups_of: int) -> None:
    path, summary = _export(tmp, groups_of)
    layers = [e.layers for e in summary.engines]
    # layer 0 also carries the embedding (as big as the head); the head (final norm + LM head) joins the last
    # group, since it fits: each group holds at most groups_of + 1/2 layers' weights
    assert layers == {1: ["0", "1", "2", "3+head"], 2: ["0-1", "2-3+head"], 3: ["0-2", "3+head"]}[groups_of]
    assert "asked for" in summary.grouping
    assert all(e.weight_bytes > 0 for e in summary.engines)
    want = archs.greedy(_model(), PROMPT, NEW)
    with opened(path) as prog:
        assert pyrt.generate(prog, PROMPT, max_new_tokens=NEW, eos_ids=[]).tokens == want
    check_state_and_hidden_stay_on_device(path, [e.layers for e in summary.engines])


@pytest.mark.export
def test_one_engine_and_groups_give_the_same_tokens(tmp: Path) -> None:
    one, summary = _export(tmp, None)
    assert len(summary.engines) == 1 and summary.engines[0].layers == "0-3+head"
    grouped, _ = _export(tmp, 2)
    with opened(one) as prog:
        want = pyrt.generate(prog, PROMPT, max_new_tokens=NEW, eos_ids=[]).tokens
    with opened(grouped) as prog:
        assert pyrt.generate(prog, PROMPT, max_new_tokens=NEW, eos_ids=[]).tokens == want


@pytest.mark.export
def test_batched_slots_in_groups_equal_their_solo_transformers_runs(tmp: Path) -> None:
    path, summary = _export(tmp, 1, max_batch_size=4)
    assert len(summary.engines) == 4
    want = [archs.greedy(_model(), p, NEW) for p in PROMPTS]
    with opened(path) as prog:
        results = pyrt.generate(prog, PROMPTS, max_new_tokens=NEW, eos_ids=[])  # 5 prompts, 4 slots
        assert [r.tokens for r in results] == want
    check_state_and_hidden_stay_on_device(path, [e.layers for e in summary.engines])


@pytest.mark.export
def test_without_a_size_the_summary_says_why_one_engine(tmp_path: Path) -> None:
    summary = decoder_to_pte(archs.causal_lm("llama"), tmp_path / "m.pte", max_seq_len=SEQ, builder="reference",
                             progress=False)
    assert len(summary.engines) == 1 and summary.engines[0].layers == ""
    assert summary.grouping.startswith("one engine")
    assert f"engines: {summary.grouping}" in str(summary)


@pytest.mark.export
def test_inspect_shows_each_groups_layers_weight_bytes_and_device(tmp: Path, capsys: Any) -> None:
    path, summary = _export(tmp, 2)
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    for engine in summary.engines:
        assert engine.weight_bytes > 0
        line = f"layer group: layers {engine.layers}, {_kib(engine.weight_bytes)} of weights, on cuda:0"
        assert line in out, out
    assert out.count("layer group: layers") == len(summary.engines) == 2


def _kib(n: int) -> str:
    return f"{n / 1024:.1f} KiB"


@pytest.mark.export
@pytest.mark.parametrize(("route", "quantize"), [("upstream", None), ("pyrt", "int8")])
def test_both_routes_and_quantized_groups_give_transformers_tokens(tmp_path: Path, route: str,
                                                                   quantize: str | None) -> None:
    path = tmp_path / "m.pte"
    summary = decoder_to_pte(_model(), path, max_seq_len=SEQ, builder="reference", route=route, progress=False,
                             max_engine_size=2 * _layer_bytes() + _layer_bytes() // 2, quantize=quantize)
    assert summary.route == route and [e.layers for e in summary.engines] == ["0-1", "2-3+head"]
    if quantize:
        assert all(e.quantization is not None and e.quantization.layers for e in summary.engines)
    with opened(path) as prog:
        assert pyrt.generate(prog, PROMPT, max_new_tokens=NEW, eos_ids=[]).tokens == archs.greedy(_model(), PROMPT,
                                                                                                 NEW)


@pytest.mark.export
def test_tensorrt_rtx_builds_a_group_per_engine(tmp_path: Path) -> None:
    pytest.importorskip("tensorrt_rtx")
    summary = decoder_to_pte(_model(), tmp_path / "m.pte", max_seq_len=SEQ, builder="tensorrt_rtx", route="pyrt",
                             progress=False, max_engine_size=2 * _layer_bytes() + _layer_bytes() // 2)
    assert [(e.flavour, e.layers) for e in summary.engines] == [("tensorrt_rtx", "0-1"), ("tensorrt_rtx", "2-3+head")]
    specs = [d.compile_specs for d in PteFile.open(tmp_path / "m.pte").program.method("forward").delegates]
    assert [{c.key: c.text() for c in s}["layers"] for s in specs] == ["0-1", "2-3+head"]


@pytest.mark.export
def test_budgets_split_across_the_groups_and_tokens_stay(tmp_path: Path) -> None:
    path = tmp_path / "ws.pte"
    summary = decoder_to_pte(_model(), path, max_seq_len=SEQ, builder="reference", route="pyrt", progress=False,
                             max_engine_size=2 * _layer_bytes() + _layer_bytes() // 2, weight_streaming=True,
                             weight_streaming_budget=4096)
    assert [(e.layers, e.weight_streaming_budget) for e in summary.engines] == [("0-1", 4096), ("2-3+head", 4096)]
    want = archs.greedy(_model(), PROMPT, NEW)
    with simulated_gpus(1), pyrt.Program(path) as prog:
        assert [(w.budget, w.source) for w in prog.weight_streaming] == [(4096, "baked")] * 2
        total = sum(w.streamable_bytes for w in prog.weight_streaming) // 2
        prog.set_budget(total)  # one total for the program, split by the groups' streamable sizes
        budgets = [w.budget for w in prog.weight_streaming]
        assert sum(budgets) == total and all(0 < b < w.streamable_bytes
                                             for b, w in zip(budgets, prog.weight_streaming, strict=True))
        assert pyrt.generate(prog, PROMPT, max_new_tokens=NEW, eos_ids=[]).tokens == want
    with simulated_gpus(1), pyrt.Program(path, budget="fit") as prog:
        assert {w.source for w in prog.weight_streaming} == {"fit"} and len(prog.weight_streaming) == 2
        assert pyrt.generate(prog, PROMPT, max_new_tokens=NEW, eos_ids=[]).tokens == want


@pytest.mark.parametrize(("device", "message"), [
    (["cuda:0", "cuda:0"], "lists cuda:0 twice"), ("cuda:0,0", "lists cuda:0 twice"),
    ("cuda:0,cpu", r"device\[1\]='cpu' is not a CUDA device"), ([], "lists no device")])
def test_bad_device_lists_are_typed_errors_before_any_work(tmp_path: Path, device: Any, message: str) -> None:
    with pytest.raises(ExportError, match=message):
        decoder_to_pte(archs.causal_lm("llama"), tmp_path / "x.pte", max_seq_len=SEQ, builder="reference",
                       device=device)
    assert not list(tmp_path.iterdir())


def test_to_pte_spreads_groups_only_with_a_size(tmp_path: Path) -> None:
    from pyrt.export import to_pte

    with pytest.raises(ExportError, match="give max_engine_size"):
        to_pte(torch.nn.Linear(2, 2), tmp_path / "x.pte", (torch.randn(1, 2),), builder="reference",
               device="cuda:0,cuda:1")


@pytest.mark.export
def test_groups_spread_over_two_gpus_in_order_and_give_transformers_tokens(tmp_path: Path) -> None:
    path = tmp_path / "two.pte"
    summary = decoder_to_pte(_model(), path, max_seq_len=SEQ, builder="reference", route="pyrt", progress=False,
                             device="cuda:0,cuda:1")
    assert "1/2 share of the weights" in summary.grouping
    devices = [e.device for e in summary.engines]
    assert devices == sorted(devices) and set(devices) == {"cuda:0", "cuda:1"}  # in order, both used
    first = sum(e.weight_bytes for e in summary.engines if e.device == "cuda:0")
    second = sum(e.weight_bytes for e in summary.engines if e.device == "cuda:1")
    assert abs(first - second) <= max(e.weight_bytes for e in summary.engines)  # balanced to within a group
    specs = [{c.key: c.text() for c in d.compile_specs}
             for d in PteFile.open(path).program.method("forward").delegates]
    assert [s["target_device"] for s in specs] == devices
    # the hidden state crosses the GPUs device to device (the runtime's peer copy), not through the host
    check_state_and_hidden_stay_on_device(path, [e.layers for e in summary.engines], devices=2)
    with simulated_gpus(2), pyrt.Program(path) as prog:
        assert pyrt.generate(prog, PROMPT, max_new_tokens=NEW, eos_ids=[]).tokens == archs.greedy(_model(), PROMPT,
                                                                                                 NEW)


@pytest.mark.export
def test_pyrt_export_cuts_a_checkpoint_and_json_says_why(tmp_path: Path, capsys: Any) -> None:
    import json

    checkpoint = tmp_path / "llama"
    _model().save_pretrained(checkpoint, max_shard_size="60KB")
    out = tmp_path / "m.pte"
    size = 2 * _layer_bytes() + _layer_bytes() // 2
    status = main(["export", str(checkpoint), "-o", str(out), "--builder", "reference", "--max-seq-len", str(SEQ),
                   "--max-engine-size", str(size), "--no-progress", "--json"])
    assert status == 0
    data = json.loads(capsys.readouterr().out)
    assert data["grouping"] == f"max_engine_size={size / 1024:.1f} KiB asked for"
    assert [e["layers"] for e in data["engines"]] == ["0-1", "2-3+head"] and all(e["weight_bytes"] > 0
                                                                               for e in data["engines"])
    # each group's checkpoint pages (memory-mapped from the shards) left the process after its build
    assert all(e["released_bytes"] >= e["weight_bytes"] // 2 for e in data["engines"]), data["engines"]
    with opened(out) as prog:
        assert pyrt.generate(prog, PROMPT, max_new_tokens=NEW, eos_ids=[]).tokens == archs.greedy(_model(), PROMPT,
                                                                                                 NEW)


@pytest.mark.export
@pytest.mark.parametrize("draft", ["ngram", "itself"])
def test_speculative_decoding_on_groups_gives_transformers_tokens(tmp: Path, draft: str) -> None:
    path, _ = _export(tmp, 1, max_batch_size=4)
    echo = [5, 6, 7, 8, 9, 10, 11, 5, 6, 7, 8, 9]  # repeats itself: prompt lookup has something to guess from
    want = [archs.greedy(_model(), p, NEW) for p in [*PROMPTS[:3], echo]]
    with simulated_gpus(1), pyrt.Program(path) as prog, pyrt.Program(path) as other:
        guess: Any = other if draft == "itself" else draft
        results = pyrt.generate(prog, [*PROMPTS[:3], echo], max_new_tokens=NEW, eos_ids=[], draft=guess,
                                draft_tokens=4)
    assert [r.tokens for r in results] == want and sum(r.drafted for r in results) > 0
    if draft == "itself":
        assert all(r.accepted == r.drafted for r in results)
