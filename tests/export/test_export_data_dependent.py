"""Data-dependent output shapes (``nonzero``, ``masked_select``, boolean-mask indexing,
one-argument ``where``) at export: bounded planning, typed errors, hints for unbacked sizes.

Issue 24's two reports are guarded here: an unbacked size once reached ``int(None)`` in the
TensorRT profile (an untyped TypeError), and the planner once looped for minutes blocking a
``getitem`` that the partitioner re-admits through its producer.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import sympy
import torch
from torch import nn
from torch.fx.experimental.symbolic_shapes import ShapeEnv, _constrain_range_for_size

from pyrt.errors import ExportError
from pyrt.export import to_pte
from pyrt.export._engines.builders import ReferenceBuilder
from pyrt.export._engines.dims import check_outputs, shape_ranges, size_hint
from pyrt.export._engines.dims import min_opt_max as _profile
from pyrt.export._engines.engine_graph import _Planner
from pyrt.export._files.engine_store import EngineStore
from pyrt.testing import datadep_models as dm
from tests.export.test_export_partitioning import _staged


class MaskedSelectMLP(nn.Module):
    """masked_select between two Linear layers (issue 24's first model)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(8, 8), nn.Linear(1, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        return self.b(torch.masked_select(y, y > 0).unsqueeze(1))


class WhereIndexSelect(nn.Module):
    """One-argument where feeding index_select (issue 24's second model)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.index_select(x, 0, torch.where(x > 0)[0])


class _Shape:
    def __init__(self, *dims: object) -> None:
        self.shape = dims


def _unbacked(upper: int | None) -> torch.SymInt:
    env = ShapeEnv()
    u = env.create_unbacked_symint()
    if upper is not None:
        _constrain_range_for_size(u, min=0, max=upper)
    return u


def test_an_unbacked_size_is_hinted_by_its_upper_bound() -> None:
    u = _unbacked(32)
    assert size_hint(u, "input_0", 0) == 32
    assert _profile(_Shape(u, 4), "input_0", None) == {"min": [0, 4], "opt": [32, 4], "max": [32, 4]}


def test_an_unbacked_size_without_a_bound_is_a_typed_error() -> None:
    with pytest.raises(ExportError, match=r"input 'input_0' dim 0 .* has no upper bound"):
        size_hint(_unbacked(None), "input_0", 0)


class RepeatRows(nn.Module):
    """repeat_interleave by a count tensor: a data-dependent size with no upper bound."""

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        return torch.repeat_interleave(x, counts, dim=0) * 2


def _dim_without_max() -> torch.SymInt:
    """Dim 0 of an input exported with ``Dim("n")`` (no max: its range ends at torch's int_oo)."""
    program = torch.export.export(nn.ReLU(), (torch.ones(3, 4),), dynamic_shapes=({0: torch.export.Dim("n")},))
    x = next(n for n in program.graph.nodes if n.op == "placeholder")
    return x.meta["val"].shape[0]


@pytest.mark.parametrize("size", [
    pytest.param(lambda: _unbacked(None), id="unbacked"),
    pytest.param(lambda: _unbacked(None) * 2 + 1, id="unbacked-expression"),
    pytest.param(_dim_without_max, id="dim-without-max"),
    pytest.param(lambda: sympy.Symbol("s9", integer=True, positive=True) + 1, id="bare-sympy"),
])
def test_a_size_without_an_upper_bound_names_input_dim_and_expression(size: object) -> None:
    """int_oo claims ``is_finite``; an unbounded size (SymInt or bare sympy, which has no ``.node``)
    once fell through to ``int(int_oo)`` or ``size.node``: a raw AttributeError."""
    dim = size()  # type: ignore[operator]
    expr = re.escape(str(dim.node.expr if isinstance(dim, torch.SymInt) else dim))
    want = rf"input 'tokens' dim 1 \({expr}\) has no upper bound; give Dim\(max="
    with pytest.raises(ExportError, match=want):
        shape_ranges(_Shape(4, dim), "tokens")
    hint = dim.node.hint if isinstance(dim, torch.SymInt) else None
    if hint is not None:  # a traced size keeps its trace value as example
        assert size_hint(dim, "tokens", 1) == hint
        return
    with pytest.raises(ExportError, match=want):
        size_hint(dim, "tokens", 1)


def test_a_size_pyrt_cannot_read_is_a_typed_error() -> None:
    with pytest.raises(ExportError, match=r"output 'y' dim 0 is 'n' \(str\), not a size expression"):
        shape_ranges(_Shape("n"), "y", role="output")
    assert shape_ranges(_Shape(sympy.Integer(3), 5), "x") == ((3, 3), (5, 5))


def test_an_unbounded_input_dim_fails_to_pte_with_a_typed_error(tmp_path: Path) -> None:
    program = torch.export.export(nn.ReLU(), (torch.ones(3, 4),), dynamic_shapes=({0: torch.export.Dim("n")},))
    with pytest.raises(ExportError, match=r"input '\w+' dim 0 \(s\d+\) has no upper bound; give Dim\(max="):
        to_pte(program, tmp_path / "m.pte", builder="reference")


def test_an_engine_output_without_an_upper_bound_is_a_typed_error(tmp_path: Path) -> None:
    from pyrt.export._graph.partition import extract

    gm, _, _ = _staged(RepeatRows(), (torch.ones(3, 4), torch.tensor([1, 0, 2])))
    compute = [n for n in gm.graph.nodes if n.op == "call_function" and isinstance(n.meta["val"], torch.Tensor)]
    part = extract(gm, compute)  # static inputs, an output sized by the counts' sum
    want = r"output '\w+' dim 0 \(u\d+\) has no upper bound; give Dim\(max="
    with pytest.raises(ExportError, match=want):
        check_outputs(part)
    with EngineStore(tmp_path) as store, pytest.raises(ExportError, match=want):
        ReferenceBuilder().build(part, "b0", store, weight_streaming=False)


def test_an_unbounded_size_outside_engines_fails_to_pte_with_a_typed_error(tmp_path: Path) -> None:
    """ExecuTorch's memory planning raised a bare RuntimeError for it."""
    program = torch.export.export(RepeatRows(), (torch.ones(3, 4), torch.tensor([1, 0, 2])))
    with pytest.raises(ExportError, match=r"no upper bound \(.*u\d+.*\); give Dim\(max="):
        to_pte(program, tmp_path / "m.pte", builder="reference")


def _planner(model: nn.Module, args: tuple, tmp: Path) -> tuple[_Planner, EngineStore]:
    gm, forced, options = _staged(model, args)
    store = EngineStore(tmp)
    from pyrt.export._engines.builders import make_builder

    return _Planner(gm, make_builder("reference"), options, store, forced), store


def test_blocking_a_getitem_blocks_its_producer_and_a_repeat_is_an_error(tmp_path: Path) -> None:
    planner, store = _planner(WhereIndexSelect(), (torch.randn(16),), tmp_path)
    with store:
        item = next(n for n in planner.gm.graph.nodes if n.target is __import__("operator").getitem)
        planner._block([item], "test")
        assert item.args[0] in planner.blocked and item not in planner.blocked
        with pytest.raises(ExportError, match="partitioning made no progress"):
            planner._block([item], "test again")


@pytest.mark.parametrize("model, x", [(WhereIndexSelect(), torch.randn(16)), (MaskedSelectMLP(), torch.randn(4, 8))],
                         ids=["where", "masked_select"])
def test_planning_ends_in_few_rounds(model: nn.Module, x: torch.Tensor, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Each round blocks something new; the where model once ran thousands of rounds."""
    import pyrt.export._engines.engine_graph as stage

    planner, store = _planner(model, (x,), tmp_path)
    limit = len(planner.gm.graph.nodes)
    rounds = []

    def counted(*args: object, **kwargs: object) -> object:
        rounds.append(1)
        if len(rounds) > limit:
            raise AssertionError(f"planning took more than {limit} rounds")
        return real(*args, **kwargs)

    real = stage.propose
    monkeypatch.setattr(stage, "propose", counted)
    with store:
        assert planner.plan()


# -- one engine, bounded outputs, ExecuTorch loads the file -------------------------------------------

def _bound(name: str) -> list[int]:
    """The planned (upper-bound) shape of each model's output: N elements -> N rows."""
    n = dm.ROWS * dm.COLS
    rows = dm.ROWS if name.startswith(("bool_index", "where_mlp")) else n
    width = {"nonzero": [1], "masked_select": [], "bool_index": [dm.COLS], "where": []}
    return [rows] + (width[name] if name in dm.OPS else [4])


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, object]]:
    """Each data-dependent model exported once with the reference builder: name -> (path, summary)."""
    root = tmp_path_factory.mktemp("datadep")
    out = {}
    for name in dm.NAMES:
        model, x = dm.build(name)
        path = root / f"{name}.pte"
        out[name] = (path, to_pte(model, path, (x,), builder="reference", progress=False))
    return out


@pytest.mark.parametrize("name", dm.NAMES)
def test_data_dependent_ops_stay_in_one_engine(name: str, exported: dict) -> None:
    path, summary = exported[name]
    (engine,) = summary.engines
    assert summary.fallback_ops == {} and summary.fallback_reasons == {}
    assert engine.bounded_outputs == (("output_0", tuple(_bound(name))),)
    assert -1 in engine.outputs[0].shape
    assert f"output_0: data-dependent shape, planned at its bound {_bound(name)}" in str(summary)


@pytest.mark.parametrize("name", dm.NAMES)
def test_executorch_reads_the_output_as_bounded_dynamic(name: str, exported: dict) -> None:
    from executorch.exir._serialize._program import deserialize_pte_binary
    from executorch.exir.schema import TensorShapeDynamism
    from executorch.runtime import Runtime, Verification

    path, _ = exported[name]
    plan = deserialize_pte_binary(path.read_bytes()).program.execution_plan[0]
    (out,) = (plan.values[i].val for i in plan.outputs)
    assert out.shape_dynamism == TensorShapeDynamism.DYNAMIC_BOUND
    assert list(out.sizes) == _bound(name)
    program = Runtime.get().load_program(path, verification=Verification.InternalConsistency)
    assert program.method_names == {"forward"}


def test_masked_select_is_rewritten_unless_forced(tmp_path: Path) -> None:
    model, x = dm.build("masked_select_mlp")
    summary = to_pte(model, tmp_path / "m.pte", (x,), builder="reference", progress=False,
                     torch_executed_ops=["aten.masked_select.default"])
    assert summary.fallback_ops == {"aten::masked_select": 1} and len(summary.engines) == 2
    assert "forced by torch_executed_ops" in summary.fallback_reasons["aten::masked_select"]


def test_tensorrt_rtx_without_nonzero_ends_with_engines_and_a_reason(tmp_path: Path) -> None:
    """TensorRT-RTX 1.7's parser refuses ONNX NonZero (no plugin, no runner): the export still ends,
    in bounded time, with the rest in engines and the refusal as the fallback reason."""
    pytest.importorskip("tensorrt_rtx")
    summary = to_pte(MaskedSelectMLP(), tmp_path / "m.pte", (torch.randn(4, 8),), builder="tensorrt_rtx",
                     progress=False)
    assert summary.engines
    reasons = " ".join(summary.fallback_reasons.values())
    assert "NonZero" in reasons or "nonzero" in reasons, summary


@pytest.mark.parametrize("name", ["nonzero", "where_mlp"])
def test_the_reference_engine_reports_data_dependent_dims_as_minus_one(name: str, exported: dict) -> None:
    """As TensorRT does before running: the fake TensorRT's shape inference rests on this."""
    from pyrt.format.trt_blob import parse_blob
    from pyrt.sim.refengine import RefEngine
    from tests.export.test_export_helpers import delegates

    (d,) = delegates(exported[name][0])
    ref = RefEngine.from_bytes(bytes(parse_blob(d["blob"]).engine))
    (inp,) = ref.inputs
    for case in dm.CASES:
        x = dm.example(name, case)
        assert ref.infer_output_shapes({inp.name: tuple(x.shape)})["output_0"][0] == -1
        model, _ = dm.build(name)
        assert torch.equal(ref.run({inp.name: x})["output_0"], model(x))


def test_the_reference_engine_runs_an_empty_input_from_raw_bytes() -> None:
    """An engine fed by nonzero's empty result (0 rows) once failed to view 0 bytes as float32."""
    import numpy as np

    from pyrt.sim.refengine import Ref, RefEngine, RefNode, RefTensor

    ref = RefEngine([RefTensor("x", "float32", (-1, 4), (0, 4), (8, 4))], [RefTensor("y", "float32", (-1, 4))], {},
                    [RefNode("aten::relu.default", [Ref("x")], {}, ["y"])])
    (raw, shape), = ref.run_bytes({"x": (np.zeros(0, np.uint8), (0, 4))}).values()
    assert shape == (0, 4) and raw.size == 0


@pytest.mark.parametrize("name", ["masked_select_mlp", "where_mlp", "bool_index_mlp", "nonzero"])
def test_reference_and_tensorrt_plan_one_partition_alike(name: str, tmp_path: Path) -> None:
    """Both builders accept what torch.onnx translates (NonZero, GatherND): one partition, the same one."""
    pytest.importorskip("tensorrt_rtx")
    from tests.export.test_export_partitioning import _plan

    model, x = dm.build(name)
    reference = _plan(model, (x,), "reference", tmp_path)
    assert reference == _plan(model, (x,), "tensorrt_rtx", tmp_path) and len(reference) == 1


@pytest.mark.parametrize("name", ["masked_select_mlp", "where_mlp", "bool_index_mlp", "nonzero_mlp"])
def test_the_onnx_of_a_data_dependent_partition_computes_eager_results(name: str, tmp_path: Path) -> None:
    """The ONNX TensorRT would parse (NonZero + GatherND for a boolean index) gives eager's values and
    shapes for empty, partial and full results (onnx's reference evaluator)."""
    reference = pytest.importorskip("onnx.reference")
    from pyrt.export._engines.to_onnx import export_partition
    from pyrt.export._graph.partition import extract

    model, x = dm.build(name)
    gm, _, _ = _staged(model, (x,))
    compute = [n for n in gm.graph.nodes if n.op == "call_function" and not isinstance(n.meta["val"], torch.SymInt)]
    part = extract(gm, compute)
    path, _ = export_partition(part.module, tmp_path / "p.onnx", ["x"], ["y"])
    session = reference.ReferenceEvaluator(str(path))
    for case in dm.CASES:
        xi = dm.example(name, case)
        (got,) = session.run(None, {"x": xi.numpy()})
        want = model(xi).detach()
        assert got.shape == tuple(want.shape) and torch.allclose(torch.from_numpy(got), want, atol=1e-5), case
