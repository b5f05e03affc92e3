"""An engine over 2 GiB round-trips: export writes it to a segment, pyrt.inspect reads it back.

Slow (it writes ~4 GiB: the spilled engine and the .pte); run with ``-m slow``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import pyrt
from pyrt.export import to_pte
from pyrt.format.trt_blob import parse_blob
from pyrt.pte_reader import PteFile
from pyrt.sim.refengine import RefEngine

pytestmark = [pytest.mark.export]

TWO_GIB = 1 << 31


class Huge(nn.Module):
    """One weight just over 2 GiB, left mostly untouched (its pages cost no memory until read)."""

    def __init__(self, nbytes: int) -> None:
        super().__init__()
        w = torch.empty(nbytes // 4, dtype=torch.float32)
        w[0], w[-1] = 1.5, 2.5  # markers at both ends of the weight
        self.w = nn.Parameter(w, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.w[:4] + self.w[-4:]


@pytest.mark.slow
def test_engine_over_2gib_round_trips(tmp_path: Path) -> None:
    nbytes = TWO_GIB + (1 << 20)
    summary = to_pte(Huge(nbytes), tmp_path / "huge.pte", (torch.zeros(4),), builder="reference", progress=False)
    (engine,) = summary.engines
    assert engine.size > nbytes
    info = pyrt.inspect(tmp_path / "huge.pte")
    (delegate,) = info["methods"][0]["delegates"]
    assert delegate["location"] == "segment" and delegate["tensorrt"]["engine_size"] == engine.size
    assert info["file"]["program_size"] < 1 << 20  # the flatbuffer stays small: the engine is in a segment
    with PteFile.open(tmp_path / "huge.pte") as pte:
        plan = pte.program.execution_plan[0]
        blob = parse_blob(pte.program.delegate_data(plan.delegates[0]))
        ref = RefEngine.from_bytes(blob.engine)
        (weight,) = ref.weights.values()
        assert weight.nbytes == nbytes
        head = np.frombuffer(weight.data[:4], np.float32)[0]
        tail = np.frombuffer(weight.data[nbytes - 4 :], np.float32)[0]
        assert (head, tail) == (1.5, 2.5)
        del ref, weight, blob, plan
