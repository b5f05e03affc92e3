"""Hostile quantized files: the reader's corpus of quantized engines gone wrong.

A real quantized reference file (int4, group 16) is corrupted one way at a time: a scale that is zero,
NaN or infinite, a packed tensor of the wrong size, scales of the wrong shape, an unknown bit width,
an unknown quantization tag in the compile spec. Each must be a typed pyrt error naming the tensor (or the
spec) when the file loads and in ``pyrt inspect``, never a wrong answer or a crash; opening and walking the
file with the reader alone still succeeds (the corruption is inside the engine or a compile spec value).
Portable files' quantized constants have their own corpus in tests/kernels/test_quantized_kernels.py.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("executorch")

import pyrt  # noqa: E402
from pyrt.errors import EngineError, PteFormatError, PyrtError  # noqa: E402
from pyrt.export import to_pte  # noqa: E402
from pyrt.pte_reader import PteFile  # noqa: E402
from pyrt.sim import simulated_gpus  # noqa: E402
from pyrt.sim.refengine import ALIGN, HEADER, MAGIC  # noqa: E402
from tests.fixtures.pte import walk  # noqa: E402

pytestmark = pytest.mark.export


@pytest.fixture(scope="module")
def quantized(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.GELU(), torch.nn.Linear(48, 10)).eval()
    path = tmp_path_factory.mktemp("quant") / "m.pte"
    to_pte(model, path, (torch.randn(3, 64),), builder="reference", quantize="int4", group_size=16,
           weight_streaming=True)
    return path.read_bytes()


def _engine(data: bytes) -> tuple[int, dict, int]:
    """(where the reference engine starts in the file, its JSON, where its weights region starts)."""
    start = data.index(MAGIC)
    _, _, _, json_len = HEADER.unpack_from(data, start)
    doc = json.loads(data[start + HEADER.size:start + HEADER.size + json_len])
    return start, doc, start + -(-(HEADER.size + json_len) // ALIGN) * ALIGN


def _scale(value: float) -> Callable[[bytes], bytes]:
    def corrupt(data: bytes) -> bytes:
        _, doc, base = _engine(data)
        w = next(w for w in doc["weights"] if w["name"].endswith("_scales"))
        out = bytearray(data)
        struct.pack_into("<f", out, base + w["offset"] + 4 * 5, value)  # row 1, group 1 of the first layer
        return bytes(out)

    return corrupt


def _text(old: str, new: str) -> Callable[[bytes], bytes]:
    """Replace the first ``old`` by ``new`` (same length: every offset stays where it was)."""
    def corrupt(data: bytes) -> bytes:
        assert len(old) == len(new) and old.encode() in data, old
        return data.replace(old.encode(), new.encode(), 1)

    return corrupt


# case -> (corruption, error type at load, what the message must say)
CASES: dict[str, tuple[Callable[[bytes], bytes], type[PyrtError], str]] = {
    "zero scale": (_scale(0.0), EngineError, r"quantized weight '_0_weight': scale \[1, 1\] is 0.0"),
    "NaN scale": (_scale(math.nan), EngineError, r"scale \[1, 1\] is nan; scales must be finite and > 0"),
    "infinite scale": (_scale(math.inf), EngineError, r"scale \[1, 1\] is inf"),
    "negative scale": (_scale(-0.5), EngineError, r"scale \[1, 1\] is -0.5"),
    "packed values of the wrong size": (_text('{"lit":48},{"lit":64}', '{"lit":48},{"lit":96}'), EngineError,
                                        r"packed values are uint8\[48, 32\], int4 \[48, 96\] needs uint8\[48, 48\]"),
    "scales of the wrong shape": (_text('{"lit":4},{"lit":16},', '{"lit":4},{"lit":32},'), EngineError,
                                  r"scales are float32\[48, 4\], group 32 needs a float \[48, 2\]"),
    "unknown bit width": (_text('{"lit":4},{"lit":16},', '{"lit":3},{"lit":16},'), EngineError,
                          "unknown quantization 3 bits"),
    "unknown quantization tag": (_text('"scheme":"int4"', '"scheme":"int3"'), PteFormatError,
                                 r"pyrt_weight_quantization: unknown quantization 'int3' \(known: int8, int4\)"),
    "malformed quantization spec": (_text('{"scheme":"int4"', '["scheme","int4"'), PteFormatError,
                                    "pyrt_weight_quantization: not JSON"),
}


def test_the_untouched_file_runs(quantized: bytes) -> None:
    with simulated_gpus(1), pyrt.Program(quantized) as prog:
        out = prog(np.ones((3, 64), np.float32))
    assert np.isfinite(out).all()
    assert pyrt.inspect(quantized)["methods"][0]["delegates"][0]["weights"]["dtype"] == "int4"


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_quantized_file_is_a_typed_error(quantized: bytes, case: str, tmp_path: Path) -> None:
    corrupt, error, match = CASES[case]
    data = corrupt(quantized)
    assert data != quantized
    with PteFile.open(data) as pte:  # the reader alone: the container is intact
        walk(pte)
    path = tmp_path / "hostile.pte"
    path.write_bytes(data)
    with simulated_gpus(1), pytest.raises(error, match=match):
        pyrt.Program(path)
    (delegate,) = pyrt.inspect(path)["methods"][0]["delegates"]
    assert "weights" not in delegate and delegate["weights_error"], delegate
    assert any(word in delegate["weights_error"] for word in ("quantiz", "scale")), delegate["weights_error"]


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_mutated_quantized_engines_fail_only_with_pyrt_errors(quantized: bytes, data: st.DataObject) -> None:
    """Random bytes of the reference engine (JSON and packed weights) changed: it loads and runs, or a PyrtError."""
    start, _, _ = _engine(quantized)
    out = bytearray(quantized)
    for _ in range(data.draw(st.integers(1, 4))):
        out[data.draw(st.integers(start, len(quantized) - 1))] = data.draw(st.integers(0, 255))
    try:
        with simulated_gpus(1), pyrt.Program(bytes(out)) as prog:
            prog(np.ones((3, 64), np.float32))
        pyrt.inspect(bytes(out))
    except PyrtError:
        pass
