"""The .pte is written atomically: a failed or interrupted export leaves the target as it was.

The exports here keep a fallback op (``torch_executed_ops``), so they go through ExecuTorch's
lowering and pyrt's streaming writer, which the tests interrupt; a fully delegated program is
written by pyrt.export._write.direct (tests/export/test_export_direct.py), through the same atomic write.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import pyrt
from pyrt.export import to_pte
from pyrt.export._write import executorch_serializer as _writer
from tests.export.test_export_traps import TwoLinears

OLD = b"previous export, must survive"


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name != "m.pte")


def test_failure_while_lowering_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import executorch.exir

    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("lowering failed")

    monkeypatch.setattr(executorch.exir, "to_edge_transform_and_lower", boom)
    target = tmp_path / "m.pte"
    target.write_bytes(OLD)
    with pytest.raises(RuntimeError, match="lowering failed"):
        to_pte(TwoLinears(), target, (torch.randn(3, 4),), builder="reference", progress=False,
               torch_executed_ops=["aten.sigmoid.default"])
    assert target.read_bytes() == OLD and _leftovers(tmp_path) == []  # spilled engines removed too


@pytest.mark.parametrize("error", [OSError("disk full"), KeyboardInterrupt()])
def test_interrupted_write_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              error: BaseException) -> None:
    real = _writer.write_cord

    def half_then_fail(cord: object, f: object, progress: object) -> None:
        f.write(b"\x00" * 100)
        f.flush()
        raise error

    monkeypatch.setattr(_writer, "write_cord", half_then_fail)
    target = tmp_path / "m.pte"
    target.write_bytes(OLD)
    with pytest.raises(type(error)):
        to_pte(TwoLinears(), target, (torch.randn(3, 4),), builder="reference", progress=False,
               torch_executed_ops=["aten.sigmoid.default"])
    assert target.read_bytes() == OLD and _leftovers(tmp_path) == []
    monkeypatch.setattr(_writer, "write_cord", real)
    to_pte(TwoLinears(), target, (torch.randn(3, 4),), builder="reference", progress=False,
           torch_executed_ops=["aten.sigmoid.default"])
    assert pyrt.inspect(target)["methods"][0]["delegates"][0]["id"] == "TensorRTBackend"


def test_replacing_keeps_the_file_mode(tmp_path: Path) -> None:
    target = tmp_path / "m.pte"
    target.write_bytes(OLD)
    target.chmod(0o640)
    to_pte(TwoLinears(), target, (torch.randn(3, 4),), builder="reference", progress=False)
    assert target.stat().st_mode & 0o777 == 0o640 and target.read_bytes() != OLD


def test_killed_mid_write_never_leaves_a_partial_target(tmp_path: Path) -> None:
    target = tmp_path / "m.pte"
    target.write_bytes(OLD)
    child = textwrap.dedent(f"""
        import sys, time, torch
        sys.path.insert(0, {str(Path(__file__).parents[2])!r})
        from pyrt.export import to_pte
        from pyrt.export._write import executorch_serializer as _writer
        from tests.export.test_export_traps import TwoLinears

        def stall(cord, f, progress):
            f.write(b"\\x00" * 4096)
            f.flush()
            print("writing", flush=True)
            time.sleep(60)

        _writer.write_cord = stall
        to_pte(TwoLinears(), {str(target)!r}, (torch.randn(3, 4),), builder="reference", progress=False,
               torch_executed_ops=["aten.sigmoid.default"])
    """)
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "writing"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert target.read_bytes() == OLD
    partial = [p for p in tmp_path.iterdir() if p.name.endswith(".pte.tmp")]
    assert len(partial) == 1 and partial[0].stat().st_size >= 4096  # the partial data went elsewhere


class ZeroWeight(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(4 << 20), requires_grad=False)  # 16 MiB of zeros

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.w[:4]


def test_zero_runs_are_written_as_holes(tmp_path: Path) -> None:
    """The engine's 16 MiB of zeros costs no disk: the spill file and the .pte leave it as a hole."""
    from pyrt.format.trt_blob import parse_blob
    from pyrt.pte_reader import PteFile
    from pyrt.sim.refengine import RefEngine

    target = tmp_path / "zeros.pte"
    to_pte(ZeroWeight(), target, (torch.randn(4),), builder="reference", progress=False)
    st = target.stat()
    assert st.st_size > 16 << 20 and st.st_blocks * 512 < 4 << 20
    with PteFile.open(target) as pte:
        plan = pte.program.execution_plan[0]
        blob = parse_blob(pte.program.delegate_data(plan.delegates[0]))
        (weight,) = RefEngine.from_bytes(blob.engine).weights.values()
        assert weight.nbytes == 16 << 20 and not any(weight.data[::4096]) and bytes(weight.data[-8:]) == bytes(8)
        del weight, blob, plan
