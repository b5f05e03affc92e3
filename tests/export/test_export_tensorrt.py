"""A real TensorRT-RTX build, end to end (TensorRT-RTX builds engines on a machine without a GPU)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

import pyrt
from pyrt.export import to_pte
from pyrt.format.trt_blob import parse_blob
from tests.export.test_export_helpers import delegates
from tests.export.test_export_traps import TwoLinears

pytest.importorskip("tensorrt_rtx")


@pytest.fixture(scope="module")
def rtx_pte(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, object, object]]:
    from pyrt.export import trt_builder

    path = tmp_path_factory.mktemp("rtx") / "rtx.pte"
    previous, trt_builder.STREAM_MIN = trt_builder.STREAM_MIN, 0  # stream these small engines too
    try:
        torch.manual_seed(0)
        model = TwoLinears().eval()
        summary = to_pte(model, path, (torch.randn(3, 4),), builder="tensorrt_rtx",
                         torch_executed_ops=["aten.sigmoid.default"], weight_streaming=True,
                         weight_streaming_budget=1 << 20, progress=False)
    finally:
        trt_builder.STREAM_MIN = previous
    yield path, summary, model


def test_rtx_engines_in_the_pte(rtx_pte: tuple) -> None:
    path, summary, _ = rtx_pte
    assert [(e.flavour, e.device, e.streamable_weights, e.route) for e in summary.engines] == [
        ("tensorrt_rtx", "cuda:0", True, "stream")] * 2  # each engine went to disk as TensorRT wrote it
    assert summary.fallback_ops == {"aten::sigmoid": 1}
    found = delegates(path)
    ours = pyrt.inspect(path)["methods"][0]["delegates"]
    for d, mine, engine in zip(found, ours, summary.engines, strict=True):
        blob = parse_blob(d["blob"])
        assert blob.engine.nbytes == engine.size > 1000
        assert bytes(blob.engine[:8]) != b"PYRTREF1"
        assert [(b.name, b.dtype) for b in blob.io_bindings] == [("input_0", "float32"), ("output_0", "float32")]
        assert d["compile_specs"] == {"target_device": b"cuda:0", "weight_streaming_budget": b"1048576"}
        assert mine["tensorrt"]["engine_size"] == blob.engine.nbytes
    from executorch.runtime import Runtime

    assert set(Runtime.get().load_program(str(path)).method_names) == {"forward"}


@pytest.mark.gpu
def test_rtx_program_runs_on_a_gpu(rtx_pte: tuple) -> None:
    path, _, model = rtx_pte
    x = torch.randn(3, 4)
    with pyrt.Program(path) as prog:
        got = prog(x.numpy())
    with torch.no_grad():
        want = model(x).numpy()
    np.testing.assert_allclose(np.asarray(got[0] if isinstance(got, (list, tuple)) else got), want,
                               rtol=1e-3, atol=1e-3)
