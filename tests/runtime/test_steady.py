"""Dynamic-shape runs that repeat the last run's shapes take the steady chain (pyrt.runtime.steady).

Every run is compared with eager torch, in orders that switch between the steady
chain and the full one (same shapes, new shapes, back again), and a program with a
data-dependent output shape (nonzero) must never take the steady chain: same
input shapes, different data, different output shapes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("executorch")

from pyrt.runtime.program import Program  # noqa: E402


class Positions(torch.nn.Module):
    """Shape work (sym_size, views) plus data derived from the shape alone (arange, a mask)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(-1, 1, 8).reshape(2, 4))

    def forward(self, x: Any) -> Any:
        n = x.shape[0]
        pos = torch.arange(n, dtype=torch.float32).unsqueeze(1)  # follows from the shape: per-key data
        mask = torch.ones(n, n).tril()
        y = (x + pos) @ self.w.t()
        return mask @ y, y.reshape(-1)


class Selected(torch.nn.Module):
    def forward(self, x: Any) -> Any:
        return torch.nonzero(x > 0) * 2


def _export(module: torch.nn.Module, x: Any, path: Path) -> Path:
    from executorch.exir import to_edge

    dim = torch.export.Dim("n", min=1, max=12)
    with torch.no_grad():
        ep = torch.export.export(module.eval(), (x,), dynamic_shapes=(({0: dim},)))
    path.write_bytes(to_edge(ep).to_executorch().buffer)
    return path


def test_steady_runs_match_eager(tmp_path: Path) -> None:
    model = Positions()
    path = _export(model, torch.randn(5, 4), tmp_path / "positions.pte")
    g = torch.Generator().manual_seed(0)
    with Program(path, kernels="torch") as prog:
        runner = prog._runners["forward"]
        assert runner._steady is not None and len(runner._steady[0]) < len(runner._fast[0])
        for n in (5, 5, 5, 3, 3, 12, 5, 5, 1, 1):
            x = torch.randn(n, 4, generator=g)
            for got, want in zip(prog(x), model(x), strict=True):
                assert got.shape == want.shape
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_data_dependent_shapes_never_steady(tmp_path: Path) -> None:
    path = _export(Selected(), torch.randn(6), tmp_path / "selected.pte")
    with Program(path, kernels="torch") as prog:
        assert prog._runners["forward"]._steady is None
        for x in (torch.tensor([1.0, -1, 2, -2, 3, -3]), torch.tensor([1.0, 1, 1, 1, 1, -1]),
                  torch.tensor([-1.0, -1, -1, -1, -1, -1]), torch.tensor([-1.0, 1, 1, 1, 1, 1])):
            torch.testing.assert_close(prog(x), torch.nonzero(x > 0) * 2)


class Heads(torch.nn.Module):
    """Attention-style shape work on a dynamic dim that export specializes: only the input stays
    dynamic (ExecuTorch's runtime, too, refuses any other length), every later tensor is static."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(8, 24)

    def forward(self, x: Any) -> Any:
        q, k, v = self.qkv(x).split(8, dim=-1)
        q = q.reshape(x.shape[0], 2, 4).transpose(0, 1)
        k = k.reshape(x.shape[0], 2, 4).permute(1, 2, 0)
        v = v.reshape(x.shape[0], 2, 4).transpose(0, 1)
        att = torch.softmax(q @ k * 0.5, dim=-1)
        out = (att @ v).transpose(0, 1).reshape(x.shape[0], 8)
        return out + x.unsqueeze(0).expand(2, -1, -1).sum(0), q.sum()


def test_static_results_of_a_dynamic_input_stay_copies(tmp_path: Path) -> None:
    """A ``*_copy`` of the dynamic input whose result is static is no shape view: static calls later
    bind load-time views of that result, which would keep reading its old bytes."""
    torch.manual_seed(0)
    model = Heads().eval()
    path = _export(model, torch.randn(5, 8), tmp_path / "heads.pte")
    g = torch.Generator().manual_seed(1)
    with Program(path, kernels="torch") as prog:
        for _ in range(3):
            x = torch.randn(5, 8, generator=g)
            with torch.no_grad():
                want = model(x)
            for a, b in zip(prog(x), want, strict=True):
                torch.testing.assert_close(a, b)


class Learned(torch.nn.Module):
    """GPT-2's position path: arange(n) + offset, unsqueezed, through a learned embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.pos = torch.nn.Embedding(16, 4)

    def forward(self, x: Any) -> Any:
        positions = (torch.arange(x.shape[0]) + 2).unsqueeze(0)
        return x + self.pos(positions)[0]


def test_calls_on_shape_derived_data_are_skipped_by_steady_runs(tmp_path: Path) -> None:
    """arange, the add of a constant, the view of the sum and the embedding it indexes all follow from
    the input shape: steady runs skip every one of them (the add too, though small tensors run on numpy)."""
    model = Learned()
    path = _export(model, torch.randn(5, 4), tmp_path / "learned.pte")
    g = torch.Generator().manual_seed(0)
    with Program(path, kernels="torch") as prog:
        runner = prog._runners["forward"]
        chain = runner.plan.chains[0]
        kept = {chain[pc].what.partition(".")[0] for pc in runner._steady[1]}
        assert "aten::embedding" not in kept and "aten::arange" not in kept, kept
        assert sum(1 for pc in runner._steady[1] if chain[pc].what.startswith("aten::add")) == 1  # x + pos only
        assert sum(1 for pc in runner._steady[1] if chain[pc].what.startswith("aten::add")) == 1  # x + ...
        for n in (5, 5, 3, 3, 12, 12, 5):
            x = torch.randn(n, 4, generator=g)
            with torch.no_grad():
                torch.testing.assert_close(prog(x), model(x), rtol=0, atol=0)
