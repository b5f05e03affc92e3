"""Load-time constant folding (pyrt.runtime.fold): folded programs compute what eager torch computes.

Each model mixes work on constants (folded at load) with work on inputs, and
each has a trap a wrong folder falls into: a static ``view_copy`` that ExecuTorch
turns into a second tensor over the same arena bytes (moving the viewed constant
result to private memory would leave it stale), and random ops (never folded).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("executorch")

from pyrt.errors import InputError  # noqa: E402
from pyrt.runtime.program import Program  # noqa: E402

KERNELS = ("torch", "numpy")


class Linear(torch.nn.Module):
    """permute_copy of the weight (constant) then mm on the input."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x: Any) -> Any:
        return self.fc(x)


class AliasedConstant(torch.nn.Module):
    """A constant result viewed by a static view_copy: the view is an arena alias, not an instruction."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("w", torch.linspace(-1, 1, 12).reshape(3, 4), persistent=False)

    def forward(self, x: Any) -> Any:
        y = x * 3.0
        c = (self.w * 2.0).reshape(12)  # mul on a constant, then a view of its result
        return y.reshape(12) + c, (y + 1).reshape(4, 3) - c.reshape(4, 3)


class Random(torch.nn.Module):
    def forward(self, x: Any) -> Any:
        return x + torch.rand(3, 4)


def _export(module: torch.nn.Module, x: Any, path: Path) -> Path:
    from executorch.exir import to_edge

    with torch.no_grad():
        ep = torch.export.export(module.eval(), (x,))
    path.write_bytes(to_edge(ep).to_executorch().buffer)
    return path


def _folded(prog: Program) -> list[str]:
    return [ins.what for chain in prog._runners["forward"].plan.chains for ins in chain
            if ins.what.endswith("(folded at load)")]


@pytest.mark.parametrize("kernels", KERNELS)
def test_weight_transpose_folds(tmp_path: Path, kernels: str) -> None:
    torch.manual_seed(0)
    model, x = Linear(), torch.randn(2, 4)
    path = _export(model, x, tmp_path / "linear.pte")
    with Program(path, kernels=kernels) as prog:
        assert any("permute_copy" in w for w in _folded(prog))
        for k in range(3):  # later runs reuse the folded transpose
            xi = x + k
            torch.testing.assert_close(prog(xi), model(xi), rtol=1e-6, atol=1e-6)


def test_fold_false_runs_every_instruction(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model, x = Linear(), torch.randn(2, 4)
    path = _export(model, x, tmp_path / "linear.pte")
    with Program(path, kernels="torch", fold=False) as prog:
        assert not _folded(prog)
        torch.testing.assert_close(prog(x), model(x), rtol=1e-6, atol=1e-6)
    with pytest.raises(InputError, match="fold='yes'"):
        Program(path, fold="yes")


@pytest.mark.parametrize("kernels", KERNELS)
def test_aliased_constant_result_is_not_moved(tmp_path: Path, kernels: str) -> None:
    model, x = AliasedConstant(), torch.randn(3, 4)
    path = _export(model, x, tmp_path / "alias.pte")
    with Program(path, kernels=kernels) as prog:
        for k in range(3):
            got, want = prog(x + k), model(x + k)
            for g, w in zip(got, want, strict=True):
                torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kernels", ["torch"])
def test_random_ops_never_fold(tmp_path: Path, kernels: str) -> None:
    path = _export(Random(), torch.zeros(3, 4), tmp_path / "random.pte")
    with Program(path, kernels=kernels) as prog:
        assert not _folded(prog)
        a, b = prog(torch.zeros(3, 4)), prog(torch.zeros(3, 4))
        assert not torch.equal(a, b)


class FullLike(torch.nn.Module):
    """full_like of a computed tensor reads only its (static) shape: folded, its zeros reused by where."""

    def forward(self, x: Any) -> Any:
        y = x.softmax(-1)
        return torch.where(x > 0, torch.full_like(y, 0.5), y)


def test_full_like_of_a_static_tensor_folds(tmp_path: Path) -> None:
    model, x = FullLike(), torch.randn(3, 4)
    path = _export(model, x, tmp_path / "full_like.pte")
    with Program(path, kernels="torch") as prog:
        assert any("full_like" in w for w in _folded(prog))
        for k in range(3):
            xi = x * (k + 1) - k
            torch.testing.assert_close(prog(xi), model(xi), rtol=1e-6, atol=1e-6)
