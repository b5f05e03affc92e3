"""Faster entry points of torch out-variants (``TorchLibrary._bindings``) write what ``torch.ops`` writes.

Operators whose Python binding has no ``out=`` go through the functional binding
and a copy into the outs; ``full_like.out`` through ``out.fill_``. Each must give
the bytes of the ``torch.ops`` call, and step aside (TypeError, nothing written)
where it does not apply, so the next entry point runs.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from pyrt.kernels.torch_kernels import TorchLibrary  # noqa: E402
from pyrt.pte_reader import Operator  # noqa: E402


def _impls(qualified: str) -> tuple[Any, list[Any]]:
    name, _, overload = qualified.partition("[")[0].partition(".")
    op = Operator(name, overload)
    lib = TorchLibrary()
    packet = getattr(torch.ops.aten, name.partition("::")[2])
    schema = getattr(packet, overload)._schema
    return getattr(packet, overload), lib._bindings(op, schema)


def _run(fn: Any, args: tuple, outs: dict[str, Any]) -> list[Any]:
    fresh = {k: torch.full_like(v, 7.0) if v.is_floating_point() else torch.zeros_like(v) for k, v in outs.items()}
    last: Exception | None = None
    try:
        fn(*args, **fresh)
    except TypeError as exc:  # this entry point does not apply
        last = exc
    return [None] if last is not None else list(fresh.values())


CASES = {
    "aten::native_layer_norm.out": lambda: (
        (torch.randn(2, 5, 8), [8], torch.randn(8), torch.randn(8), 1e-5),
        {"out0": torch.empty(2, 5, 8), "out1": torch.empty(2, 5, 1), "out2": torch.empty(2, 5, 1)}),
    "aten::embedding.out": lambda: (
        (torch.randn(11, 4), torch.tensor([[1, 3, 10], [0, 0, 2]]), -1, False, False),
        {"out": torch.empty(2, 3, 4)}),
    "aten::convolution.out": lambda: (
        (torch.randn(1, 2, 9), torch.randn(3, 2, 3), torch.randn(3), [2], [1], [1], False, [0], 1),
        {"out": torch.empty(1, 3, 5)}),
    "aten::full_like.out": lambda: (
        (torch.randn(2, 3), -0.1), {"out": torch.empty(2, 3)}),
    "aten::gelu.out": lambda: ((torch.randn(4, 6),), {"out": torch.empty(4, 6)}),
    # copy.out: src broadcast to self's shape, converted to self's dtype; self a view into a larger storage
    "aten::copy.out": lambda: ((torch.zeros(64)[8:14].view(2, 3), torch.randn(3), False), {"out": torch.empty(2, 3)}),
    "aten::copy.out[int]": lambda: ((torch.zeros(100, dtype=torch.int64)[5], torch.tensor(41.7), False),
                                    {"out": torch.empty((), dtype=torch.int64)}),
    # the *_scatter ops: self a view into a larger storage (an arena), as pyrt's planned tensors are
    "aten::slice_scatter.out": lambda: ((torch.randn(100)[10:34].view(4, 6), torch.randn(4, 2), 1, 1, 5, 2),
                                        {"out": torch.empty(4, 6)}),
    "aten::slice_scatter.out[defaults]": lambda: ((torch.randn(100)[10:34].view(4, 6), torch.randn(4, 6)),
                                                  {"out": torch.empty(4, 6)}),
    "aten::slice_scatter.out[negative]": lambda: ((torch.randn(4, 6), torch.randn(1, 6), 0, -1, None, 1),
                                                  {"out": torch.empty(4, 6)}),
    "aten::select_scatter.out": lambda: ((torch.randn(50)[3:27].view(2, 3, 4), torch.randn(2, 4), 1, -1),
                                         {"out": torch.empty(2, 3, 4)}),
    "aten::index_put.out": lambda: ((torch.randn(200)[8:104].view(1, 2, 6, 8), [None, None, torch.tensor([4])],
                                     torch.randn(1, 2, 1, 8), False), {"out": torch.empty(1, 2, 6, 8)}),
    "aten::index_put.out[accumulate]": lambda: ((torch.randn(5, 3), [torch.tensor([0, 2, 2])], torch.randn(3, 3),
                                                 True), {"out": torch.empty(5, 3)}),
    "aten::diagonal_scatter.out": lambda: ((torch.randn(64)[1:21].view(4, 5), torch.randn(4), 1, 0, 1),
                                           {"out": torch.empty(4, 5)}),
}


@pytest.mark.parametrize("qualified", sorted(CASES))
def test_fast_entry_points_write_the_bytes_of_torch_ops(qualified: str) -> None:
    torch.manual_seed(0)
    overload, impls = _impls(qualified)
    assert impls, f"{qualified}: no faster entry point"
    args, outs = CASES[qualified]()
    want = _run(overload, args, outs)
    used = 0
    for impl in impls:
        got = _run(impl, args, outs)
        if got == [None]:
            continue
        used += 1
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape
            assert torch.equal(g, w), qualified
    assert used, f"{qualified}: every faster entry point stepped aside"


def test_functional_entry_point_steps_aside_on_dtype_mismatch() -> None:
    """A float64 out for a float32 result: TypeError before anything is written (torch.ops then decides)."""
    _, impls = _impls("aten::native_layer_norm.out")
    functional = impls[-1]
    outs = {"out0": torch.zeros(2, 8, dtype=torch.float64), "out1": torch.zeros(2, 1), "out2": torch.zeros(2, 1)}
    with pytest.raises(TypeError):
        functional(torch.randn(2, 8), [8], None, None, 1e-5, **outs)
    assert all(not v.any() for v in outs.values())


def test_fill_like_steps_aside_when_out_differs() -> None:
    _, impls = _impls("aten::full_like.out")
    out = torch.zeros(2, 3, dtype=torch.int64)
    with pytest.raises(TypeError):
        impls[0](torch.randn(2, 3), 1.5, out=out)
    assert not out.any()


def test_copy_steps_aside_when_out_differs() -> None:
    """An out of another dtype or shape than self: torch.ops decides (it resizes or refuses), nothing written."""
    _, impls = _impls("aten::copy.out")
    for out in (torch.zeros(2, 3, dtype=torch.int64), torch.zeros(3, 2)):
        with pytest.raises(TypeError):
            impls[0](torch.zeros(2, 3), torch.ones(3), False, out=out)
        assert not out.any()


@pytest.mark.parametrize("qualified, args", [
    ("aten::slice_scatter.out", (torch.zeros(4, 6), torch.ones(4, 3), 1, 0, 2, 1)),
    ("aten::select_scatter.out", (torch.zeros(4, 6), torch.ones(4), 0, 1)),
    ("aten::diagonal_scatter.out", (torch.zeros(4, 6), torch.ones(5), 0, 0, 1)),
])
def test_scatters_step_aside_when_src_is_not_the_slices_shape(qualified: str, args: tuple) -> None:
    """torch.ops then raises ATen's own error; the out is left as it was."""
    overload, impls = _impls(qualified)
    out = torch.zeros(4, 6)
    with pytest.raises(TypeError):
        impls[0](*args, out=out)
    assert not out.any()
    with pytest.raises(RuntimeError):
        overload(*args, out=out)


class LayerNormStats(torch.nn.Module):
    """native_layer_norm with its mean and rstd outs read: as an output, and through a static view_copy."""

    def forward(self, x: Any) -> Any:
        out, mean, rstd = torch.ops.aten.native_layer_norm(x, [6], None, None, 1e-5)
        return out * 2.0, mean, rstd.reshape(-1) * 3.0


class LayerNormOnly(torch.nn.Module):
    """nn.LayerNorm: ExecuTorch's native_layer_norm writes mean and rstd, which nothing reads."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(6)

    def forward(self, x: Any) -> Any:
        return self.norm(x) + 1.0


@pytest.mark.parametrize("model", [LayerNormStats(), LayerNormOnly()])
def test_unread_outs_are_skipped_and_read_ones_written(tmp_path: Any, model: torch.nn.Module) -> None:
    """Outs nothing reads may stay unwritten (``KernelSite.unread``); outputs and aliased outs never."""
    from executorch.exir import to_edge

    from pyrt.runtime.program import Program

    x = torch.randn(4, 6)
    with torch.no_grad():
        ep = torch.export.export(model.eval(), (x,))
    path = tmp_path / "ln.pte"
    path.write_bytes(to_edge(ep).to_executorch().buffer)
    with Program(path, kernels="torch") as prog:
        for k in range(3):
            got, want = prog(x + k), model(x + k)
            for g, w in zip(got if isinstance(got, (list, tuple)) else [got],
                            want if isinstance(want, tuple) else [want], strict=True):
                torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)


class Alphas(torch.nn.Module):
    """add/sub/addmm with default and non-default alpha and beta (defaults are left out of the call)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("b", torch.randn(5), persistent=False)
        self.register_buffer("w", torch.randn(3, 5), persistent=False)

    def forward(self, x: Any, y: Any) -> Any:
        a = torch.add(x, y) + torch.add(x, y, alpha=2) - torch.sub(x, y, alpha=0.5)
        return torch.addmm(self.b, a, self.w), torch.addmm(self.b, a, self.w, beta=3, alpha=-1)


def test_default_arguments_left_out_only_when_exactly_default(tmp_path: Any) -> None:
    from executorch.exir import to_edge

    from pyrt.kernels.torch_kernels import _is_default
    from pyrt.runtime.program import Program

    assert _is_default(1, 1) and _is_default(None, None) and _is_default("none", "none")
    assert not _is_default(1.0, 1) and not _is_default(True, 1) and not _is_default(2, 1)
    x, y = torch.randn(4, 3), torch.randn(4, 3)
    with torch.no_grad():
        ep = torch.export.export(Alphas().eval(), (x, y))
    path = tmp_path / "alphas.pte"
    path.write_bytes(to_edge(ep).to_executorch().buffer)
    with Program(path, kernels="torch") as prog:
        got = prog(x, y)
    want = ep.module()(x, y)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
