"""Unit tests: option checking, the reference builder's writer, Torch-TensorRT state decoding, specs."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.fx as fx
from hypothesis import given
from hypothesis import strategies as st

from pyrt.errors import BudgetError, ExportError
from pyrt.export import options as opt
from pyrt.export import reference_builder
from pyrt.export._graph.spec import EngineSpec, evaluate
from pyrt.export.torchtrt import decode_state, engine_state
from pyrt.format.trt_blob import AliasedIO, IOBinding
from pyrt.sim.refengine import RefEngine
from tests.export.test_export_helpers import StandInEngine, standin
from tests.export.test_export_traps import TwoLinears

# -- options ----------------------------------------------------------------------------------------


@given(st.integers(min_value=0, max_value=1 << 63))
def test_budget_accepts_the_whole_range(value: int) -> None:
    assert opt.check_budget(value, "b") == value
    assert opt.parse_budget_spec(str(value).encode(), "b") == value


@given(st.one_of(st.integers(max_value=-1), st.integers(min_value=(1 << 63) + 1)))
def test_budget_refuses_out_of_range(value: int) -> None:
    with pytest.raises(BudgetError, match="outside"):
        opt.check_budget(value, "b")


@pytest.mark.parametrize("value, device", [("cuda", "cuda:0"), ("CUDA:3", "cuda:3"), (2, "cuda:2"),
                                           (torch.device("cuda", 1), "cuda:1"), (torch.device("cuda"), "cuda:0")])
def test_devices_normalize(value: object, device: str) -> None:
    assert opt.normalize_device(value, "device") == device


@pytest.mark.parametrize("value", ["cpu", "cuda:x", -1, True, torch.device("cpu"), "cuda:0:1", None])
def test_bad_devices_are_refused(value: object) -> None:
    with pytest.raises(ExportError, match="device"):
        opt.normalize_device(value, "device")


def test_per_partition_mapping() -> None:
    info = [opt.PartitionInfo(i, f"engine_{i}", ()) for i in range(3)]
    pick = opt.PerPartition({0: "cuda:1", "engine_2": 2, "*": "cuda:0"}, "device", opt.normalize_device)
    assert [pick(i) for i in info] == ["cuda:1", "cuda:0", "cuda:2"]
    pick.check_all_used(info)
    strict = opt.PerPartition({0: 0, "engine_7": 1}, "device", opt.normalize_device)
    strict(info[0])
    with pytest.raises(ExportError, match="no entry for partition 1"):
        strict(info[1])
    with pytest.raises(ExportError, match="engine_7"):
        strict.check_all_used(info)
    with pytest.raises(ExportError, match="engine_2"):  # a key used by no partition of these, though it names one
        opt.PerPartition({"engine_2": 0}, "device", opt.normalize_device).check_all_used(info[:2])
    with pytest.raises(ExportError, match=r"device\[0\]"):
        opt.PerPartition({0: "cpu"}, "device", opt.normalize_device)  # checked before any work


@pytest.mark.parametrize("op, name", [
    ("aten.relu.default", "aten::relu.default"), ("aten::add.Tensor", "aten::add.Tensor"),
    ("torch.ops.aten.mul", "aten::mul"), ("sigmoid", "aten::sigmoid"),
    (torch.ops.aten.relu.default, "aten::relu.default"), (torch.ops.aten.relu, "aten::relu"),
])
def test_op_names(op: object, name: str) -> None:
    assert opt.canonical_op_name(op) == name


@pytest.mark.parametrize("kwargs, message", [
    ({"builder": "tensorrt_lean"}, "builder"), ({"min_block_size": 0}, "min_block_size"),
    ({"torch_executed_ops": ["aten.relux"]}, "not a registered operator"), ({"device": "cpu"}, "device"),
    ({"writer": "fast"}, "writer"), ({"weight_streaming": 1}, "weight_streaming"),
    ({"compile_specs": {"target_device": b"cuda:1"}}, "target_device"), ({"progress": "yes"}, "progress"),
    ({"compile_specs": {"x": 3}}, "bytes"),
])
def test_bad_options_fail_before_any_work(tmp_path: Path, kwargs: dict, message: str) -> None:
    from pyrt.export import to_pte

    target = tmp_path / "m.pte"
    target.write_bytes(b"old")
    with pytest.raises(ExportError, match=message):
        to_pte(TwoLinears(), target, (torch.randn(3, 4),), **{"builder": "reference", **kwargs})
    assert target.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["m.pte"]


def test_missing_directory(tmp_path: Path) -> None:
    from pyrt.export import to_pte

    with pytest.raises(ExportError, match="does not exist"):
        to_pte(TwoLinears(), tmp_path / "nope" / "m.pte", (torch.randn(3, 4),), builder="reference")
    with pytest.raises(ExportError, match="directory"):
        to_pte(TwoLinears(), tmp_path, (torch.randn(3, 4),), builder="reference")


# -- reference builder --------------------------------------------------------------------------------


def _linear_partition(bias: bool = True) -> tuple[fx.GraphModule, list]:
    ep = torch.export.export(torch.nn.Linear(4, 3, bias=bias), (torch.randn(2, 4),)).run_decompositions()
    from pyrt.export._graph.fx import unlift
    from pyrt.export._graph.partition import extract

    gm = unlift(ep)
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    part = extract(gm, nodes)
    return part.module, [reference_builder.Profile(((2, 2), (4, 4)))]


def test_streamed_engine_equals_refengine_to_bytes() -> None:
    module, profiles = _linear_partition()
    sink = io.BytesIO()
    inputs, outputs = reference_builder.build(module, profiles, sink, weight_streaming=True)
    data = sink.getvalue()
    parsed = RefEngine.from_bytes(data)
    assert parsed.to_bytes() == data  # helper B's serializer writes exactly what pyrt streamed
    assert parsed.weight_streaming and parsed.streamable_weights_size == 3 * 4 * 4 + 3 * 4
    assert [b.name for b in inputs] == ["input_0"] and [b.name for b in outputs] == ["output_0"]
    x = torch.randn(2, 4)
    got = parsed.run({"input_0": x})["output_0"]
    assert torch.equal(got, module(x)[0])


def test_supports() -> None:
    g = fx.Graph()
    x = g.placeholder("x")
    ok = g.call_function(torch.ops.aten.add.Tensor, (x, 1.5))
    inf = g.call_function(torch.ops.aten.add.Tensor, (x, float("inf")))
    dev = g.call_function(torch.ops.aten._to_copy.default, (x,),
                          {"dtype": torch.float16, "device": torch.device("cpu")})
    layout = g.call_function(torch.ops.aten.mul.Tensor, (x, torch.strided))
    fmt = g.call_function(torch.ops.aten.clone.default, (x,), {"memory_format": torch.contiguous_format})
    nan = g.call_function(torch.ops.aten.mul.Scalar, (x, float("nan")))
    found = [reference_builder.supports(n) for n in (x, ok, inf, dev, layout, fmt, nan)]
    assert found == [False, True, True, True, False, True, True]


# -- Torch-TensorRT state ------------------------------------------------------------------------------


def test_decode_state_fields() -> None:
    state = standin(b"\x01\x02\x03", device=2, inputs=("a", "b"), outputs=("c",),
                    aliased="c@a@kv_cache_update").__getstate__()
    eng = decode_state(state, "e")
    assert eng.aliased_io == (AliasedIO("c", "a", "kv_cache_update"),)
    assert (eng.device_index, eng.serialized_metadata, eng.target_platform) == (2, "bWV0YQ==", "linux_x86_64")
    raw = list(state)
    raw[3] = b"\xff\x00raw"  # a Python runtime may keep raw bytes
    assert decode_state(raw, "e").engine == b"\xff\x00raw"
    assert decode_state(state[:11], "e").aliased_io == ()  # ABI 10 before slots 11/12


@pytest.mark.parametrize("slot, value, message", [
    (0, "9", "ABI"), (2, "x%8%9", "GPU id"), (3, "not base64!", "base64"), (3, "", "empty"),
    (6, "yes", "hardware-compatible"), (12, "a@b", "aliased"),
])
def test_decode_state_rejects(slot: int, value: str, message: str) -> None:
    state = standin(b"E").__getstate__()
    state[slot] = value
    with pytest.raises(ExportError, match=message):
        decode_state(state, "engine 'e'")


def test_engine_state_sources() -> None:
    class Flattened:
        def __obj_flatten__(self) -> tuple:
            return (("version", "10"), ("name", "n"), ("device_info", "0%8%6%0%G"),
                    ("serialized_engine", base64.b64encode(b"ENG").decode()), ("in_binding_names", "x"),
                    ("out_binding_names", "y"), ("hardware_compatible", "0"), ("serialized_metadata", ""),
                    ("target_platform", "windows_x86_64"), ("requires_output_allocator", "0"),
                    ("resource_allocation_strategy", "0"))

    assert decode_state(engine_state(Flattened(), "e"), "e").engine == b"ENG"
    with pytest.raises(ExportError, match="not a Torch-TensorRT engine"):
        engine_state(StandInEngine(["10"]), "e")


# -- engine spec and shape expressions -----------------------------------------------------------------


def test_spec_roundtrip_and_blob_metadata() -> None:
    spec = EngineSpec(key="k", device="cuda:3", inputs=(IOBinding("i", "float16", (-1, 2), True),),
                      outputs=(IOBinding("o", "float16", (-1,), False),), output_dims=((["//", ["sym", "s"], 2],),),
                      symbols={"s": (0, 0, 1, 0)}, budget=5, aliased_io=(AliasedIO("o", "i", "user"),))
    again = EngineSpec.from_json(spec.to_json())
    assert again == spec and again.blob_metadata()["device_id"] == 3
    with pytest.raises(ExportError, match="malformed"):
        EngineSpec.from_json('{"key": 1}')


@given(st.integers(1, 1000), st.integers(1, 1000))
def test_shape_expressions(a: int, b: int) -> None:
    env = {"a": a, "b": b}
    expr = ["+", ["*", 3, ["sym", "a"]], ["//", ["sym", "b"], 2], ["%", ["sym", "a"], 7], ["pow", ["sym", "b"], 2],
            ["max", ["sym", "a"], ["sym", "b"]], ["min", ["sym", "a"], 5]]
    assert evaluate(expr, env) == 3 * a + b // 2 + a % 7 + b * b + max(a, b) + min(a, 5)


def test_fake_kernel_reproduces_symbolic_shapes() -> None:
    """The engine op's fake kernel gives torch.export the partition's own symbolic output sizes."""
    from torch.export import Dim

    from pyrt.export._graph.spec import dim_expr, symbols_from_inputs

    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.cat([x, y], 0).reshape(-1, 2)

    ep = torch.export.export(M(), (torch.randn(4, 4), torch.randn(6, 4)),
                             dynamic_shapes=({0: 2 * Dim("b", max=32)}, {0: Dim("c", max=32)}))
    ins = [n.meta["val"] for n in ep.graph.nodes if n.op == "placeholder"]
    out = [n for n in ep.graph.nodes if n.op == "output"][0].args[0][0].meta["val"]
    symbols = symbols_from_inputs([tuple(v.shape) for v in ins])
    dims = [dim_expr(s, symbols, "t") for s in out.shape]
    for b, c in ((2, 1), (5, 7), (32, 32)):
        xs = (np.zeros((2 * b, 4)), np.zeros((c, 4)))
        env = {k: (xs[i].shape[d] - off) // coeff for k, (i, d, coeff, off) in symbols.table.items()}
        assert [evaluate(d, env) for d in dims] == [(2 * b + c) * 2, 2]
