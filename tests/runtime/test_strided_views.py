"""Strided views (pyrt.runtime.fold): a ``*_copy`` call bound as a strided view of its input, and where it must not be.

A view whose strides differ from the planned contiguous result is only safe when
every reader takes strided tensors by value (torch out-variants, copies) and the
input's bytes outlive the last read. Each trap below computes a wrong answer, or
hands back a tensor of the wrong layout, if one of those conditions is dropped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("executorch")

from pyrt.runtime.program import Program  # noqa: E402


class PermuteThenMath(torch.nn.Module):
    """permute_copy read only by mul and add: bound as a strided view."""

    def forward(self, x: Any) -> Any:
        return (x * 2.0).permute(1, 0) * 3.0 + 1.0


class SplitThenMath(torch.nn.Module):
    """split_with_sizes_copy along the last dim (strided pieces), read by elementwise kernels."""

    def forward(self, x: Any) -> Any:
        a, b = (x + 1.0).split([1, 3], dim=1)
        return a.sigmoid() * b.tanh()


class CatOfOne(torch.nn.Module):
    """cat of a one-tensor list (a KV cache with nothing cached): a view of that tensor."""

    def forward(self, x: Any) -> Any:
        k = torch.cat([(x * 2.0).permute(1, 0)], dim=0)
        return k * 3.0 + (x * 5.0).permute(1, 0)


class PermuteOutput(torch.nn.Module):
    """The permuted tensor is a method output: outputs stay contiguous planned tensors."""

    def forward(self, x: Any) -> Any:
        return (x * 2.0).permute(1, 0)


class PermuteThenAsStrided(torch.nn.Module):
    """as_strided_copy reads storage by strides: a strided view would change what it reads."""

    def forward(self, x: Any) -> Any:
        y = (x * 2.0).permute(1, 0)
        return torch.as_strided(y, (2, 2), (1, 1)) + 0.0


class PermuteOfReusedBytes(torch.nn.Module):
    """The permuted tensor's bytes are free for reuse after the permute; its view is read much later."""

    def forward(self, x: Any) -> Any:
        p = (x + 1.0).permute(1, 0)
        a = (x * 3.0).sin()
        b = (a * a).cos()
        c = (b + a).exp()
        return p * c.permute(1, 0) + b.sum()


class CloneThenReshape(torch.nn.Module):
    """A static view_copy of a clone's result: an arena alias, no instruction, that must follow the view."""

    def forward(self, x: Any) -> Any:
        y = (x * 2.0).permute(1, 0, 2).sin()
        return y.reshape(3, 8) * 3.0 + 1.0


class CloneThenReshapeLater(torch.nn.Module):
    """The alias of a clone's result is read after the cloned tensor's bytes were reused."""

    def forward(self, x: Any) -> Any:
        y = (x * 2.0).permute(1, 0, 2).sin()
        z = y.reshape(3, 8)
        a = (x * 3.0).cos()
        b = (a * a).exp()
        c = (b + a).tanh()
        return z * c.reshape(3, 8) + 1.0


class PermuteThenReshape(torch.nn.Module):
    """The clone ExecuTorch puts before reshaping a permuted tensor: its alias is no view of a strided view."""

    def forward(self, x: Any) -> Any:
        p = (x * 2.0).permute(1, 0, 2)
        return p.reshape(3, 8) * 3.0 + 1.0


class PermuteThenReshapeOutput(torch.nn.Module):
    """The alias of the permuted tensor is the method's output."""

    def forward(self, x: Any) -> Any:
        return (x * 2.0).permute(1, 0, 2).reshape(3, 8)


class PermuteThenReshapeAsStrided(torch.nn.Module):
    """The alias of the permuted tensor is read by as_strided_copy."""

    def forward(self, x: Any) -> Any:
        r = (x * 2.0).permute(1, 0, 2).reshape(3, 8)
        return torch.as_strided(r, (2, 2), (1, 1)) + 0.0


def _export(module: torch.nn.Module, x: Any, path: Path) -> Path:
    from executorch.exir import to_edge

    with torch.no_grad():
        ep = torch.export.export(module.eval(), (x,))
    path.write_bytes(to_edge(ep).to_executorch().buffer)
    return path


def _views(prog: Program, op: str) -> int:
    """How many ``op`` calls became no-ops at load (views or folds)."""
    return sum(1 for ins in prog._runners["forward"].plan.chains[0]
               if ins.what.startswith(op) and ins.what.endswith("(folded at load)"))


def _check(prog: Program, model: torch.nn.Module, x: Any) -> None:
    for k in range(3):  # the arena is reused run after run
        xi = x + k
        got, want = prog(xi), model(xi)
        assert got.is_contiguous()
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("model", "op"), [(PermuteThenMath(), "aten::permute_copy"),
                                           (SplitThenMath(), "aten::split_with_sizes_copy"),
                                           (CatOfOne(), "aten::cat")])
def test_strided_view_feeds_torch_kernels(tmp_path: Path, model: torch.nn.Module, op: str) -> None:
    x = torch.randn(3, 4)
    with Program(_export(model, x, tmp_path / "m.pte"), kernels="torch") as prog:
        assert _views(prog, op) == 1
        _check(prog, model, x)
    with Program(tmp_path / "m.pte", kernels="numpy") as prog:  # numpy hosts never bind views
        assert _views(prog, op) == 0
        _check(prog, model, x)


def test_strided_view_never_an_output(tmp_path: Path) -> None:
    model, x = PermuteOutput(), torch.randn(3, 4)
    with Program(_export(model, x, tmp_path / "m.pte"), kernels="torch") as prog:
        assert _views(prog, "aten::permute_copy") == 0
        _check(prog, model, x)
        assert prog(x).stride() == (3, 1)


def test_strided_view_never_read_by_a_byte_view(tmp_path: Path) -> None:
    from executorch.runtime import Runtime

    x = torch.arange(12.0).reshape(3, 4)
    path = _export(PermuteThenAsStrided(), x, tmp_path / "m.pte")  # eager torch reads x's storage: not the reference
    method = Runtime.get().load_program(path).load_method("forward")
    with Program(path, kernels="torch") as prog:
        assert _views(prog, "aten::permute_copy") == 0
        for k in range(3):
            torch.testing.assert_close(prog(x + k), method.execute([x + k])[0], rtol=0, atol=0)


def test_strided_view_of_reused_bytes(tmp_path: Path) -> None:
    model, x = PermuteOfReusedBytes(), torch.randn(3, 4)
    with Program(_export(model, x, tmp_path / "m.pte"), kernels="torch") as prog:
        _check(prog, model, x)


@pytest.mark.parametrize("model", [CloneThenReshape(), CloneThenReshapeLater()])
def test_alias_follows_its_view(tmp_path: Path, model: torch.nn.Module) -> None:
    x = torch.randn(2, 3, 4)
    with Program(_export(model, x, tmp_path / "m.pte"), kernels="torch") as prog:
        assert _views(prog, "dim_order_ops::_clone_dim_order") == 1
        _check(prog, model, x)


def test_alias_of_a_strided_view_keeps_its_copy(tmp_path: Path) -> None:
    model, x = PermuteThenReshape(), torch.randn(2, 3, 4)
    with Program(_export(model, x, tmp_path / "m.pte"), kernels="torch") as prog:
        assert _views(prog, "aten::permute_copy") == 1
        assert _views(prog, "dim_order_ops::_clone_dim_order") == 0
        _check(prog, model, x)


@pytest.mark.parametrize("model", [PermuteThenReshapeOutput(), PermuteThenReshapeAsStrided()])
def test_reshaped_views_match_executorch(tmp_path: Path, model: torch.nn.Module) -> None:
    from executorch.runtime import Runtime

    x = torch.arange(24.0).reshape(2, 3, 4)
    path = _export(model, x, tmp_path / "m.pte")
    method = Runtime.get().load_program(path).load_method("forward")
    with Program(path, kernels="torch") as prog:
        for k in range(3):
            got = prog(x + k)
            assert got.is_contiguous()
            torch.testing.assert_close(got, method.execute([x + k])[0], rtol=0, atol=0)

