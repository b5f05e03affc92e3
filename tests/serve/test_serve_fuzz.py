"""Hostile HTTP against every route of an in-process replica (hypothesis): bad input is 4xx, never a 500 or a crash.

Bodies are JSON (random documents, infer requests with fields mutated: names, datatypes,
shapes huge or negative or of the wrong type, data of the wrong kind, binary sizes that lie,
deep nesting) and binary (an ``Inference-Header-Content-Length`` that lies, tensors cut
short, bytes left over); headers lie about content lengths. After every hostile request a
valid one is served, and its result is still the direct run's.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import string
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("ray.serve")
pytest.importorskip("executorch")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pyrt.llm.config import GenerationConfig  # noqa: E402
from pyrt.runtime.program import Program  # noqa: E402
from pyrt.serve import routes  # noqa: E402
from pyrt.serve.config import ServeConfig  # noqa: E402
from pyrt.serve.protocol import DATATYPES  # noqa: E402
from pyrt.sim import simulated_gpus  # noqa: E402
from tests.fixtures.serve import asgi_request, assert_batched_equal, build, close, in_process, json_infer  # noqa: E402

EXAMPLES = int(os.environ.get("PYRT_FUZZ_EXAMPLES", "400"))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, np.ndarray, np.ndarray]]:
    """The replica (small limits, so they are hit too), a valid input and the direct run's output."""
    path: Path = build(tmp_path_factory.mktemp("fuzz"))["dyn"]
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    with simulated_gpus(1), Program(path, kernels="numpy") as prog:
        want = np.asarray(prog(x))
    replica = in_process(ServeConfig(str(path), kernels="numpy", max_request_bytes=1 << 16, read_timeout_s=5.0,
                                     request_timeout_s=60.0, generation=GenerationConfig(max_queued=4)),
                         simulated_gpus=1)
    yield replica, x, want
    close(replica)


WORDS = st.sampled_from(["dyn", "nope", "dyn.forward", "input0", "input1", "output0", "FP32", "INT64", "", "1"])
TEXT = WORDS | st.text(string.printable, max_size=12)
NUMBERS = st.integers(-(2**70), 2**70) | st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(
    [0, 1, 2, 3, 8, 32, 33, -1, 2**31, 2**32 + 1, 2**63, 2**64])
SCALARS = st.none() | st.booleans() | NUMBERS | TEXT
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(TEXT, inner, max_size=5),
                    max_leaves=25)
DIMS = st.sampled_from([0, 1, 2, 3, 8, 32, 33, -1, 2**31, 2**62, 2**63, 2**64, 10**30])
HOSTILE_SHAPES = [[2**64, 0], [0, 10**30], [2**63, 0, 8], [0, 2**31, 2**31], [1] * 65, [0] * 65, [-1, 8], [1.5, 8],
                  [True, 8], [33, 8], [1, 9], [8], [1, 8, 1]]
SHAPES = st.sampled_from(HOSTILE_SHAPES) | st.lists(DIMS, max_size=4) | st.lists(DIMS | NUMBERS, max_size=70) | JSON
SIZES = st.sampled_from([0, 4, 32, 64, 96, 2**63]) | NUMBERS | JSON
MISSING = object()


def mutated(draw: Any, valid: dict[str, Any], junk: dict[str, Any]) -> dict[str, Any]:
    """``valid`` with some of its fields replaced by junk from ``junk[field]`` (or left out)."""
    out = dict(valid)
    for key, strategy in junk.items():
        if draw(st.integers(0, 3)) == 0:
            value = draw(strategy | st.just(MISSING))
            if value is MISSING:
                out.pop(key, None)
            else:
                out[key] = value
    return out


def _count(shape: Any) -> int | None:
    """Elements a shape holds, when it is a list of whole numbers >= 0 holding few enough to send."""
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                              for d in shape):
        return None
    n = math.prod(shape)
    return n if n <= 4096 else None


@st.composite
def tensor(draw: Any, binary: bool) -> tuple[dict[str, Any], bytes]:
    """One input tensor: a shape (the model's, or a hostile one) and data or binary bytes that match it
    (mostly), then some fields mutated; its binary bytes when ``binary``."""
    shape = draw(st.sampled_from([[1, 8], [2, 8], [3, 8]])) if draw(st.booleans()) else draw(
        st.sampled_from(HOSTILE_SHAPES) if draw(st.booleans()) else SHAPES)
    count = _count(shape)
    valid: dict[str, Any] = {"name": "input0", "datatype": "FP32", "shape": shape}
    size = 4 * (count if count is not None else draw(st.integers(0, 64)))
    if binary:
        valid["parameters"] = {"binary_data_size": size}
    else:
        valid["data"] = [0.5] * (size // 4)
    item = mutated(draw, valid, {
        "name": st.sampled_from(["input0", "input1", "x"]) | JSON,
        "datatype": st.sampled_from([*DATATYPES.values(), "FP8", "BYTES"]) | JSON,
        "data": st.lists(NUMBERS, max_size=40) | st.lists(st.lists(NUMBERS, max_size=8), max_size=5) | JSON,
        "parameters": st.fixed_dictionaries({}, optional={"binary_data_size": SIZES}) | JSON,
    })
    tail = draw(st.sampled_from([bytes(size)] * 4 + [bytes(max(0, size - 1)), bytes(size + 4)]) | st.binary(
        max_size=200))
    return item, tail if binary else b""


@st.composite
def infer(draw: Any, binary: bool = False) -> tuple[dict[str, Any], bytes]:
    """An infer request (mostly well formed, some fields mutated) and its binary tail."""
    tensors = [draw(tensor(binary))] if draw(st.integers(0, 3)) > 0 else draw(st.lists(tensor(binary), max_size=3))
    doc = mutated(draw, {"inputs": [t for t, _ in tensors]}, {
        "id": JSON, "inputs": JSON,
        "outputs": st.lists(st.fixed_dictionaries({}, optional={
            "name": st.sampled_from(["output0", "output1"]) | JSON,
            "parameters": st.fixed_dictionaries({}, optional={"binary_data": JSON}) | JSON}), max_size=3) | JSON,
        "parameters": st.fixed_dictionaries({}, optional={"binary_data_output": JSON}) | JSON,
    })
    return doc, b"".join(tail for _, tail in tensors)


@st.composite
def deep(draw: Any) -> bytes:
    depth = draw(st.sampled_from([100, 999, 1000, 5000, 200_000]))
    opener, closer = draw(st.sampled_from([(b"[", b"]"), (b'{"a":', b"}"), (b'{"inputs":[', b"]}")]))
    inner = b"1" if opener != b"{" else b""
    return opener * depth + inner + closer * draw(st.sampled_from([depth, 0, depth // 2]))


@st.composite
def binary(draw: Any) -> tuple[bytes, str | None]:
    """A JSON header plus binary tensor bytes, with the header length and the byte counts lying or not."""
    doc, tail = draw(infer(binary=True))
    head = json.dumps(doc, allow_nan=True).encode()
    length = draw(st.sampled_from([str(len(head))] * 8 + [str(len(head) + 1), str(len(head) - 1), "0", "-1",
                                   str(2**64), "x", " 3"]) | st.text(string.printable.strip(), max_size=6))
    return head + tail, length


@st.composite
def hostile(draw: Any, table: list[Any]) -> tuple[str, str, bytes, dict[str, str]]:
    """Mostly (3 in 4) an infer request to the served model; else any of the replica's routes (``table``: its
    Starlette routes, the infer ones first), name and method."""
    if draw(st.integers(0, 3)) > 0:
        route, name, method = table[draw(st.integers(0, 1))], "dyn", "POST"
    else:
        route = draw(st.sampled_from(table))
        name = draw(WORDS | st.text(string.ascii_letters + string.digits + "._-", min_size=1, max_size=10))
        own = next(iter(route.methods))
        method = draw(st.sampled_from([own, own, "GET", "POST", "PUT", "DELETE"]))
    path = route.path.replace("{name}", name).replace("{version}", draw(st.sampled_from(["1", "2", "x"])))
    kind = draw(st.sampled_from(["infer", "infer", "binary", "binary", "json", "deep", "bytes", "empty"]))
    headers: dict[str, str] = {}
    if kind == "json":
        body = json.dumps(draw(JSON), allow_nan=True).encode()
    elif kind == "infer":
        body = json.dumps(draw(infer())[0], allow_nan=True).encode()
    elif kind == "binary":
        body, length = draw(binary())
        headers["Inference-Header-Content-Length"] = length
    elif kind == "deep":
        body = draw(deep())
    else:
        body = draw(st.binary(max_size=300)) if kind == "bytes" else b""
    claimed = draw(st.sampled_from([None, None, len(body), len(body) + 10, max(0, len(body) - 3), 1 << 40]))
    if claimed is not None:
        headers["content-length"] = str(claimed)
    if draw(st.booleans()):
        headers["content-type"] = draw(st.sampled_from(["application/json", "application/octet-stream", "x/y"]))
    return method, path, body, headers


def _valid(replica: Any, x: np.ndarray) -> Any:
    body = json.dumps(json_infer(x)).encode()
    return asyncio.run(replica(asgi_request("POST", "/v2/models/dyn/infer", body)))


@settings(max_examples=EXAMPLES, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(data=st.data())
def test_hostile_requests_are_4xx_and_the_replica_serves_on(served: tuple[Any, np.ndarray, np.ndarray],
                                                            data: st.DataObject) -> None:
    replica, x, want = served
    method, path, body, headers = data.draw(hostile(replica.router.routes), label="request")
    request = asgi_request(method, path, body, headers)
    found = routes.match(replica.router, request.scope)
    reply = asyncio.run(replica(request))
    not_ready = (replica.infer_routes.ready, replica.infer_routes.model_ready)  # outside Ray: no application, 503
    if not isinstance(found, int) and found[0] in not_ready and reply.status_code == 503:
        assert json.loads(reply.body)["ready"] is False
    else:
        assert reply.status_code < 500, (reply.status_code, reply.body[:500])
        if reply.status_code >= 400:  # the protocol's {"error": text}; on /v1 OpenAI's {"error": {"message", ...}}
            error = json.loads(reply.body)["error"]
            message = error["message"] if routes.openai_shaped(path) else error
            assert isinstance(message, str) and message
    good = _valid(replica, x)
    assert good.status_code == 200, good.body
    out = json.loads(good.body)["outputs"][0]
    assert_batched_equal(np.asarray(out["data"], np.float32).reshape(out["shape"]), want)
