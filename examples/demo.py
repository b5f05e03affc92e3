"""pyrt demo: write a small .pte with ExecuTorch and inspect it with pyrt.

Run: bash scripts/demo.sh   (or .venv/bin/python examples/demo.py [out.pte])
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from executorch.exir import to_edge

import pyrt
from pyrt.report import format_report


class SmallNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "demo.pte")
    example = (torch.randn(2, 8),)
    program = to_edge(torch.export.export(SmallNet().eval(), example)).to_executorch()
    out.write_bytes(program.buffer)
    print(f"wrote {out} ({out.stat().st_size} bytes)\n")
    print(format_report(pyrt.inspect(out)))


if __name__ == "__main__":
    main()
