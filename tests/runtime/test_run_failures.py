"""A kernel that fails at run time is named by its instruction, whatever steps the load removed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("executorch")

from pyrt.runtime.program import Program  # noqa: E402


class GatherLate(torch.nn.Module):
    """Index out of range in the third kernel call: the run's error names that instruction."""

    def forward(self, x: Any, idx: Any) -> Any:
        y = (x * 2.0).sin()
        return torch.embedding(y, idx) + 1.0


def test_failing_step_names_its_instruction(tmp_path: Path) -> None:
    from executorch.exir import to_edge

    from pyrt.errors import ExecutionError

    x, idx = torch.randn(4, 3), torch.tensor([0, 3])
    with torch.no_grad():
        ep = torch.export.export(GatherLate().eval(), (x, idx))
    path = tmp_path / "m.pte"
    path.write_bytes(to_edge(ep).to_executorch().buffer)
    with Program(path, kernels="torch") as prog:
        chain = prog._runners["forward"].plan.chains[0]
        pc = next(k for k, ins in enumerate(chain) if ins.what.startswith("aten::embedding"))
        torch.testing.assert_close(prog(x, idx), GatherLate()(x, idx))
        with pytest.raises(ExecutionError, match=rf"instruction {pc} \(aten::embedding.out\)"):
            prog(x, torch.tensor([0, 9]))
