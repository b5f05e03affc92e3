"""One stage of a big program's life, run in its own process, reporting its peak RSS as JSON.

``python -m tests.memory.bigmem_stages STAGE DIR ENGINE_BYTES TABLE_BYTES`` (from the repository root):

- ``export``: ``to_pte(Big(...), DIR/big.pte, external_weights=True)`` with the reference builder;
- ``inspect``: ``pyrt.inspect(DIR/big.pte, data=DIR/big.ptd)`` and its text report;
- ``load``: ``pyrt.Program(DIR/big.pte, data=DIR/big.ptd, kernels="numpy")`` under one simulated GPU
  (the engine deserializes through the stream reader), then two runs; torch is blocked, as on a
  machine with only the runtime installed.

The model's two weights are ``torch.empty`` pages never written except for markers at both
ends, so the model itself costs no memory: what the stage holds is the stage's own. Peak =
VmHWM after the stage, reset to the current RSS (``/proc/self/clear_refs``) once everything is
imported; ``base`` = RSS at that point.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

MARKS = (1.5, 2.5, 3.5, 4.5)  # engine weight head, engine weight tail, table row 0, last table row


def _status(field: str) -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset() -> float:
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    return _status("VmRSS")


def model(engine_bytes: int, table_bytes: int) -> Any:
    import torch
    from torch import nn

    class Big(nn.Module):
        """``x + w[:4] + w[-4:]`` in a TensorRT engine; ``table[idx]`` run by ExecuTorch (external weights)."""

        def __init__(self) -> None:
            super().__init__()
            w = torch.empty(engine_bytes // 4)
            w[:4], w[-4:] = MARKS[0], MARKS[1]
            table = torch.empty(table_bytes // 16, 4)
            table[0], table[-1] = MARKS[2], MARKS[3]
            self.w = nn.Parameter(w, requires_grad=False)
            self.table = nn.Parameter(table, requires_grad=False)

        def forward(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
            return (x + self.w[:4] + self.w[-4:]) * self.table[idx]

    return Big()


def export(directory: Path, engine_bytes: int, table_bytes: int) -> dict:
    import executorch.exir  # noqa: F401  (imported before the base, like everything else)
    import torch

    from pyrt.export import to_pte

    big = model(engine_bytes, table_bytes)
    example = (torch.zeros(4), torch.tensor([0]))
    base = _reset()
    summary = to_pte(big, directory / "big.pte", example, builder="reference", external_weights=True,
                     torch_executed_ops=["aten.index.Tensor", "aten.mul.Tensor"], progress=False)
    return {"base_mib": base, "engine": summary.engines[0].size, "pte": summary.file_size,
            "ptd": summary.data_size, "routes": [e.route for e in summary.engines]}


def inspect(directory: Path) -> dict:
    import pyrt
    from pyrt.tools.report import format_report

    base = _reset()
    info = pyrt.inspect(directory / "big.pte", data=directory / "big.ptd")
    text = format_report(info)
    external = [t for m in info["methods"] for t in m["tensors"] if t["location"] == "external"]
    return {"base_mib": base, "external": [(t["key"], t["nbytes"], Path(t["file"]).name) for t in external],
            "report_lines": len(text.splitlines())}


def load(directory: Path) -> dict:
    sys.modules["torch"] = None  # type: ignore[assignment]  # the runtime needs none: numpy kernels,
    import numpy as np  # and the fake TensorRT's numpy executor (zero-copy weights)

    import pyrt
    from pyrt.sim import simulated_gpus
    from pyrt.sim.fake_tensorrt import FakeRuntime

    reads: list[int] = []
    original = FakeRuntime._read_stream

    def spy(self: Any, reader: Any) -> Any:  # records how the engine reached the fake TensorRT
        data = original(self, reader)
        reads.extend(taken for _asked, taken in self.stream_reads)
        return data

    FakeRuntime._read_stream = spy  # type: ignore[method-assign]
    base = _reset()
    with simulated_gpus(1, memory=64 << 30), pyrt.Program(directory / "big.pte", data=directory / "big.ptd",
                                                          kernels="numpy") as prog:
        x = np.ones(4, np.float32)
        first = np.asarray(prog(x, np.array([0]))[0]).tolist()
        last = np.asarray(prog(x, np.array([-1]))[0]).tolist()
    return {"base_mib": base, "first": first, "last": last, "streamed": sum(reads),
            "largest_read": max(reads, default=0)}


def main(argv: list[str]) -> None:
    stage, directory = argv[0], Path(argv[1])
    if stage == "export":
        result = export(directory, int(argv[2]), int(argv[3]))
    elif stage == "inspect":
        result = inspect(directory)
    else:
        result = load(directory)
    result.update(stage=stage, peak_mib=_status("VmHWM"), rss_mib=_status("VmRSS"))
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
