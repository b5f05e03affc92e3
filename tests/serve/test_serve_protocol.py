"""pyrt.serve's protocol codec and batching, without a server: checked against tritonclient's own codec.

tritonclient (the ``serve`` extra) writes the requests and reads the responses, so
both directions are checked by an independent implementation of the protocol.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from pyrt.errors import InputError
from pyrt.format.method_io import InputSpec
from pyrt.serve import batching
from pyrt.serve.batching import pack, run_batched, split
from pyrt.serve.protocol import HEADER_LENGTH, ModelInfo, OutputSpec, decode_infer, encode_infer, model_metadata
from tests.fixtures.serve import assert_batched_equal

th = pytest.importorskip("tritonclient.http")

DYN = ModelInfo("m", "forward",
                [InputSpec(0, "Tensor", "float32", (8, 3), True), InputSpec(1, "Tensor", "int64", (8,), True)],
                [OutputSpec("output0", "float32", (8, 3), True), OutputSpec("output1", "bool", (8,), True)])
STATIC = ModelInfo("s.other", "other", [InputSpec(0, "Tensor", "float16", (2, 2), False), InputSpec(1, "Int", value=3)],
                   [OutputSpec("output0", "float16", (2, 2), False)])


def triton_body(arrays: list[np.ndarray], binary: bool, outputs: Any = None) -> tuple[bytes, str | None]:
    """A request body exactly as tritonclient.http writes it."""
    inputs = []
    for i, a in enumerate(arrays):
        dt = {"float32": "FP32", "int64": "INT64", "float16": "FP16", "bool": "BOOL"}[a.dtype.name]
        inp = th.InferInput(f"input{i}", list(a.shape), dt)
        inp.set_data_from_numpy(a, binary_data=binary)
        inputs.append(inp)
    body, json_size = th.InferenceServerClient.generate_request_body(inputs, outputs=outputs, request_id="r1")
    return body, None if json_size is None else str(json_size)


def dyn_arrays(rows: int = 3) -> list[np.ndarray]:
    rng = np.random.default_rng(rows)
    return [rng.standard_normal((rows, 3)).astype(np.float32), np.arange(rows, dtype=np.int64)]


@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_requests_decode_to_the_arrays_sent(binary: bool) -> None:
    sent = dyn_arrays()
    body, header = triton_body(sent, binary)
    assert (header is not None) == binary
    req = decode_infer(DYN, body, header)
    assert req.id == "r1" and req.rows == 3
    for got, want in zip(req.arrays, sent, strict=True):
        assert got.dtype == want.dtype and np.array_equal(got, want)
    if binary:  # views of the request body, no copy on the hot path
        assert all(np.shares_memory(a, np.frombuffer(body, np.uint8)) for a in req.arrays)


@pytest.mark.parametrize("binary", [True, False])
def test_responses_read_back_with_tritonclient(binary: bool) -> None:
    arrays = dyn_arrays(2)
    outs = [th.InferRequestedOutput("output0", binary_data=binary), th.InferRequestedOutput("output1",
                                                                                           binary_data=binary)]
    req = decode_infer(DYN, *triton_body(arrays, True, outs))
    y0, y1 = arrays[0] * 2, arrays[1] > 0
    body, headers = encode_infer(DYN, req, [y0, y1])
    assert (HEADER_LENGTH in headers) == binary
    result = th.InferenceServerClient.parse_response_body(
        body, header_length=int(headers[HEADER_LENGTH]) if binary else None)
    assert np.array_equal(result.as_numpy("output0"), y0) and np.array_equal(result.as_numpy("output1"), y1)
    assert result.get_response()["id"] == "r1" and result.get_response()["model_name"] == "m"


def test_no_outputs_named_means_binary_outputs_and_one_output_may_be_asked_for() -> None:
    arrays = dyn_arrays(1)
    req = decode_infer(DYN, *triton_body(arrays, False))  # tritonclient then asks for binary_data_output
    body, headers = encode_infer(DYN, req, [arrays[0], arrays[1] > 0])
    head = json.loads(body[:int(headers[HEADER_LENGTH])])
    assert [o["parameters"]["binary_data_size"] for o in head["outputs"]] == [12, 1]
    req = decode_infer(DYN, *triton_body(arrays, False, [th.InferRequestedOutput("output1", binary_data=False)]))
    body, headers = encode_infer(DYN, req, [arrays[0], arrays[1] > 0])
    assert headers == {} and json.loads(body)["outputs"] == [
        {"name": "output1", "datatype": "BOOL", "shape": [1], "data": [False]}]


def test_metadata_names_datatypes_dynamic_dims_and_batching() -> None:
    meta = model_metadata(DYN, max_batch_size=4)
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [
        ("input0", "FP32", [-1, -1]), ("input1", "INT64", [-1])]
    assert meta["inputs"][0]["parameters"]["max_shape"] == [8, 3] and meta["parameters"]["max_batch_size"] == 4
    static = model_metadata(STATIC)
    assert static["inputs"] == [{"name": "input0", "datatype": "FP16", "shape": [2, 2],
                                 "parameters": {"max_shape": [2, 2]}}]  # the scalar keeps its exported value
    assert static["parameters"] == {"method": "other", "max_batch_size": 0} and STATIC.batch_bound == 0


def _json(inputs: list[dict[str, Any]], **extra: Any) -> bytes:
    return json.dumps({"inputs": inputs, **extra}).encode()


X = {"name": "input0", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}
IDX = {"name": "input1", "datatype": "INT64", "shape": [1], "data": [0]}
BAD = [
    (b"{not json", None, "not valid JSON"),
    (b"[1, 2]", None, "must be a JSON object"),
    (_json([X]), None, "input 'input1' is missing"),
    (_json([X, IDX, {**IDX, "name": "input7"}]), None, "no input 'input7'"),
    (_json([X, IDX, IDX]), None, "input 'input1' is given twice"),
    (_json([{**X, "datatype": "FP64"}, IDX]), None, "input 'input0': datatype 'FP64', the model takes FP32"),
    (_json([{**X, "shape": [3]}, IDX]), None, "input 'input0'"),  # rank
    (_json([{**X, "shape": [9, 3], "data": [0] * 27}, IDX]), None, "exceeds the upper bound"),
    (_json([{**X, "shape": [1, -3]}, IDX]), None, "whole numbers >= 0"),
    (_json([{**X, "data": [1, 2]}, IDX]), None, "2 values in 'data'; shape [1, 3] needs 3"),
    (_json([{**X, "data": ["a", "b", "c"]}, IDX]), None, "not a list of float32 numbers"),
    (_json([{**X, "data": None, "parameters": {"binary_data_size": 12}}, IDX]), None, "exceeds the 0 bytes left"),
    (_json([X, IDX], outputs=[{"name": "output9"}]), None, "no output 'output9'"),
    (_json([X, IDX]), "999", "is not a length within"),
    # found by tests/serve/test_serve_fuzz.py: 500s before (numpy's ValueError), silent wrapping or inf
    (_json([{**X, "shape": [2**64, 0], "data": []}, IDX]), None, "exceeds the upper bound"),
    (_json([{**X, "shape": [0, 10**30], "data": None, "parameters": {"binary_data_size": 0}}, IDX]), None,
     "exceeds the upper bound"),
    (_json([{**X, "data": [1e300, 0, 0]}, IDX]), None, "overflow"),
    (_json([X, {**IDX, "data": [2**70]}]), None, "not a list of int64 numbers"),
    (_json([X, {**IDX, "data": [1.5]}]), None, "not whole numbers"),
    (_json([X, {**IDX, "data": [float("nan")]}]), None, "not whole numbers"),
    (b"[" * 200_000 + b"]" * 200_000, None, "nests too deeply"),
]


@pytest.mark.parametrize(("body", "header", "message"), BAD)
def test_bad_requests_are_input_errors_naming_the_input(body: bytes, header: str | None, message: str) -> None:
    with pytest.raises(InputError, match="model 'm'") as info:
        decode_infer(DYN, body, header)
    assert message in str(info.value)


def test_binary_byte_counts_must_match_the_shape() -> None:
    x = np.zeros((1, 3), np.float32)
    head = _json([{**X, "data": None, "parameters": {"binary_data_size": 8}}, IDX])
    with pytest.raises(InputError, match=r"input 'input0': 8 bytes of binary data; shape \[1, 3\] FP32 needs 12"):
        decode_infer(DYN, head + x.tobytes()[:8], str(len(head)))
    body, header = triton_body(dyn_arrays(1), True)
    with pytest.raises(InputError, match="4 bytes of binary data follow the last binary input"):
        decode_infer(DYN, body + b"\0" * 4, header)


def test_scalar_inputs_are_not_sent_and_static_shapes_are_exact() -> None:
    x = np.ones((2, 2), np.float16)
    req = decode_infer(STATIC, *triton_body([x], True))
    assert len(req.arrays) == 1 and np.array_equal(req.arrays[0], x)
    with pytest.raises(InputError, match="differs from the static shape"):
        decode_infer(STATIC, *triton_body([np.ones((1, 2), np.float16)], True))


# -- batching ---------------------------------------------------------------------------------------


def test_pack_keeps_order_and_the_row_limit() -> None:
    assert pack([1, 2, 3, 4, 1], 4) == [[0, 1], [2], [3], [4]]
    assert pack([5, 1, 1], 4) == [[0], [1, 2]]  # a request over the limit runs alone
    assert pack([], 4) == []


def test_split_refuses_outputs_without_the_batch_dim() -> None:
    ys = split([np.arange(6).reshape(3, 2)], [1, 2])
    assert [y[0].tolist() for y in ys] == [[[0, 1]], [[2, 3], [4, 5]]]
    with pytest.raises(ValueError, match="not the 3 batched rows"):
        split([np.zeros((2, 2))], [1, 2])


def test_batched_runs_give_each_caller_its_unbatched_result() -> None:
    w = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    calls: list[int] = []

    def run(xs: list[np.ndarray]) -> list[np.ndarray]:
        if (xs[1] < 0).any():
            raise InputError("negative index")
        return [xs[0] @ w, xs[1] * 2]

    batch = [dyn_arrays(r) for r in (1, 3, 2, 4, 1)]
    batch.append([np.zeros((1, 4), np.float32), np.zeros(1, np.int64)])  # other trailing dims: its own group
    batch[2][1][0] = -1  # this request fails alone; the others still get results
    results = run_batched(run, batch, limit=4, on_batch=calls.append)
    for i, (got, xs) in enumerate(zip(results, batch, strict=True)):
        if i == 2:
            assert isinstance(got, InputError)
        elif i == 5:
            assert isinstance(got, ValueError)  # matmul shape mismatch, handed to that caller only
        else:
            assert isinstance(got, list)
            assert_batched_equal(got[0], xs[0] @ w)
            np.testing.assert_array_equal(got[1], xs[1] * 2)  # exact outputs: equal
    assert max(calls) > 1 and sum(calls) >= sum(int(b[0].shape[0]) for b in batch) - 1


def test_the_batching_promise_holds_for_wide_products_and_tells_callers_apart() -> None:
    """Batched float32 products over 256-wide rows stay within the promise; another caller's rows never do.

    The weights are scaled as a trained layer's are (outputs of order 1, He's 1/sqrt(width)).
    """
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((256, 64)) / 16).astype(np.float32)
    batch = [[rng.standard_normal((int(n), 256)).astype(np.float32)] for n in rng.integers(1, 6, 40)]
    calls: list[int] = []
    results = run_batched(lambda xs: [np.tanh(xs[0] @ w)], batch, limit=32, on_batch=calls.append)
    assert max(calls) > 5  # the products really ran over several callers' rows
    for got, xs in zip(results, batch, strict=True):
        assert isinstance(got, list)
        alone = np.tanh(xs[0] @ w)
        assert_batched_equal(got[0], alone)
        other = np.tanh(batch[0][0][:1] @ w) if xs is not batch[0] else np.tanh(batch[1][0][:1] @ w)
        assert not np.allclose(got[0][:1], other, rtol=batching.RTOL, atol=batching.ATOL)
