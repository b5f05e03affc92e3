"""Programs and a local Ray for tests/test_serve*.py: reference engines on simulated GPUs.

``build(directory)`` exports (once) ``dyn.pte``: Linear-ReLU-Linear as one reference
engine with a dynamic batch (1..32) and streamable weights, and ``static.pte``: the same
model with static shapes. ``free_port()`` finds a port for Serve's HTTP proxy.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import numpy as np

MAX_ROWS = 32


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build(directory: Path) -> dict[str, Path]:
    """Export the serve test programs into ``directory`` (needs torch and ExecuTorch)."""
    import torch

    from pyrt.export import to_pte

    class Mlp(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.l1, self.l2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

        def forward(self, x: Any) -> Any:
            return self.l2(torch.relu(self.l1(x)))

    torch.manual_seed(0)
    model = Mlp().eval()
    paths = {"dyn": directory / "dyn.pte", "static": directory / "static.pte"}
    to_pte(model, paths["dyn"], (torch.randn(2, 8),), builder="reference", weight_streaming=True, progress=False,
           dynamic_shapes={"x": {0: torch.export.Dim("batch", min=1, max=MAX_ROWS)}})
    to_pte(model, paths["static"], (torch.randn(2, 8),), builder="reference", progress=False)
    return paths


def rows(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.standard_normal((n, 8)).astype(np.float32)


def json_infer(x: np.ndarray) -> dict[str, Any]:
    """An infer request body with ``x`` as input0, in JSON tensors."""
    return {"inputs": [{"name": "input0", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}]}


def wait_for(check: Any, seconds: float, what: str) -> Any:
    """Poll ``check()`` until it returns something true; AssertionError naming ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {seconds} s")
        time.sleep(0.2)
