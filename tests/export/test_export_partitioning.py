"""Partitioning: assertion ops, dynamic shapes, what TensorRT takes, torch_executed_ops, fallback reasons.

Small hand-written models (no transformers); tests/export/test_export_models.py runs the
same paths on real architectures. Each test names the behaviour it guards against.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.fx as fx
from torch import nn
from torch.export import Dim

from pyrt.errors import ExportError
from pyrt.export import to_pte
from pyrt.export._engines.builders import ReferenceBuilder, make_builder
from pyrt.export._engines.engine_graph import _Planner
from pyrt.export._files.engine_store import EngineStore
from pyrt.export._graph.partition import check_outputs_live, extract
from pyrt.export._graph.pass_order import prepare_graph
from pyrt.export._graph.passes import check_forced_matched, strip_assertions
from pyrt.export.api import make_options
from tests.export.test_export_helpers import run_pte


def _options(**kw: object) -> object:
    return make_options(**{"builder": "reference", "progress": False, **kw})


def _close(got: object, want: object) -> float:
    """Largest absolute difference between two (nested) sequences of tensors or arrays."""
    leaves = torch.utils._pytree.tree_leaves
    pairs = zip(leaves(got), leaves(want), strict=True)
    return max(float((torch.as_tensor(g) - torch.as_tensor(w)).abs().max()) for g, w in pairs)


def _staged(model: nn.Module, args: tuple, builder: str = "reference", dynamic_shapes: object = None,
            forced: tuple[str, ...] = ()) -> tuple[fx.GraphModule, dict, object]:
    """The unlifted, prepared graph of ``model`` and its forced nodes, as stage 1 sees them."""
    program = torch.export.export(model.eval(), args, dynamic_shapes=dynamic_shapes, strict=False)
    options = _options(builder=builder, torch_executed_ops=forced)
    _, gm, nodes = prepare_graph(program, options.forced_fallback, options.progress)
    return gm, nodes, options


def _plan(model: nn.Module, args: tuple, builder: str = "reference", tmp: Path | None = None,
          **kw: object) -> list[list[str]]:
    """Node names of each partition the planner proposes (nothing is built)."""
    gm, forced, options = _staged(model, args, builder, **kw)
    with EngineStore(tmp or Path.cwd()) as store:
        parts = _Planner(gm, make_builder(builder), options, store, forced).plan()
        assert store.records == {}
    return [[n.name for n in p.nodes] for p in parts]


class ToDtype(nn.Module):
    """``.to()`` leaves aten._assert_tensor_metadata nodes after run_decompositions."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = (x > 0).to(torch.float32)
        return (x * mask).to(x.dtype) + 1


# -- 1. assertion nodes ----------------------------------------------------------------------------


def test_to_dtype_assertions_stay_out_of_the_way(tmp_path: Path) -> None:
    """They used to make every value they read an engine output that ExecuTorch then dropped."""
    model, x = ToDtype(), torch.randn(3, 4)
    summary = to_pte(model, tmp_path / "m.pte", (x,), builder="reference", progress=False)
    assert len(summary.engines) == 1 and len(summary.engines[0].outputs) == 1
    assert summary.fallback_ops == {}
    assert _close(run_pte(tmp_path / "m.pte", x, gpus=1), model(x)) == 0.0


def test_an_output_only_an_assertion_reads_is_refused_before_any_build(tmp_path: Path) -> None:
    gm, forced, options = _staged(ToDtype(), (torch.randn(3, 4),))
    cast = next(n for n in gm.graph.nodes if n.target is torch.ops.aten._to_copy.default)
    with gm.graph.inserting_after(cast):  # what run_decompositions leaves, put back by hand
        gm.graph.call_function(torch.ops.aten._assert_tensor_metadata.default, (cast,), {"dtype": torch.float32})
    compute = [n for n in gm.graph.nodes if n.op == "call_function" and isinstance(n.meta.get("val"), torch.Tensor)]
    parts = [extract(gm, compute[:2]), extract(gm, compute[2:])]  # [gt, _to_copy] [mul, add]
    check_outputs_live(gm, parts)  # _to_copy feeds mul: fine
    cut = [extract(gm, compute[:1]), extract(gm, compute[1:])]
    assert [o.name for o in cut[1].outputs] == ["_to_copy", "add"]  # the assertion makes _to_copy an output
    with pytest.raises(ExportError, match=r"partition 1: '_to_copy' \(aten._to_copy.default\) is used only by "
                                          r"'_assert_tensor_metadata.*torch_executed_ops"):
        check_outputs_live(gm, cut)
    assert [name.startswith("_assert_tensor_metadata") for name in strip_assertions(gm)] == [True]
    check_outputs_live(gm, [extract(gm, compute[:1]), extract(gm, compute[1:])])


def test_planning_problems_come_before_any_build(tmp_path: Path) -> None:
    gm, forced, options = _staged(ToDtype(), (torch.randn(3, 4),))
    cast = next(n for n in gm.graph.nodes if n.target is torch.ops.aten._to_copy.default)
    with gm.graph.inserting_after(cast):
        gm.graph.call_function(torch.ops.aten._assert_tensor_metadata.default, (cast,), {"dtype": torch.float32})
    with EngineStore(tmp_path) as store:
        planner = _Planner(gm, ReferenceBuilder(), options, store, forced)
        with pytest.raises(ExportError, match="'_to_copy'.*used only by '_assert_tensor_metadata"):
            planner.run()
        assert store.records == {}  # nothing was built


# -- 2. dynamic shapes ------------------------------------------------------------------------------


class Heads(nn.Module):
    """view/expand/reshape with sizes read from the input (SymInts under dynamic shapes)."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.out = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, 4, 4).permute(2, 0, 3, 1, 4)
        bias = torch.arange(s, dtype=x.dtype).view(1, 1, 1, s).expand(b, 4, s, s) * 0.01
        att = torch.softmax(q @ k.transpose(-1, -2) / 2.0 + bias, -1)
        return self.out((att @ v).transpose(1, 2).contiguous().view(b, s, 16))


@pytest.mark.export
def test_shape_arithmetic_goes_into_the_engine(tmp_path: Path) -> None:
    """sym_size and SymInt view/expand sizes used to stay outside, splitting the model per op."""
    torch.manual_seed(0)
    model, x = Heads().eval(), torch.randn(2, 5, 16)
    shapes = ({0: Dim("b", min=1, max=4), 1: Dim("s", min=2, max=12)},)
    static = to_pte(model, tmp_path / "s.pte", (x,), builder="reference", progress=False)
    dynamic = to_pte(model, tmp_path / "d.pte", (x,), builder="reference", dynamic_shapes=shapes, progress=False)
    assert len(static.engines) == len(dynamic.engines) == 1
    assert dynamic.fallback_ops == {} and dynamic.engines[0].inputs[0].shape == (-1, -1, 16)
    for size in ((2, 5), (1, 2), (4, 12), (3, 7)):
        xs = torch.randn(*size, 16)
        with torch.no_grad():
            assert _close(run_pte(tmp_path / "d.pte", xs, gpus=1), model(xs)) < 1e-5


def test_sizes_are_recomputed_from_the_engine_inputs() -> None:
    gm, forced, options = _staged(Heads(), (torch.randn(2, 5, 16),),
                                  dynamic_shapes=({0: Dim("b", min=1, max=4), 1: Dim("s", min=2, max=12)},))
    sym = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is torch.ops.aten.sym_size.int]
    assert sym and all(n.args[0].op == "placeholder" for n in sym)  # canonical: read from the inputs
    compute = [n for n in gm.graph.nodes if n.op == "call_function" and not isinstance(n.meta["val"], torch.SymInt)]
    part = extract(gm, compute)
    inner = [n for n in part.module.graph.nodes if n.target is torch.ops.aten.sym_size.int]
    assert inner and {n.args[0].name for n in inner} <= {"input_0"}
    xs = torch.randn(3, 7, 16)
    with torch.no_grad():
        assert _close(part.module(xs)[-1], gm(xs)) < 1e-6


# -- 3. support from what TensorRT takes, and why ops fall back --------------------------------------


def test_lstm_is_one_engine(tmp_path: Path) -> None:
    """squeeze.dims and friends used to be refused (not in torch.onnx's registry as such): 4 engines."""
    torch.manual_seed(0)
    model, x = nn.LSTM(8, 16, num_layers=2, batch_first=True).eval(), torch.randn(2, 5, 8)
    summary = to_pte(model, tmp_path / "l.pte", (x,), builder="reference", progress=False)
    assert len(summary.engines) == 1 and summary.fallback_ops == {}
    with torch.no_grad():
        out, (h, c) = model(x)
    assert _close(run_pte(tmp_path / "l.pte", x, gpus=1), (out, h, c)) < 1e-5


class Mixed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.sigmoid(self.l(x))
        values, _ = torch.kthvalue(y, 2, dim=-1)  # torch.onnx has no translation
        return torch.relu(y) + 1, values


def test_summary_gives_each_fallback_op_its_reason(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO", logger="pyrt.export"):
        summary = to_pte(Mixed(), tmp_path / "m.pte", (torch.randn(3, 6),), builder="reference",
                         torch_executed_ops=["aten.sigmoid.default"], progress=False)
    assert summary.fallback_reasons == {
        "aten::sigmoid": "forced by torch_executed_ops (aten::sigmoid.default)",
        "aten::kthvalue": "no converter (reference cannot take aten::kthvalue.default)",
    }
    text = str(summary)
    assert "aten::kthvalue: no converter" in text and "aten::sigmoid: forced by torch_executed_ops" in text
    assert any(r.getMessage().startswith("fallback aten::kthvalue: no converter") for r in caplog.records)


# -- 4. torch_executed_ops through decompositions -----------------------------------------------------


class PoolSoftmax(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.max_pool2d(torch.relu(self.c(x)), 2)
        return torch.softmax(y.flatten(1), -1).squeeze((0, 1)) * 2


@pytest.mark.parametrize("name, op", [
    ("aten.max_pool2d.default", "aten::max_pool2d"), ("aten.softmax.int", "aten::softmax"),
    ("aten.squeeze.dims", "aten::squeeze"),  # decomposed (into squeeze.dim) before partitioning
])
def test_executed_ops_that_decompose_are_matched(name: str, op: str, tmp_path: Path) -> None:
    """Such names used to match nothing after decomposition and were silently ignored."""
    torch.manual_seed(0)
    model, x = PoolSoftmax().eval(), torch.randn(1, 3, 8, 8)
    summary = to_pte(model, tmp_path / "p.pte", (x,), builder="reference", torch_executed_ops=[name],
                     progress=False)
    assert summary.fallback_reasons == {op: f"forced by torch_executed_ops ({name.replace('.', '::', 1)})"}
    assert len(summary.engines) == 2
    with torch.no_grad():
        assert _close(run_pte(tmp_path / "p.pte", x, gpus=1), model(x)) < 1e-6


def test_an_executed_op_whose_trace_is_lost_is_refused() -> None:
    program = torch.export.export(PoolSoftmax().eval(), (torch.randn(1, 3, 8, 8),))
    with pytest.raises(ExportError, match=r"'aten::softmax.int'.*decomposes into aten::_softmax.default"):
        check_forced_matched({"aten::softmax.int"}, set(), program.graph)
    assert check_forced_matched({"aten::cumsum.default"}, set(), program.graph) == ["aten::cumsum.default"]


def test_an_executed_op_the_model_lacks_is_reported(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="pyrt.export"):
        to_pte(ToDtype(), tmp_path / "m.pte", (torch.randn(2, 3),), builder="reference",
               torch_executed_ops=["aten.cumsum.default"], progress=False)
    assert any("'aten::cumsum.default', which matches no operator" in r.getMessage() for r in caplog.records)


# -- 5. both builders partition alike ---------------------------------------------------------------


@pytest.mark.parametrize("case, count", [("heads_dynamic", 1), ("lstm", 1), ("mixed_forced", 2), ("pool", 2)])
def test_reference_and_tensorrt_partition_alike(case: str, count: int, tmp_path: Path) -> None:
    """The LSTM used to be 4 TensorRT partitions (squeeze.dims refused) but 1 reference one."""
    pytest.importorskip("tensorrt_rtx")
    model, args, kw = {
        "heads_dynamic": (Heads(), (torch.randn(2, 5, 16),),
                          {"dynamic_shapes": ({0: Dim("b", min=1, max=4), 1: Dim("s", min=2, max=12)},)}),
        "lstm": (nn.LSTM(8, 16, batch_first=True), (torch.randn(2, 5, 8),), {}),
        "mixed_forced": (Mixed(), (torch.randn(3, 6),), {"forced": ("aten.sigmoid.default",)}),
        "pool": (PoolSoftmax(), (torch.randn(1, 3, 8, 8),), {"forced": ("aten.softmax.int",)}),
    }[case]
    reference = _plan(model, args, "reference", tmp_path, **kw)
    real = _plan(model, args, "tensorrt_rtx", tmp_path, **kw)
    assert reference == real and len(real) == count


def test_reference_builder_takes_what_tensorrt_takes() -> None:
    """The reference builder refuses only what torch.onnx (the TensorRT route) cannot translate."""
    gm, _, _ = _staged(Mixed(), (torch.randn(3, 6),))
    ref = ReferenceBuilder()
    verdict = {str(n.target): ref.supports(n) for n in gm.graph.nodes
               if n.op == "call_function" and "getitem" not in n.name}
    assert verdict.pop("aten.kthvalue.default") is False
    assert all(verdict.values()), verdict


# -- the ONNX a partition becomes ---------------------------------------------------------------------


def test_direct_onnx_translation_computes_the_partition(tmp_path: Path) -> None:
    """pyrt translates the partition graph it has (no re-trace); the ONNX must compute the same values."""
    reference = pytest.importorskip("onnx.reference")
    from pyrt.export._engines.to_onnx import export_partition

    torch.manual_seed(0)
    gm, _, _ = _staged(Heads(), (torch.randn(2, 5, 16),),
                       dynamic_shapes=({0: Dim("b", min=1, max=4), 1: Dim("s", min=2, max=12)},))
    compute = [n for n in gm.graph.nodes if n.op == "call_function" and not isinstance(n.meta["val"], torch.SymInt)]
    part = extract(gm, compute)
    path, _ = export_partition(part.module, tmp_path / "p.onnx", ["x"], ["y"])
    session = reference.ReferenceEvaluator(str(path))
    for size in ((2, 5), (3, 9)):
        xs = torch.randn(*size, 16)
        (got,) = session.run(None, {"x": xs.numpy()})
        with torch.no_grad():
            assert _close(got, part.module(xs)) < 1e-5


# -- builds that fail --------------------------------------------------------------------------------


class WithDet(nn.Module):
    """TensorRT's ONNX parser rejects Det; everything else builds."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.a(x)
        return self.b(y) * 2, torch.linalg.det(y.view(-1, 2, 2)) + 1


def test_a_failed_build_moves_out_only_the_ops_its_error_names(tmp_path: Path) -> None:
    gm, forced, options = _staged(WithDet(), (torch.randn(3, 4),))
    with EngineStore(tmp_path) as store:
        planner = _Planner(gm, ReferenceBuilder(), options, store, forced)
        (part,) = planner.plan()
        error = ("tensorrt_rtx OnnxParser rejected model.onnx: node 2 'n0' (op Det): UNSUPPORTED_NODE; "
                 "TensorRT said: While parsing node number 2 [Det -> \"linalg_det\"]")
        assert [n.name for n in planner._culprits(part, error)] == ["linalg_det"]
        assert planner._culprits(part, "something went wrong") == part.nodes  # every op builds alone
        assert store.records.keys() >= {"probe0"}


@pytest.mark.export
@pytest.mark.slow
def test_tensorrt_rtx_build_failure_is_a_reason_not_an_error(tmp_path: Path) -> None:
    pytest.importorskip("tensorrt_rtx")
    summary = to_pte(WithDet(), tmp_path / "d.pte", (torch.randn(3, 4),), builder="tensorrt_rtx", progress=False)
    assert list(summary.fallback_reasons) == ["aten::linalg_det"]
    assert summary.fallback_reasons["aten::linalg_det"].startswith("build failed: tensorrt_rtx OnnxParser rejected")
    assert "(op Det)" in summary.fallback_reasons["aten::linalg_det"] and len(summary.engines) == 2
