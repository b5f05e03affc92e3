"""``to_pte(..., external_weights=True)``: the weights ExecuTorch runs go to a .ptd beside the .pte.

Both directions against ExecuTorch 1.5.1: pyrt's .pte + .ptd load and run in ExecuTorch's
runtime with ``data_path``, and both of pyrt's writers give byte-identical files.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import pyrt
from pyrt.errors import ExportError
from pyrt.export import to_pte
from pyrt.export._write import executorch_serializer as _writer
from pyrt.sim import simulated_gpus

OLD = b"previous export, must survive"


class Lookup(nn.Module):
    """A linear (an engine) and an embedding-style table read by a fallback op (external weights)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.table = nn.Parameter(torch.randn(10, 3), requires_grad=False)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 3), requires_grad=False)

    def forward(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.lin(x)) + self.table[idx] * self.scale


FALLBACK = ["aten.sigmoid.default", "aten.index.Tensor", "aten.mul.Tensor"]


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    return torch.randn(2, 4), torch.tensor([1, 7])


@pytest.fixture(scope="module")
def model() -> Lookup:
    torch.manual_seed(0)
    return Lookup().eval()


@pytest.fixture(scope="module")
def exported(model: Lookup, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = {}
    for writer in ("pyrt", "executorch"):
        path = tmp_path_factory.mktemp(writer) / "lookup.pte"
        out[writer] = to_pte(model, path, inputs(), builder="reference", external_weights=True,
                             torch_executed_ops=FALLBACK, writer=writer, progress=False)
    return out


def test_the_ptd_lands_beside_the_pte_and_runs(model: Lookup, exported: dict) -> None:
    summary = exported["pyrt"]
    assert summary.data_path == str(Path(summary.path).with_suffix(".ptd")) and summary.data_size > 0
    assert "external weights:" in str(summary)
    info = pyrt.inspect(summary.path, data=summary.data_path)
    external = {t["key"]: t["file"] for t in info["methods"][0]["tensors"] if t["location"] == "external"}
    assert external == {"table": summary.data_path, "scale": summary.data_path}
    with pytest.raises(pyrt.PteFormatError, match="no data file was given"):
        pyrt.Program(summary.path)
    with simulated_gpus(1), pyrt.Program(summary.path, data=summary.data_path) as prog:
        got = prog.run(*inputs())
    with torch.no_grad():
        np.testing.assert_allclose(np.asarray(got[0] if isinstance(got, (list, tuple)) else got),
                                   model(*inputs()).numpy(), rtol=1e-6, atol=1e-6)


def test_both_writers_write_the_same_files(exported: dict) -> None:
    ours, theirs = exported["pyrt"], exported["executorch"]
    assert Path(ours.path).read_bytes() == Path(theirs.path).read_bytes()
    assert Path(ours.data_path).read_bytes() == Path(theirs.data_path).read_bytes()


def test_the_emitter_never_copies_external_weights(model: Lookup, tmp_path: Path, monkeypatch) -> None:
    """ExecuTorch's emitter copies each constant into bytes (``_save_new_const_tensor``); pyrt's writer
    has it record the external ones by reference, so none of them is copied."""
    from executorch.exir.emit._emitter import _Emitter
    from executorch.exir.schema import TensorDataLocation

    copied: list[str] = []
    real = _Emitter._save_new_const_tensor

    def spy(self, spec, buffer_data, *args, **kwargs):
        info = spec.extra_tensor_info
        if info is not None and info.location == TensorDataLocation.EXTERNAL:
            copied.append(info.fully_qualified_name)
        return real(self, spec, buffer_data, *args, **kwargs)

    monkeypatch.setattr(_Emitter, "_save_new_const_tensor", spy)
    summary = to_pte(model, tmp_path / "m.pte", inputs(), builder="reference", external_weights=True,
                     torch_executed_ops=FALLBACK, progress=False)
    assert copied == [] and summary.data_size > 0
    assert _Emitter._tensor_spec_to_evalue.__name__ == "_tensor_spec_to_evalue", "the patch is undone"


class AllFallback(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 3), requires_grad=False)
        self.b = nn.Parameter(torch.randn(3), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(x @ self.w) + self.b


def test_pyrt_files_load_in_executorch_with_data_path(tmp_path: Path) -> None:
    from executorch.runtime import Runtime

    torch.manual_seed(0)
    model = AllFallback().eval()
    x = torch.randn(2, 4)
    summary = to_pte(model, tmp_path / "plain.pte", (x,), builder="reference", external_weights=True,
                     torch_executed_ops=["aten.sigmoid.default", "aten.matmul.default", "aten.mm.default",
                                         "aten.add.Tensor"],
                     progress=False)
    assert summary.engines == () and summary.data_path is not None
    (want,) = Runtime.get().load_program(summary.path, data_path=summary.data_path).load_method(
        "forward").execute([x])
    with pyrt.Program(summary.path, data=summary.data_path) as prog:
        got = prog(x)
    with torch.no_grad():
        eager = model(x).numpy()
    np.testing.assert_allclose(want.numpy(), eager, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(got[0] if isinstance(got, (list, tuple)) else got), want.numpy(),
                               rtol=1e-6, atol=1e-6)


def test_a_failed_write_changes_neither_file(model: Lookup, tmp_path: Path, monkeypatch) -> None:
    target, data = tmp_path / "m.pte", tmp_path / "m.ptd"
    target.write_bytes(OLD)
    data.write_bytes(OLD)
    real = _writer.write_cord
    calls = []

    def fail_on_second(cord, f, progress):
        calls.append(1)
        if len(calls) == 2:  # the .ptd is complete, the .pte fails half-way
            f.write(b"\x01" * 100)
            raise OSError("disk full")
        return real(cord, f, progress)

    monkeypatch.setattr(_writer, "write_cord", fail_on_second)
    with pytest.raises(OSError, match="disk full"):
        to_pte(model, target, inputs(), builder="reference", external_weights=True, torch_executed_ops=FALLBACK,
               progress=False)
    assert target.read_bytes() == OLD and data.read_bytes() == OLD
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.ptd", "m.pte"]  # no temp file left


def test_no_weights_outside_engines_writes_no_ptd(tmp_path: Path) -> None:
    summary = to_pte(nn.Linear(4, 2).eval(), tmp_path / "lin.pte", (torch.randn(3, 4),), builder="reference",
                     external_weights=True, progress=False)
    assert summary.data_path is None and not (tmp_path / "lin.ptd").exists()
    with pytest.raises(ExportError, match="external_weights='yes' must be a bool"):
        to_pte(nn.Linear(4, 2), tmp_path / "x.pte", (torch.randn(3, 4),), external_weights="yes")
