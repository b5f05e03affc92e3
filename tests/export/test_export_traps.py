"""Regression tests for the five export traps (formats.md §4 and the issue).

Each test fails on the buggy behaviour it names:

1. lifted engine objects resolved by node name instead of the graph signature;
2. ``target_device`` resolved once per program instead of per partition;
3. engine bytes travelling as FX source literals / inline flatbuffer data;
4. fallback submodules wired by node name instead of argument position;
5. ``weight_streaming_budget`` accepting bools / out-of-range values or being given twice.
"""

from __future__ import annotations

import base64
import logging
import re
import warnings
from pathlib import Path

import pytest
import torch
import torch.fx as fx
from torch import nn

import pyrt
from pyrt.errors import BudgetError, ExportError
from pyrt.export import to_pte
from pyrt.export._engines.engine_graph import stage_engines
from pyrt.export._files.engine_store import EngineStore
from pyrt.export._graph.fx import inline_submodules, resolve_custom_obj
from pyrt.export.api import make_options
from pyrt.format.trt_blob import parse_blob
from tests.export.test_export_helpers import (
    affine_engine,
    delegates,
    run_pte,
    standin,
    torchtrt_program,
    torchtrt_split_module,
)


def _options(**kw: object) -> object:
    return make_options(**{"builder": "reference", "progress": False, **kw})


class Branchy(nn.Module):
    """Splits and concatenations: many multi-output ops, so FX numbers its getitems."""

    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(8, 8)
        self.l2 = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = torch.split(x, 4, dim=1)
        c, d = torch.split(torch.relu(self.l(x)), 4, dim=1)
        e = torch.sigmoid(a + c)
        f, g = torch.split(e * b, 2, dim=1)
        # (no reduction over a strided view at an engine boundary: engines hand back contiguous
        # tensors, and summing those runs in another order than eager's sum over the view)
        return self.l2(torch.cat([g, f], 1)) * 2 + d[:, :3], f - g


class TwoLinears(nn.Module):
    """Two engines separated by a forced fallback op."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.sigmoid(self.a(x) + 1)) * 3


# -- 1. lifted engine objects --------------------------------------------------------------------


def _placeholder(name: str) -> fx.Node:
    return fx.Graph().placeholder(name)


class _Sig:
    def __init__(self, mapping: dict[str, str]) -> None:
        self.inputs_to_lifted_custom_objs = mapping


def test_trap1_signature_mapping_wins_over_names() -> None:
    a, b = object(), object()
    constants = {"enga": a, "engb": b}
    # the placeholder named after engine b is, per the signature, engine a
    node = _placeholder("obj_engb")
    assert resolve_custom_obj(node, signature=_Sig({"obj_engb": "enga"}), constants=constants) is a


def test_trap1_incomplete_mapping_gives_none_not_a_name_match() -> None:
    constants = {"enga": object(), "engb": object()}
    node = _placeholder("obj_engb")  # its name matches "engb", but the mapping does not list it
    assert resolve_custom_obj(node, signature=_Sig({"obj_other": "enga"}), constants=constants) is None


def test_trap1_legacy_names_only_without_a_mapping() -> None:
    b = object()
    node = _placeholder("obj_engb")
    assert resolve_custom_obj(node, signature=_Sig({}), constants={"engb": b}) is b
    assert resolve_custom_obj(node, signature=None, constants={"engb": b}) is b


def test_trap1_fake_script_object_is_unwrapped() -> None:
    from torch._library.fake_class_registry import FakeScriptObject

    real = standin(affine_engine(1, 0))
    fake = FakeScriptObject(object(), "__torch__.torch.classes.tensorrt.Engine", real)
    got = resolve_custom_obj(_placeholder("obj_e"), signature=_Sig({"obj_e": "e"}), constants={"e": fake})
    assert not isinstance(got, FakeScriptObject)
    assert got.__getstate__() == real.__getstate__()


def test_trap1_end_to_end_engines_follow_the_signature(tmp_path: Path) -> None:
    """Placeholder names point at the *other* engine; only the signature tells the truth."""
    first, second = affine_engine(2.0, 1.0), affine_engine(10.0, 0.0)
    ep = torchtrt_program([(standin(first), "obj_engb", "enga"), (standin(second), "obj_enga", "engb")])
    assert dict(ep.graph_signature.inputs_to_lifted_custom_objs) == {"obj_engb": "enga", "obj_enga": "engb"}
    x = torch.ones(2, 3)
    with EngineStore(tmp_path) as store:
        gm, *_ = stage_engines(ep, None, _options(), store)
        assert torch.equal(gm(x)[0], torch.full((2, 3), 30.0))  # relu(2*1+1) * 10, not relu(10*1)*2+1
    to_pte(ep, tmp_path / "m.pte", builder="reference", progress=False)
    blobs = [parse_blob(d["blob"]) for d in delegates(tmp_path / "m.pte")]
    assert [bytes(b.engine) for b in blobs] == [first, second]
    assert torch.equal(run_pte(tmp_path / "m.pte", x)[0], torch.full((2, 3), 30.0))


def test_trap1_unresolvable_engine_is_an_error_not_a_guess(tmp_path: Path) -> None:
    ep = torchtrt_program([(standin(affine_engine(1, 0)), "obj_a", "a")])
    ep.constants.pop("a")
    ep.constants["obj_a"] = standin(affine_engine(5, 5))  # a name match the mapping does not sanction
    with pytest.raises(ExportError, match="obj_a"):
        to_pte(ep, tmp_path / "m.pte", builder="reference", progress=False)
    assert not (tmp_path / "m.pte").exists()


# -- 2. target_device per partition ------------------------------------------------------------


def _no_pyrt_warnings(caplog: pytest.LogCaptureFixture, caught: list[warnings.WarningMessage]) -> None:
    assert [r.getMessage() for r in caplog.records if r.name.startswith("pyrt") and r.levelno >= logging.WARNING] == []
    assert [str(w.message) for w in caught if "/pyrt/" in w.filename.replace("\\", "/")] == []


def test_trap2_built_engines_on_two_devices(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="pyrt"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = to_pte(TwoLinears(), tmp_path / "m.pte", (torch.randn(3, 4),), builder="reference",
                         torch_executed_ops=["aten.sigmoid.default"], device={0: "cuda:1", 1: "cuda:0"},
                         progress=False)
    assert [e.device for e in summary.engines] == ["cuda:1", "cuda:0"]
    found = delegates(tmp_path / "m.pte")
    assert [d["compile_specs"]["target_device"] for d in found] == [b"cuda:1", b"cuda:0"]
    assert [parse_blob(d["blob"]).device_id for d in found] == [1, 0]
    _no_pyrt_warnings(caplog, caught)


def test_trap2_converted_engines_keep_their_own_devices(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ep = torchtrt_program([(standin(affine_engine(1, 0), device=1), "obj_a", "a"),
                           (standin(affine_engine(2, 0), device=0), "obj_b", "b")])
    with caplog.at_level(logging.DEBUG, logger="pyrt"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        to_pte(ep, tmp_path / "m.pte", builder="reference", progress=False)
    found = delegates(tmp_path / "m.pte")
    assert [d["compile_specs"]["target_device"] for d in found] == [b"cuda:1", b"cuda:0"]
    assert [parse_blob(d["blob"]).device_id for d in found] == [1, 0]
    _no_pyrt_warnings(caplog, caught)


def test_trap2_device_callable_sees_each_partition(tmp_path: Path) -> None:
    seen = []

    def pick(info: object) -> str:
        seen.append((info.index, info.name))
        return f"cuda:{info.index + 2}"

    to_pte(TwoLinears(), tmp_path / "m.pte", (torch.randn(3, 4),), builder="reference",
           torch_executed_ops=["aten.sigmoid.default"], device=pick, progress=False)
    assert seen == [(0, "engine_0"), (1, "engine_1")]
    assert [d["compile_specs"]["target_device"] for d in delegates(tmp_path / "m.pte")] == [b"cuda:2", b"cuda:3"]


# -- 3. engines never in FX source ------------------------------------------------------------------


class Wide(nn.Module):
    """Two engines of ~64 KiB each (a 128x128 float32 weight apiece)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(128, 128)
        self.b = nn.Linear(128, 128)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.sigmoid(self.a(x)))


def test_trap3_engine_is_a_get_attr_tensor_not_source(tmp_path: Path) -> None:
    with EngineStore(tmp_path) as store:
        gm, args, engines, original, _ = stage_engines(Wide(), (torch.randn(3, 128),),
                                                    _options(torch_executed_ops=["aten.sigmoid.default"]), store)
        calls = [n for n in gm.graph.nodes if n.op == "call_function" and "execute_engine" in str(n.target)]
        assert len(calls) == 2
        from pyrt.export._write.lower import reexport

        program = reexport(gm, args, original, None)
        for code in (gm.code, program.graph_module.code):
            assert len(code) < 8192  # smaller than either engine: no engine can be spelled out in it
            assert "PYRTREF1" not in code
        for call in calls:
            engine = call.args[1]
            assert engine.op == "get_attr"
            tensor = getattr(gm, engine.target)
            assert tensor.dtype == torch.uint8 and tensor.dim() == 1 and tensor.numel() > 64 * 1024
            raw = bytes(tensor.numpy())
            assert raw.startswith(b"PYRTREF1")
            for spelled in (base64.b64encode(raw)[:64].decode(), raw[:32].hex(), repr(raw[:32])[2:-1]):
                assert spelled not in gm.code
            assert all(not isinstance(a, (bytes, bytearray)) for a in call.args)


def test_trap3_blobs_live_in_segments(tmp_path: Path) -> None:
    to_pte(TwoLinears(), tmp_path / "m.pte", (torch.randn(3, 4),), builder="reference",
           torch_executed_ops=["aten.sigmoid.default"], progress=False)
    info = pyrt.inspect(tmp_path / "m.pte")
    found = info["methods"][0]["delegates"]
    assert len(found) == 2 and {d["location"] for d in found} == {"segment"}
    from executorch.exir._serialize._flatbuffer_program import _flatbuffer_to_program
    from executorch.exir._serialize._program import _extract_delegate_payload, _get_extended_header

    data = (tmp_path / "m.pte").read_bytes()
    header = _get_extended_header(data)
    assert header is not None and _flatbuffer_to_program(data[: header.program_size]).backend_delegate_data == []
    assert _extract_delegate_payload(data, "TensorRTBackend", 1) == delegates(tmp_path / "m.pte")[1]["blob"]


# -- 4. graph breaks wired by position ----------------------------------------------------------------


def test_trap4_inlined_submodule_is_wired_by_position() -> None:
    gm = torchtrt_split_module()
    calls = [n for n in gm.graph.nodes if n.op == "call_module" and n.target == "_run_on_gpu_1"]
    (call,) = calls
    sub_names = [n.name for n in gm._run_on_gpu_1.graph.nodes if n.op == "placeholder"]
    arg_names = [a.name for a in call.args]
    assert sub_names == list(reversed(arg_names))  # same names, crossed: name-based wiring swaps them
    # replace the engine module by a plain function of x so the graph runs eagerly
    gm._run_on_acc_0 = _TwoOutputs()
    x = torch.randn(2, 3)
    expected = 10 * x - 0.5 * (2 * x + 1)
    assert inline_submodules(gm) == 1
    assert torch.equal(gm(x), expected)


class _TwoOutputs(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * 2 + 1, x * 10


def test_trap4_torchtrt_split_module_end_to_end(tmp_path: Path) -> None:
    gm = torchtrt_split_module()
    x = torch.randn(2, 3)
    with EngineStore(tmp_path) as store:
        flat, *_ = stage_engines(gm, (x,), _options(), store)
        assert torch.equal(flat(x), 10 * x - 0.5 * (2 * x + 1))
    summary = to_pte(gm, tmp_path / "m.pte", (x,), builder="reference", progress=False)
    assert summary.fallback_ops == {"aten::mul": 1, "aten::sub": 1}
    assert torch.equal(run_pte(tmp_path / "m.pte", x)[0], 10 * x - 0.5 * (2 * x + 1))
    assert [n.op for n in gm.graph.nodes].count("call_module") == 2  # the caller's module is untouched


def test_trap4_graph_breaks_match_eager_exactly(tmp_path: Path) -> None:
    model = Branchy().eval()
    x = torch.randn(5, 8)
    options = _options(torch_executed_ops=["aten.sigmoid.default", "aten.sub.Tensor"])
    with EngineStore(tmp_path) as store:
        gm, *_ = stage_engines(model, (x,), options, store)
        names = [n.name for n in gm.graph.nodes]
        assert any(re.fullmatch(r"getitem_\d+", n) for n in names)  # FX renamed getitems
        assert sum("execute_engine" in n for n in names) == 2  # two engines around the breaks
        with torch.no_grad():
            for xx in (x, torch.randn(5, 8) * 100):
                got, want = gm(xx), model(xx)
                assert [(g - w).abs().max().item() for g, w in zip(got, want, strict=True)] == [0.0, 0.0]
    to_pte(model, tmp_path / "m.pte", (x,), builder="reference", torch_executed_ops=options.forced_fallback,
           progress=False)
    xx = torch.randn(5, 8) * 100
    with torch.no_grad():
        want = model(xx)
    got = run_pte(tmp_path / "m.pte", xx)
    assert [(g - w).abs().max().item() for g, w in zip(got, want, strict=True)] == [0.0, 0.0]


# -- 5. weight_streaming_budget --------------------------------------------------------------------


@pytest.mark.parametrize("bad, message", [
    (True, "bool"), (False, "bool"), (-1, r"outside \[0, 2\*\*63\]"), ((1 << 63) + 1, "outside"),
    (1.5, "float"), ("1024", "str"),
])
def test_trap5_bad_budgets_are_refused_before_any_work(tmp_path: Path, bad: object, message: str) -> None:
    target = tmp_path / "m.pte"
    target.write_bytes(b"keep me")
    with pytest.raises(BudgetError, match=message):
        to_pte(TwoLinears(), target, (torch.randn(3, 4),), builder="reference", weight_streaming_budget=bad)
    assert target.read_bytes() == b"keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pte"]


@pytest.mark.parametrize("budget", [0, 123, 1 << 63])
def test_trap5_budget_baked_per_engine_as_ascii_decimal(tmp_path: Path, budget: int) -> None:
    to_pte(TwoLinears(), tmp_path / "m.pte", (torch.randn(3, 4),), builder="reference", weight_streaming=True,
           torch_executed_ops=["aten.sigmoid.default"], weight_streaming_budget=budget, progress=False)
    specs = [d["compile_specs"] for d in delegates(tmp_path / "m.pte")]
    assert [s["weight_streaming_budget"] for s in specs] == [str(budget).encode("ascii")] * 2


@pytest.mark.export
def test_trap5_budget_per_engine_mapping(tmp_path: Path) -> None:
    to_pte(TwoLinears(), tmp_path / "m.pte", (torch.randn(3, 4),), builder="reference", weight_streaming=True,
           torch_executed_ops=["aten.sigmoid.default"], weight_streaming_budget={"engine_1": 7}, progress=False)
    specs = [d["compile_specs"] for d in delegates(tmp_path / "m.pte")]
    assert "weight_streaming_budget" not in specs[0] and specs[1]["weight_streaming_budget"] == b"7"


def test_trap5_budget_given_twice_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="both as an argument and as a raw compile spec"):
        to_pte(TwoLinears(), tmp_path / "m.pte", (torch.randn(3, 4),), builder="reference",
               weight_streaming_budget=10, compile_specs={"weight_streaming_budget": b"10"})


def test_trap5_raw_compile_spec_budget_alone(tmp_path: Path) -> None:
    to_pte(TwoLinears(), tmp_path / "m.pte", (torch.randn(3, 4),), builder="reference",
           compile_specs={"weight_streaming_budget": "4096"}, progress=False)
    (spec,) = [d["compile_specs"] for d in delegates(tmp_path / "m.pte")]
    assert spec == {"target_device": b"cuda:0", "weight_streaming_budget": b"4096"}
    for raw in (b"-1", b"1e3", b" 12", b"", str(1 << 64).encode()):
        with pytest.raises(BudgetError):
            to_pte(TwoLinears(), tmp_path / "n.pte", (torch.randn(3, 4),), builder="reference",
                   compile_specs={"weight_streaming_budget": raw})
