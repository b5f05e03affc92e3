"""The weight-only quantization scheme (pyrt.format.weight_quant), against its definition and against
ONNX's INT4 packing and ExecuTorch's embedding_4bit packing, each checked by the project that defines it.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pyrt.errors import PteFormatError
from pyrt.format import weight_quant as wq


def _weights(rows: int, cols: int) -> st.SearchStrategy[np.ndarray]:
    return hnp.arrays(np.float32, (rows, cols), elements=st.floats(-4, 4, width=32))


def test_round_half_to_even_and_clamp() -> None:
    w = np.array([[2.5, 3.5, -2.5, -0.5, 7.0, 1.5, -7.0, 0.0]], np.float32)  # max 7, int4: scale exactly 1
    q, s = wq.quantize(w, bits=4, group=8)
    assert s.tolist() == [[1.0]] and q.tolist() == [[2, 4, -2, 0, 7, 2, -7, 0]]
    q8, s8 = wq.quantize(w * 127 / 7, bits=8, group=8)
    assert int(np.abs(q8).max()) == 127 and q8.min() >= -127  # symmetric: -128 never used


def test_zero_groups_get_scale_one_and_never_a_zero_scale() -> None:
    w = np.zeros((2, 32), np.float32)
    w[1, 16:] = 0.5
    q, s = wq.quantize(w, bits=8, group=16)
    assert s[0].tolist() == [1.0, 1.0] and s[1, 0] == 1.0 and np.all(q[0] == 0)
    tiny, s16 = wq.quantize(np.full((1, 16), 1e-12, np.float32), bits=4, group=16, scale_dtype="float16")
    assert s16.tolist() == [[1.0]] and np.all(tiny == 0)  # 1e-12 / 7 underflows float16


def test_non_finite_weights_are_refused() -> None:
    with pytest.raises(ValueError, match="inf or NaN"):
        wq.quantize(np.array([[np.nan] * 16], np.float32), bits=8, group=16)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_scales_round_as_torch_rounds(dtype: str) -> None:
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).lognormal(-4, 3, 4096).astype(np.float32)
    want = torch.from_numpy(x).to(getattr(torch, dtype)).float().numpy()
    assert np.array_equal(wq.round_scales(x, dtype), np.where(want > 0, want, 1))


@settings(max_examples=60)
@given(st.sampled_from([4, 8]), st.sampled_from([16, 32]), st.integers(1, 4), st.data())
def test_error_is_at_most_half_a_step(bits: int, group: int, rows: int, data: st.DataObject) -> None:
    w = data.draw(_weights(rows, group * 2))
    q, s = wq.quantize(w, bits=bits, group=group)
    assert np.abs(q).max(initial=0) <= wq.qmax(bits)
    err = np.abs(wq.dequantize(q, s, group) - w).reshape(rows, 2, group)
    assert np.all(err <= s[:, :, None] * (0.5 + 1e-5))


@settings(max_examples=60)
@given(hnp.arrays(np.int8, (3, 8), elements=st.integers(-8, 7)), st.sampled_from(wq.LAYOUTS))
def test_int4_packing_round_trips(q: np.ndarray, layout: str) -> None:
    packed = wq.pack_int4(q, layout)
    assert packed.shape == (3, 4) and packed.dtype == np.uint8
    assert np.array_equal(wq.unpack_int4(packed, 8, layout), q)


def test_twos_layout_is_onnx_int4() -> None:
    """ONNX's own reader unpacks pyrt's packed bytes, as TensorRT's parser reads the same initializer."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    q = np.random.default_rng(1).integers(-8, 8, (5, 6)).astype(np.int8)
    tensor = helper.make_tensor("w", TensorProto.INT4, [5, 6], wq.pack_int4(q).tobytes(), raw=True)
    assert np.array_equal(numpy_helper.to_array(tensor).astype(np.int8), q), onnx.__version__


def test_offset8_layout_is_executorchs_embedding_4bit() -> None:
    """ExecuTorch's own packing function (the one its quantizer uses for embedding_4bit) gives the same bytes."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("executorch")
    import executorch.exir  # noqa: F401  (registers quant_fusion::_pack_embedding_weight)

    q = np.random.default_rng(2).integers(-8, 8, (4, 10)).astype(np.int8)
    theirs = torch.ops.quant_fusion._pack_embedding_weight(torch.from_numpy(q), 4).numpy()
    assert np.array_equal(wq.pack_int4(q, "offset8"), theirs)


def test_group_for_and_group_sizes() -> None:
    assert [wq.group_for(k, 128) for k in (4096, 256, 96, 130)] == [128, 128, 96, 130]
    assert [wq.is_group_size(g) for g in (16, 128, 1024, 8, 0, 48, True, 128.0)] == [True] * 3 + [False] * 5


def _fail(message: str) -> PteFormatError:
    return PteFormatError(message)


@pytest.mark.parametrize(("bits", "group", "shape", "q", "s", "match"), [
    (3, 16, [4, 32], ("uint8", (4, 16)), ("float32", (4, 2)), "unknown quantization 3 bits"),
    (4, 16, [4, 32], ("uint8", (4, 15)), ("float32", (4, 2)), r"packed values are uint8\[4, 15\]"),
    (8, 16, [4, 32], ("uint8", (4, 32)), ("float32", (4, 2)), r"needs int8\[4, 32\]"),
    (4, 16, [4, 32], ("uint8", (4, 16)), ("float32", (4, 3)), r"scales are float32\[4, 3\]"),
    (4, 16, [4, 32], ("uint8", (4, 16)), ("int32", (4, 2)), r"scales are int32"),
    (4, 24, [4, 32], ("uint8", (4, 16)), ("float32", (4, 1)), "group size 24 does not divide 32"),
    (4, 16, [4, 0], ("uint8", (4, 0)), ("float32", (4, 0)), "is not"),
])
def test_stored_tensors_are_checked(bits: int, group: int, shape: list[int], q: tuple[str, tuple[int, ...]],
                                    s: tuple[str, tuple[int, ...]], match: str) -> None:
    with pytest.raises(PteFormatError, match=match):
        wq.check_stored("layer.weight", bits, group, shape, q, s, _fail)
    assert wq.check_stored("ok", 4, 16, [4, 32], ("uint8", (4, 16)), ("float16", (4, 2)), _fail) == (4, 4, 32)


@pytest.mark.parametrize("bad", [0.0, -1.0, np.nan, np.inf])
def test_scale_values_are_checked(bad: float) -> None:
    s = np.ones((3, 2), np.float32)
    s[2, 1] = bad
    with pytest.raises(PteFormatError, match=r"'w': scale \[2, 1\] is .*finite and > 0"):
        wq.check_scale_values("w", s, _fail)


@pytest.mark.parametrize(("raw", "match"), [
    (b"not json", "not JSON"),
    (b"[1]", "expected a JSON object"),
    (b'{"scheme":"int3","group_size":128}', "unknown quantization 'int3'"),
    (b'{"group_size":128}', "unknown quantization None"),
    (b'{"scheme":"int8","group_size":100}', "group_size 100 is not a power of two"),
    (b'{"scheme":"int8","group_size":128,"layers":-1}', "layers -1 is not a count"),
])
def test_compile_spec_is_checked(raw: bytes, match: str) -> None:
    with pytest.raises(PteFormatError, match=match):
        wq.parse_spec(raw, "delegate 0")
    info = wq.SpecInfo("int4", 64, 3, 1, 1000, 20)
    assert wq.parse_spec(info.to_json().encode(), "d") == info and json.loads(info.to_json())["scheme"] == "int4"
