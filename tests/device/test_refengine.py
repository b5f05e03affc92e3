"""The reference engine format (PYRTREF1): codec, validation, and the CPU executor."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyrt.errors import EngineError, UnsupportedOperatorError
from pyrt.sim.refengine import (
    ALIGN,
    HEADER,
    MAGIC,
    DType,
    MemoryFormat,
    Ref,
    RefEngine,
    RefEngineExecutionError,
    RefEngineFormatError,
    RefNode,
    RefTensor,
    RefWeight,
)

RNG = np.random.default_rng(7)


def _linear_engine(weight_streaming: bool = True) -> RefEngine:
    return RefEngine(
        inputs=[RefTensor("x", "float32", (-1, 3), (1, 3), (4, 3))],
        outputs=[RefTensor("y", "float32", (-1, 2))],
        weights={"w": RNG.standard_normal((2, 3)).astype(np.float32), "b": np.array([1.0, -1.0], np.float32)},
        nodes=[RefNode("aten::linear.default", [Ref("x"), Ref("w"), Ref("b")], {}, ["h"]),
               RefNode("aten::relu", [Ref("h")], {}, ["y"])],
        weight_streaming=weight_streaming,
    )


def _doc_and_base(data: bytes) -> tuple[dict, int]:
    _, _, _, json_len = HEADER.unpack_from(data, 0)
    base = -(-(HEADER.size + json_len) // ALIGN) * ALIGN
    return json.loads(data[HEADER.size : HEADER.size + json_len]), base


def _rebuild(doc: dict, weights_region: bytes = b"") -> bytes:
    text = json.dumps(doc).encode()
    base = -(-(HEADER.size + len(text)) // ALIGN) * ALIGN
    out = bytearray(base)
    HEADER.pack_into(out, 0, MAGIC, 1, 0, len(text))
    out[HEADER.size : HEADER.size + len(text)] = text
    return bytes(out) + weights_region


# -- codec ----------------------------------------------------------------------------
def test_header_layout_and_weight_alignment_with_bordered_bytes() -> None:
    head = np.full(3, 0x11, np.uint8)   # 3 bytes: the next weight must start at 64
    fill = np.full(70, 0x22, np.uint8)  # crosses one alignment boundary
    tail = np.full(1, 0x33, np.uint8)
    eng = RefEngine([RefTensor("x", "uint8", (1,))], [RefTensor("x", "uint8", (1,))],
                    weights={"head": head, "fill": fill, "tail": tail})
    data = eng.to_bytes()
    magic, version, reserved, json_len = HEADER.unpack_from(data, 0)
    assert (magic, version, reserved) == (MAGIC, 1, 0)
    doc, base = _doc_and_base(data)
    assert base % ALIGN == 0 and not any(data[HEADER.size + json_len : base])
    offsets = {w["name"]: (w["offset"], w["nbytes"]) for w in doc["weights"]}
    assert offsets == {"head": (0, 3), "fill": (64, 70), "tail": (192, 1)}
    region = data[base:]
    assert region[0:3] == b"\x11" * 3 and region[3:64] == bytes(61)
    assert region[64:134] == b"\x22" * 70 and region[134:192] == bytes(58)
    assert region[192:193] == b"\x33" and region[193:] == bytes(63)
    assert len(data) == base + 256


def test_write_to_streams_weights_as_views_and_returns_the_byte_count() -> None:
    eng = _linear_engine()
    pieces: list = []

    class Sink:
        def write(self, data: object) -> None:
            pieces.append(data)

    assert eng.write_to(Sink()) == len(eng.to_bytes()) == sum(memoryview(p).nbytes for p in pieces)
    views = {id(p.obj) for p in pieces if isinstance(p, memoryview)}
    assert views == {id(w.data.obj) for w in eng.weights.values()}  # weight bytes are never copied


def test_round_trip_is_equal_and_weights_are_zero_copy_views() -> None:
    eng = _linear_engine()
    buf = bytearray(eng.to_bytes())
    again = RefEngine.from_bytes(buf)
    assert again == eng
    assert again.streamable_weights_size == 2 * 3 * 4 + 2 * 4
    assert again.weights["w"].data.obj is buf  # a view of the caller's bytes, not a copy
    _, base = _doc_and_base(bytes(buf))
    buf[base] ^= 0xFF
    assert bytes(again.weights["w"].data[:1]) == bytes(buf[base : base + 1])


def test_streamable_size_is_zero_without_weight_streaming() -> None:
    assert _linear_engine(weight_streaming=False).streamable_weights_size == 0


def test_arguments_of_every_kind_round_trip() -> None:
    node = RefNode("aten::_to_copy.default", [Ref("x")],
                   {"dtype": DType("float16"), "layout": None, "non_blocking": False}, ["y"])
    eng = RefEngine([RefTensor("x", "float32", (2,))], [RefTensor("y", "float16", (2,))], nodes=[node])
    again = RefEngine.from_bytes(eng.to_bytes())
    assert again.nodes[0].kwargs == {"dtype": DType("float16"), "layout": None, "non_blocking": False}


@settings(max_examples=25)
@given(st.lists(st.tuples(st.sampled_from(["float32", "int64", "uint8", "float16"]),
                          st.lists(st.integers(0, 5), max_size=3)), min_size=0, max_size=5))
def test_random_weights_round_trip(specs: list[tuple[str, list[int]]]) -> None:
    weights = {f"w{i}": np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)
               for i, (dtype, shape) in enumerate(specs)}
    eng = RefEngine([RefTensor("x", "float32", (1,))], [RefTensor("x", "float32", (1,))], weights=weights)
    again = RefEngine.from_bytes(eng.to_bytes())
    for name, array in weights.items():
        w = again.weights[name]
        assert np.array_equal(np.frombuffer(w.data, dtype=w.dtype).reshape(w.shape), array)


# -- validation of untrusted bytes ---------------------------------------------------------
def test_every_truncation_raises_a_typed_error() -> None:
    data = _linear_engine().to_bytes()
    doc, base = _doc_and_base(data)
    end = base + max(w["offset"] + w["nbytes"] for w in doc["weights"])
    for cut in range(end):
        with pytest.raises(RefEngineFormatError):
            RefEngine.from_bytes(data[:cut])
    assert RefEngine.from_bytes(data[:end]) == RefEngine.from_bytes(data)  # trailing padding is optional


def test_header_corruptions() -> None:
    data = bytearray(_linear_engine().to_bytes())
    cases = {0: "bad magic", 8: "unsupported version", 12: "unsupported version"}
    for offset, message in cases.items():
        bad = bytearray(data)
        bad[offset] ^= 0x01
        with pytest.raises(RefEngineFormatError, match=message):
            RefEngine.from_bytes(bad)
    huge = bytearray(data)
    struct.pack_into("<Q", huge, 16, 1 << 62)
    with pytest.raises(RefEngineFormatError, match="overruns the data"):
        RefEngine.from_bytes(huge)
    _, base = _doc_and_base(bytes(data))
    padded = bytearray(data)
    padded[base - 1] = 1
    with pytest.raises(RefEngineFormatError, match="padding"):
        RefEngine.from_bytes(padded)


def test_engine_format_error_is_an_engine_error() -> None:
    with pytest.raises(EngineError):
        RefEngine.from_bytes(b"PYRTREF1")


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(inputs="x"), "'inputs' has the wrong type"),
        (lambda d: d["inputs"][0].pop("min_shape"), "missing field 'min_shape'"),
        (lambda d: d["inputs"][0].update(shape=[1.5, 3]), "shape must be a list of ints"),
        (lambda d: d["inputs"][0].update(dtype="complex64"), "unknown dtype 'complex64'"),
        (lambda d: d["inputs"][0].update(min_shape=[5, 3]), "profile min"),
        (lambda d: d["weights"][0].update(offset=8), "multiple of 64"),
        (lambda d: d["weights"][0].update(offset=1 << 40), "overruns the weights region"),
        (lambda d: d["weights"][0].update(nbytes=True), "'nbytes' has the wrong type"),
        (lambda d: d["weights"][1].update(offset=0), "overlap"),
        (lambda d: d["weights"][0].update(shape=[3, 3]), "needs 36"),
        (lambda d: d["weights"][1].update(name="w"), "duplicate weight name"),
        (lambda d: d["nodes"][0]["args"].__setitem__(0, {"ref": "nope"}), "uses 'nope' before it is defined"),
        (lambda d: d["nodes"][0]["args"].__setitem__(0, {"lit": 1, "ref": "x"}), "one key"),
        (lambda d: d["nodes"][0]["args"].__setitem__(0, {"lit": {"a": 1}}), "invalid argument"),
        (lambda d: d["nodes"][0].update(target="linear"), "namespace::op"),
        (lambda d: d["nodes"][1].update(outputs=["h"]), "defined twice"),
        (lambda d: d["outputs"][0].update(name="ghost"), "produced by nothing"),
        (lambda d: d.update(outputs=[]), "at least one output"),
        (lambda d: d.update(weight_streaming=1), "'weight_streaming' has the wrong type"),
    ],
)
def test_metadata_corruptions_name_the_field(mutate, message: str) -> None:
    data = _linear_engine().to_bytes()
    doc, base = _doc_and_base(data)
    mutate(doc)
    with pytest.raises(RefEngineFormatError, match=message):
        RefEngine.from_bytes(_rebuild(doc, data[base:]))


def test_invalid_json_and_non_object() -> None:
    with pytest.raises(RefEngineFormatError, match="JSON metadata is invalid"):
        RefEngine.from_bytes(MAGIC + struct.pack("<IIQ", 1, 0, 3) + b"{{{" + bytes(37))
    with pytest.raises(RefEngineFormatError, match="must be an object"):
        RefEngine.from_bytes(_rebuild([]))  # type: ignore[arg-type]


def test_writer_rejects_bad_graphs() -> None:
    with pytest.raises(RefEngineFormatError, match="needs min_shape and max_shape"):
        RefEngine([RefTensor("x", "float32", (-1,))], [RefTensor("x", "float32", (-1,))])
    with pytest.raises(RefEngineFormatError, match="cannot encode argument"):
        RefEngine([RefTensor("x", "float32", (1,))], [RefTensor("y", "float32", (1,))],
                  nodes=[RefNode("aten::mul.Scalar", [Ref("x"), 1j], {}, ["y"])]).to_bytes()


def test_nonfinite_literals_and_memory_formats_round_trip() -> None:
    """-inf/inf/nan and memory_format survive the JSON (masks use -inf; .contiguous() needs the format)."""
    torch = pytest.importorskip("torch")
    eng = RefEngine(
        [RefTensor("x", "float32", (2, 3))], [RefTensor("y", "float32", (3, 2)), RefTensor("m", "float32", (2, 3))],
        nodes=[RefNode("aten::t.default", [Ref("x")], {}, ["xt"]),
               RefNode("aten::clone.default", [Ref("xt")], {"memory_format": MemoryFormat("contiguous_format")},
                       ["c"]),
               RefNode("aten::view.default", [Ref("c"), [3, 2]], {}, ["y"]),
               RefNode("aten::clamp.default", [Ref("x"), float("-inf"), float("inf")], {}, ["k"]),
               RefNode("aten::nan_to_num.default", [Ref("k"), float("nan")], {}, ["m"])])
    again = RefEngine.from_bytes(eng.to_bytes())
    assert again.nodes[1].kwargs == {"memory_format": MemoryFormat("contiguous_format")}
    assert again.nodes[3].args[1:] == [float("-inf"), float("inf")] and np.isnan(again.nodes[4].args[1])
    x = torch.randn(2, 3)
    out = again.run({"x": x}, backend="torch")
    assert torch.equal(out["y"], x.t().contiguous().view(3, 2)) and torch.equal(out["m"], x)


def test_size_arithmetic_runs_on_ints() -> None:
    eng = RefEngine([RefTensor("x", "float32", (-1, 4), (1, 4), (8, 4))], [RefTensor("y", "float32", (-1, 2))],
                    nodes=[RefNode("aten::sym_size.int", [Ref("x"), 0], {}, ["n"]),
                           RefNode("sym::mul", [Ref("n"), 2], {}, ["n2"]),
                           RefNode("aten::view.default", [Ref("x"), [Ref("n2"), 2]], {}, ["y"])])
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    for backend in ("numpy", "torch"):
        assert np.asarray(eng.run({"x": x}, backend=backend)["y"]).shape == (6, 2)
    assert eng.infer_output_shapes({"x": (5, 4)}) == {"y": (10, 2)}
    bad = RefEngine([RefTensor("x", "float32", (1,))], [RefTensor("y", "float32", (1,))],
                    nodes=[RefNode("sym::cube", [1], {}, ["n"]), RefNode("aten::relu", [Ref("x")], {}, ["y"])])
    with pytest.raises(UnsupportedOperatorError, match="sym::cube"):
        bad.run({"x": np.ones(1, np.float32)})



def test_output_shapes_are_inferred_once_per_input_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    eng = RefEngine([RefTensor("x", "float32", (-1, 4), (1, 4), (8, 4))], [RefTensor("y", "float32", (-1, 2))],
                    nodes=[RefNode("aten::sym_size.int", [Ref("x"), 0], {}, ["n"]),
                           RefNode("sym::mul", [Ref("n"), 2], {}, ["n2"]),
                           RefNode("aten::view.default", [Ref("x"), [Ref("n2"), 2]], {}, ["y"])])
    runs: list[object] = []
    infer = eng._infer_shapes
    monkeypatch.setattr(eng, "_infer_shapes", lambda *a: runs.append(a) or infer(*a))
    assert [eng.infer_output_shapes({"x": (n, 4)}) for n in (5, 3, 5, 3)] == [{"y": (10, 2)}, {"y": (6, 2)}] * 2
    assert len(runs) == 2  # the meta run happens once per input shape
    eng.infer_output_shapes({"x": (5, 4)})["y"] = (0,)  # callers get their own dict
    assert eng.infer_output_shapes({"x": (5, 4)}) == {"y": (10, 2)}

# -- the executor -------------------------------------------------------------------------------
A = RNG.standard_normal((2, 3)).astype(np.float32)
B = RNG.standard_normal((2, 3)).astype(np.float32)
M = RNG.standard_normal((3, 4)).astype(np.float32)
V = RNG.standard_normal((3,)).astype(np.float32)
INTS = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int32)

# target, args, kwargs, inputs, expected (written out in numpy, independently of the executor)
OP_CASES = [
    ("aten::add.Tensor", [Ref("a"), Ref("b")], {}, {"a": A, "b": B}, A + B),
    ("aten::add.Tensor", [Ref("a"), Ref("b")], {"alpha": 2}, {"a": A, "b": B}, A + 2 * B),
    ("aten::add.Scalar", [Ref("a"), 1.5], {}, {"a": A}, A + np.float32(1.5)),
    ("aten::sub.Tensor", [Ref("a"), Ref("b")], {}, {"a": A, "b": B}, A - B),
    ("aten::mul.Tensor", [Ref("a"), Ref("b")], {}, {"a": A, "b": B}, A * B),
    ("aten::mul.Scalar", [Ref("a"), 3.0], {}, {"a": A}, A * np.float32(3)),
    ("aten::div.Tensor", [Ref("a"), Ref("b")], {}, {"a": A, "b": B}, A / B),
    ("aten::div.Tensor", [Ref("i"), 2], {}, {"i": INTS}, (INTS / 2).astype(np.float32)),
    ("aten::relu", [Ref("a")], {}, {"a": A}, np.maximum(A, 0)),
    ("aten::sigmoid", [Ref("a")], {}, {"a": A}, (1 / (1 + np.exp(-A.astype(np.float64)))).astype(np.float32)),
    ("aten::tanh", [Ref("a")], {}, {"a": A}, np.tanh(A)),
    ("aten::mm", [Ref("a"), Ref("m")], {}, {"a": A, "m": M}, A @ M),
    ("aten::matmul", [Ref("a"), Ref("m")], {}, {"a": A, "m": M}, A @ M),
    ("aten::addmm", [Ref("v4"), Ref("a"), Ref("m")], {"beta": 0.5}, {"v4": M[0], "a": A, "m": M}, 0.5 * M[0] + A @ M),
    ("aten::linear", [Ref("a"), Ref("mt"), Ref("v")], {}, {"a": A, "mt": M[:, :3], "v": V}, A @ M[:, :3].T + V),
    ("aten::permute", [Ref("a"), [1, 0]], {}, {"a": A}, A.T),
    ("aten::transpose.int", [Ref("a"), 0, 1], {}, {"a": A}, A.T),
    ("aten::view", [Ref("a"), [3, 2]], {}, {"a": A}, A.reshape(3, 2)),
    ("aten::reshape", [Ref("a"), [-1]], {}, {"a": A}, A.reshape(-1)),
    ("aten::cat", [[Ref("a"), Ref("b")], 1], {}, {"a": A, "b": B}, np.concatenate([A, B], axis=1)),
    ("aten::sum.dim_IntList", [Ref("a"), [1]], {"keepdim": True}, {"a": A}, A.sum(axis=1, keepdims=True)),
    ("aten::sum", [Ref("i")], {}, {"i": INTS}, np.array(INTS.sum(), dtype=np.int64)),
    ("aten::mean.dim", [Ref("a"), [0]], {}, {"a": A}, A.mean(axis=0)),
]


def _one_op(target: str, args: list, kwargs: dict, inputs: dict[str, np.ndarray], expected: np.ndarray) -> RefEngine:
    return RefEngine(
        inputs=[RefTensor(n, a.dtype.name, a.shape) for n, a in inputs.items()],
        outputs=[RefTensor("out", expected.dtype.name, expected.shape)],
        nodes=[RefNode(target, args, kwargs, ["out"])],
    )


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize(("target", "args", "kwargs", "inputs", "expected"), OP_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(OP_CASES)])
def test_core_ops_compute_real_results(backend, target, args, kwargs, inputs, expected) -> None:
    if backend == "torch":
        pytest.importorskip("torch")
    eng = RefEngine.from_bytes(_one_op(target, args, kwargs, inputs, expected).to_bytes())
    out = np.asarray(eng.run(inputs, backend=backend)["out"])
    assert out.dtype == expected.dtype and out.shape == expected.shape
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_numpy_backend_refuses_ops_it_cannot_run_by_name() -> None:
    eng = _one_op("aten::softmax.int", [Ref("a"), 1], {}, {"a": A}, A)
    with pytest.raises(UnsupportedOperatorError, match="aten::softmax.int"):
        eng.run({"a": A}, backend="numpy")


def test_torch_backend_runs_what_numpy_cannot() -> None:
    torch = pytest.importorskip("torch")
    expected = torch.softmax(torch.from_numpy(A), 1).numpy()
    out = _one_op("aten::_softmax", [Ref("a"), 1, False], {}, {"a": A}, expected).run({"a": A}, backend="torch")
    np.testing.assert_allclose(out["out"].numpy(), expected, rtol=1e-6)


def test_unknown_operator_is_refused_by_name() -> None:
    pytest.importorskip("torch")
    eng = _one_op("aten::no_such_op", [Ref("a")], {}, {"a": A}, A)
    with pytest.raises(UnsupportedOperatorError, match="aten::no_such_op"):
        eng.run({"a": A}, backend="torch")


def test_multi_output_nodes_bind_one_name_per_result() -> None:
    torch = pytest.importorskip("torch")
    eng = RefEngine(
        inputs=[RefTensor("a", "float32", (2, 3))],
        outputs=[RefTensor("hi", "float32", (2,)), RefTensor("at", "int64", (2,))],
        nodes=[RefNode("aten::max.dim", [Ref("a"), 1], {}, ["hi", "at"])],
    )
    out = RefEngine.from_bytes(eng.to_bytes()).run({"a": A}, backend="torch")
    np.testing.assert_array_equal(out["hi"].numpy(), A.max(axis=1))
    np.testing.assert_array_equal(out["at"].numpy(), A.argmax(axis=1))
    bad = RefEngine(eng.inputs, [RefTensor("hi", "float32", (2,))],
                    nodes=[RefNode("aten::max.dim", [Ref("a"), 1], {}, ["hi"])])
    with pytest.raises(RefEngineExecutionError, match="returned 2 values"):
        bad.run({"a": torch.from_numpy(A)}, backend="torch")


def test_declared_output_dtype_and_shape_are_enforced() -> None:
    wrong_dtype = _one_op("aten::relu", [Ref("a")], {}, {"a": A}, A.astype(np.float16))
    with pytest.raises(RefEngineExecutionError, match="computed as float32, declared float16"):
        wrong_dtype.run({"a": A}, backend="numpy")
    wrong_shape = _one_op("aten::relu", [Ref("a")], {}, {"a": A}, A.T)
    with pytest.raises(RefEngineExecutionError, match="shape"):
        wrong_shape.run({"a": A}, backend="numpy")


def test_inputs_are_checked_against_the_profile() -> None:
    eng = _linear_engine()
    with pytest.raises(RefEngineExecutionError, match="within"):
        eng.run({"x": np.zeros((9, 3), np.float32)}, backend="numpy")
    with pytest.raises(RefEngineExecutionError, match="was not given"):
        eng.run({}, backend="numpy")


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_dynamic_shapes_and_weights(backend: str) -> None:
    if backend == "torch":
        pytest.importorskip("torch")
    eng = RefEngine.from_bytes(_linear_engine().to_bytes())
    x = np.random.default_rng(3).standard_normal((3, 3)).astype(np.float32)  # its own: not the test order's draws
    w = np.frombuffer(eng.weights["w"].data, np.float32).reshape(2, 3)
    expected = np.maximum(x @ w.T + np.array([1.0, -1.0], np.float32), 0)
    np.testing.assert_allclose(np.asarray(eng.run({"x": x}, backend=backend)["y"]), expected, rtol=1e-6)
    assert eng.infer_output_shapes({"x": (4, 3)}) == {"y": (4, 2)}


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_weight_of_copies_unless_asked_for_a_view(kind: str) -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    if kind == "torch":
        a = pytest.importorskip("torch").from_numpy(a)
    copied, viewed = RefWeight.of(a), RefWeight.of(a, copy=False)
    assert copied == viewed == RefWeight("float32", (2, 3), memoryview(np.arange(6, dtype=np.float32).tobytes()))
    a[0, 0] = 9.0
    assert np.frombuffer(copied.data, np.float32)[0] == 0.0
    assert np.frombuffer(viewed.data, np.float32)[0] == 9.0  # the view shares the caller's memory


def test_bfloat16_weights_need_torch() -> None:
    torch = pytest.importorskip("torch")
    w = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    eng = RefEngine([RefTensor("x", "bfloat16", (2,))], [RefTensor("y", "bfloat16", (2,))],
                    weights={"w": w}, nodes=[RefNode("aten::mul.Tensor", [Ref("x"), Ref("w")], {}, ["y"])])
    again = RefEngine.from_bytes(eng.to_bytes())
    assert again.weights["w"] == RefWeight.of(w)
    x = torch.tensor([2.0, 3.0], dtype=torch.bfloat16)
    assert again.run({"x": x}, backend="torch")["y"].tolist() == [3.0, -6.0]
    with pytest.raises(UnsupportedOperatorError, match="bfloat16"):
        again.run({"x": x.float().numpy()}, backend="numpy")


def test_first_runs_on_many_threads_at_once_import_torch_once() -> None:
    """A fresh process: 16 threads start their first reference-engine run together (torch not yet imported)."""
    pytest.importorskip("torch")
    code = """
import sys, threading
import numpy as np
from pyrt.sim.refengine import Ref, RefEngine, RefNode, RefTensor
from pyrt.sim.refengine import backends
assert "torch" not in sys.modules
eng = RefEngine(inputs=[RefTensor("x", "float32", (2,))], outputs=[RefTensor("y", "float32", (2,))],
                weights={"w": np.array([10.0, 20.0], dtype=np.float32)},
                nodes=[RefNode("aten::mul.Tensor", [Ref("x"), Ref("w")], {}, ["y"])])
gate, seen, bad = threading.Barrier(16), [], []
def first_run(i):
    gate.wait()
    try:
        raw, shape = eng.run_bytes({"x": (np.array([i, 1], np.float32).view(np.uint8), (2,))})["y"]
        assert raw.view(np.float32).tolist() == [10.0 * i, 20.0], raw
        seen.append(id(backends.pick_backend("auto")))
    except BaseException as exc:
        bad.append(repr(exc))
threads = [threading.Thread(target=first_run, args=(i,)) for i in range(16)]
[t.start() for t in threads]
[t.join() for t in threads]
print(len(set(seen)), len(seen), bad)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == "1 16 []"  # one backend, shared; every thread got its right result
