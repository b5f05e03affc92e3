"""The torch library's numpy path for small static tensors (``pyrt.kernels.small_numpy_fastpath``).

Each numpy step must write what the torch out-variant writes into the same out
tensor: bit for bit where both libraries round correctly (arithmetic, negation,
squares, reciprocal square roots, comparisons, copies), within a few ulps where the
math library, BLAS or summation order differs (tanh, exp, sums, matrix products;
torch's float32 ``sqrt`` is itself not correctly rounded). Where
numpy would compute something else (type promotion, alpha, overlapping outs,
resizing) no numpy step is built and torch runs. In real programs the numpy steps
must see the arena tensors torch steps write, run after run.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from pyrt.kernels import small_numpy_fastpath  # noqa: E402
from pyrt.kernels.small_numpy_fastpath import BUILDERS  # noqa: E402
from pyrt.kernels.small_numpy_fastpath_args import SMALL_NUMEL  # noqa: E402

EXACT = {"add.out", "add.Scalar_out", "sub.out", "sub.Scalar_out", "mul.out", "mul.Scalar_out", "div.out",
         "neg.out", "abs.out", "rsqrt.out", "pow.Tensor_Scalar_out", "logical_not.out",
         "cat.out", "permute_copy.out", "expand_copy.out", "view_copy.out", "alias_copy.out",
         "split_with_sizes_copy.out", "split_copy.Tensor_out",
         *(f"{c}.{k}" for c in ("eq", "ne", "lt", "le", "gt", "ge") for k in ("Scalar_out", "Tensor_out"))}
CLOSE = {"sqrt.out", "tanh.out", "exp.out", "mean.out", "mm.out", "addmm.out", "bmm.out"}


def _torch_op(name: str) -> Any:
    base, overload = name.removeprefix("aten::").split(".")
    return getattr(getattr(torch.ops.aten, base), overload)


def bind(name: str, args: dict[str, Any]) -> Any:
    """The numpy step of aten ``name`` on ``args``, tensors named as the schema types them."""
    tensors = {a.name for a in _torch_op(name)._schema.arguments if str(a.type) in ("Tensor", "List[Tensor]")}
    return small_numpy_fastpath.bind(name, args, tensors)


def _case(name: str, shape: tuple[int, ...], dtype: Any, gen: torch.Generator, scalar: float) -> dict[str, Any]:
    """Arguments (schema names) of one call of ``name``, out included."""
    def rand(*s: int) -> Any:
        return torch.randn(*s, generator=gen, dtype=dtype)

    x = rand(*shape)
    out = torch.empty(shape, dtype=dtype)
    base, overload = name.split(".")
    if base in ("add", "sub", "mul", "div"):
        other = scalar if "Scalar" in overload else rand(*shape[1:])  # broadcast over the first dim
        return {"self": x, "other": other, "out": out} | ({"alpha": 1} if base in ("add", "sub") else {})
    if base in ("eq", "ne", "lt", "le", "gt", "ge"):
        other = float(x.flatten()[0]) if "Scalar" in overload else x.flip(-1).clone()
        return {"self": x, "other": other, "out": torch.empty(shape, dtype=torch.bool)}
    if base == "logical_not":
        return {"self": x > 0, "out": torch.empty(shape, dtype=torch.bool)}
    if base in ("sqrt", "rsqrt"):
        return {"self": x.abs(), "out": out}
    if base == "pow":
        return {"self": x, "exponent": (2, 3, 3.0)[int(torch.randint(3, (), generator=gen))], "out": out}
    if base == "mean":
        return {"self": x, "dim": [-1], "keepdim": True, "dtype": None,
                "out": torch.empty((*shape[:-1], 1), dtype=dtype)}
    if base == "cat":
        return {"tensors": [x, rand(*shape)], "dim": -1, "out": torch.empty((*shape[:-1], 2 * shape[-1]), dtype=dtype)}
    if base == "permute_copy":
        dims = list(range(len(shape)))[::-1]
        return {"self": x, "dims": dims, "out": torch.empty(shape[::-1], dtype=dtype)}
    if base in ("view_copy", "alias_copy"):
        size = [-1] if base == "view_copy" else list(shape)
        out = torch.empty(math.prod(shape) if base == "view_copy" else shape, dtype=dtype)
        return {"self": x, "out": out} | ({"size": size} if base == "view_copy" else {})
    if base in ("split_with_sizes_copy", "split_copy"):
        n = shape[-1]
        sizes = [n // 2, n - n // 2] if base == "split_with_sizes_copy" else [min(2, n - i) for i in range(0, n, 2)]
        outs = [torch.empty((*shape[:-1], k), dtype=dtype) for k in sizes]
        split = {"split_sizes": sizes} if base == "split_with_sizes_copy" else {"split_size": 2}
        return {"self": x, "dim": -1, "out": outs} | split
    if base == "expand_copy":
        x = rand(1, *shape[1:])
        return {"self": x, "size": [2, shape[0], *([-1] * (len(shape) - 1))], "implicit": False,
                "out": torch.empty((2, *shape), dtype=dtype)}
    if base in ("mm", "addmm", "bmm"):
        m, k = shape[-2] if len(shape) > 1 else 1, shape[-1]
        lead = (shape[0],) if base == "bmm" else ()
        a, b = rand(*lead, m, k), rand(*lead, k, 5)
        args = {"self": a, "mat2": b} if base != "addmm" else {"self": rand(5), "mat1": a, "mat2": b,
                                                              "beta": 1, "alpha": 1}
        return args | {"out": torch.empty((*lead, m, 5), dtype=dtype)}
    return {"self": x, "out": out}


def _call_torch(name: str, args: dict[str, Any]) -> Any:
    op = _torch_op(name)
    schema = [a.name for a in op._schema.arguments]
    kw = {a.name for a in op._schema.arguments if a.kwarg_only}
    return op(*[args[n] for n in schema if n not in kw], **{n: args[n] for n in schema if n in kw})


def _fresh(args: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.clone() if hasattr(v, "clone") else [t.clone() for t in v] if isinstance(v, list) and v
                and hasattr(v[0], "clone") else v) for k, v in args.items()}


def _same_bits(got: Any, want: Any) -> bool:
    g, w = got.numpy(), want.numpy()
    if g.dtype == np.bool_:
        return bool(np.array_equal(g, w))
    nan = np.isnan(g)
    return bool(np.array_equal(nan, np.isnan(w)) and np.array_equal(g[~nan].view(np.uint8), w[~nan].view(np.uint8)))


def test_every_builder_is_tested() -> None:
    assert {n.removeprefix("aten::") for n in BUILDERS} == EXACT | CLOSE


@settings(max_examples=60)
@given(name=st.sampled_from(sorted(EXACT | CLOSE)),
       shape=st.lists(st.integers(1, 6), min_size=2, max_size=3).map(tuple),
       dtype=st.sampled_from(["float32", "float64"]),
       seed=st.integers(0, 2**31 - 1),
       scalar=st.one_of(st.integers(-3, 3), st.floats(-10, 10, allow_nan=False, width=32)))
def test_numpy_step_writes_what_torch_writes(name: str, shape: tuple[int, ...], dtype: str, seed: int,
                                             scalar: float) -> None:
    gen = torch.Generator().manual_seed(seed)
    args = _case(name, shape, getattr(torch, dtype), gen, scalar)
    want = _fresh(args)
    _call_torch(name, want)
    got = _fresh(args)
    step = bind(f"aten::{name}", got)
    assert step is not None, f"{name}: no numpy step for an eligible call"
    step()
    if isinstance(want["out"], list):
        assert all(_same_bits(g, w) for g, w in zip(got["out"], want["out"], strict=True)), name
    elif name in EXACT:
        assert _same_bits(got["out"], want["out"]), name
    else:
        torch.testing.assert_close(got["out"], want["out"], rtol=1e-5 if dtype == "float32" else 1e-12, atol=1e-6)
    for k, v in args.items():  # inputs untouched
        if k != "out" and hasattr(v, "shape"):
            assert torch.equal(got[k], v)


@pytest.mark.parametrize("name", ["aten::add.out", "aten::sub.out", "aten::mul.out", "aten::le.Tensor_out",
                                  "aten::eq.Tensor_out"])
@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_integer_tensors_wrap_like_torch(name: str, dtype: str) -> None:
    info = torch.iinfo(getattr(torch, dtype))
    x = torch.tensor([[info.max, info.min, 7, -3]], dtype=getattr(torch, dtype))
    y = torch.tensor([[1], [info.max]], dtype=x.dtype)  # broadcasts to (2, 4)
    out_dtype = torch.bool if name.endswith("Tensor_out") else x.dtype
    args = {"self": x, "other": y, "out": torch.empty(2, 4, dtype=out_dtype)}
    if name in ("aten::add.out", "aten::sub.out"):
        args["alpha"] = 1
    want = _fresh(args)
    _call_torch(name.removeprefix("aten::"), want)
    step = bind(name, args)
    assert step is not None
    step()
    assert torch.equal(args["out"], want["out"])


def test_in_place_calls_are_numpy_steps() -> None:
    x = torch.randn(3, 4)
    want = x * x
    step = bind("aten::mul.out", {"self": x, "other": x, "out": x})
    assert step is not None
    step()
    assert torch.equal(x, want)


def _ineligible() -> dict[str, tuple[str, dict[str, Any]]]:
    f32, f64 = torch.randn(2, 3), torch.randn(2, 3, dtype=torch.float64)
    buf = torch.randn(8)
    return {
        "mixed dtypes": ("aten::add.out", {"self": f32, "other": f64, "alpha": 1, "out": torch.empty(2, 3)}),
        "int tensor by a scalar": ("aten::mul.Scalar_out", {"self": torch.ones(2, 3, dtype=torch.int64),
                                                            "other": 3, "out": torch.empty(2, 3, dtype=torch.int64)}),
        "int true division": ("aten::div.out", {"self": torch.ones(2, 3, dtype=torch.int64),
                                                "other": torch.ones(2, 3, dtype=torch.int64),
                                                "out": torch.empty(2, 3, dtype=torch.int64)}),
        "view of a strided tensor": ("aten::view_copy.out", {"self": f32.t(), "size": [6], "out": torch.empty(6)}),
        "alpha 2": ("aten::add.out", {"self": f32, "other": f32, "alpha": 2, "out": torch.empty(2, 3)}),
        "bool scalar": ("aten::mul.Scalar_out", {"self": f32, "other": True, "out": torch.empty(2, 3)}),
        "scalar past float32": ("aten::mul.Scalar_out", {"self": f32, "other": 1e300, "out": torch.empty(2, 3)}),
        "float64 out of float32 math": ("aten::neg.out", {"self": f32, "out": torch.empty(2, 3, dtype=torch.float64)}),
        "out torch would resize": ("aten::add.out", {"self": f32, "other": f32, "alpha": 1, "out": torch.empty(6)}),
        "partial overlap": ("aten::neg.out", {"self": buf[:6], "out": buf[2:]}),
        "overlapping matmul out": ("aten::mm.out", {"self": buf[:4].view(2, 2), "mat2": torch.randn(2, 2),
                                                    "out": buf[:4].view(2, 2)}),
        "too many elements": ("aten::neg.out", {"self": torch.randn(SMALL_NUMEL + 1),
                                                "out": torch.empty(SMALL_NUMEL + 1)}),
        "autograd": ("aten::neg.out", {"self": torch.randn(3, requires_grad=True), "out": torch.empty(3)}),
        "negative bit": ("aten::neg.out", {"self": torch._neg_view(torch.randn(3)), "out": torch.empty(3)}),
        "exponent 4": ("aten::pow.Tensor_Scalar_out", {"self": f32, "exponent": 4, "out": torch.empty(2, 3)}),
        "cube in place": ("aten::pow.Tensor_Scalar_out", {"self": buf[:3], "exponent": 3, "out": buf[:3]}),
        "mean to another dtype": ("aten::mean.out", {"self": f32, "dim": [1], "keepdim": False,
                                                     "dtype": torch.float64,
                                                     "out": torch.empty(2, dtype=torch.float64)}),
        "mean over a repeated dim": ("aten::mean.out", {"self": f32, "dim": [1, -1], "keepdim": False,
                                                        "dtype": None, "out": torch.empty(2)}),
        "cat with an empty part": ("aten::cat.out", {"tensors": [f32, torch.empty(2, 0)], "dim": 1,
                                                     "out": torch.empty(2, 3)}),
        "addmm beta 0": ("aten::addmm.out", {"self": torch.randn(2), "mat1": torch.randn(2, 2),
                                             "mat2": torch.randn(2, 2), "beta": 0, "alpha": 1,
                                             "out": torch.empty(2, 2)}),
        "expand of a dim that is not 1": ("aten::expand_copy.out", {"self": f32, "size": [4, 3], "implicit": False,
                                                                   "out": torch.empty(4, 3)}),
        "shapes that do not broadcast": ("aten::add.out", {"self": torch.randn(0, 3), "other": torch.randn(0),
                                                           "alpha": 1, "out": torch.empty(0, 3)}),
        "a missing tensor": ("aten::neg.out", {"self": None, "out": torch.empty(3)}),
        "keepdim not a bool": ("aten::mean.out", {"self": f32, "dim": [1], "keepdim": [1], "dtype": None,
                                                  "out": torch.empty(2, 1)}),
        "strided mm out": ("aten::mm.out", {"self": torch.randn(2, 2), "mat2": torch.randn(2, 2),
                                            "out": torch.empty(2, 2).t()}),
    }


@pytest.mark.parametrize("case", sorted(_ineligible()))
def test_torch_runs_where_numpy_would_differ(case: str) -> None:
    name, args = _ineligible()[case]
    assert bind(name, args) is None


# -- in programs -------------------------------------------------------------------------------------


class _Cell(torch.nn.Module):
    """An LSTM over a short sequence and a small head: tiny tensors, elementwise math, addmm, cat."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = torch.nn.LSTM(8, 16, batch_first=True)
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x: Any) -> Any:
        y, _ = self.rnn(x)
        h = y[:, -1]
        return torch.sigmoid(self.head(h * torch.rsqrt(h * h + 1.0) - h.mean(-1, keepdim=True)))


def _export(module: torch.nn.Module, x: Any, path: Path) -> Path:
    from executorch.exir import to_edge

    with torch.no_grad():
        ep = torch.export.export(module.eval(), (x,))
    path.write_bytes(to_edge(ep).to_executorch().buffer)
    return path


def test_programs_mix_numpy_and_torch_steps_on_one_arena(tmp_path: Path) -> None:
    pytest.importorskip("executorch")
    from executorch.runtime import Runtime

    from pyrt.runtime.program import Program

    torch.manual_seed(0)
    model = _Cell().eval()
    x = torch.randn(1, 5, 8)
    path = _export(model, x, tmp_path / "m.pte")
    method = Runtime.get().load_program(str(path)).load_method("forward")
    with Program(path, kernels="torch") as prog:
        steps = [s for chain in prog._runners["forward"]._fast for s in chain]
        small = sum(1 for s in steps if getattr(s, "small", False))
        assert small >= 20 and small < len(steps)  # both libraries run in this program
        for k in range(3):  # the arena is reused run after run
            xi = x + k
            got = prog(xi)
            with torch.no_grad():
                torch.testing.assert_close(got, model(xi), rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(got, method.execute([xi])[0], rtol=1e-5, atol=1e-6)


class _Attend(torch.nn.Module):
    """Attention over a dynamic number of tokens: et_view reshapes, bmm, softmax, small elementwise math."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(8, 24)

    def forward(self, x: Any) -> Any:
        q, k, v = self.qkv(x).split(8, dim=-1)
        w = torch.softmax(q @ k.transpose(-1, -2) * 0.35, dim=-1)
        return (w @ v) * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-5) - x


def _numpy_steady_steps(prog: Any) -> int:
    """Steady steps of ``forward`` now bound to numpy views."""
    steps = prog._runners["forward"]._steady[0]
    return sum(1 for s in steps if (b := getattr(s, "bound", None)) and getattr(b[0], "small", False))


def test_dynamic_steady_runs_bind_numpy_to_each_shape(tmp_path: Path) -> None:
    """Full runs resize on torch; the steady runs that follow bind numpy to the new shapes, every time."""
    pytest.importorskip("executorch")
    from executorch.exir import to_edge

    from pyrt.runtime.program import Program

    torch.manual_seed(0)
    model = _Attend().eval()
    n = torch.export.Dim("n", min=2, max=12)
    with torch.no_grad():
        ep = torch.export.export(model, (torch.randn(1, 5, 8),), dynamic_shapes=({1: n},))
    path = tmp_path / "attend.pte"
    path.write_bytes(to_edge(ep).to_executorch().buffer)
    g = torch.Generator().manual_seed(1)
    with Program(path, kernels="torch") as prog:
        assert prog._runners["forward"]._steady is not None
        seen = []
        for length in (5, 5, 5, 3, 3, 12, 12, 5, 2, 2, 2):
            x = torch.randn(1, length, 8, generator=g)
            got = prog(x)
            with torch.no_grad():
                torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-5)
            seen.append(_numpy_steady_steps(prog))
        # a steady run (the same length again) runs on numpy; a full run (a new length) unbinds
        assert seen[0] == 0 and seen[1] > 0 and seen[3] == 0 and seen[4] == seen[1] and seen[7] == 0


class _Overflow(torch.nn.Module):
    def forward(self, x: Any) -> Any:
        return torch.rsqrt(x * 1e30 * 1e30) - torch.exp(x * 100.0) + x / (x - x)


def test_floating_point_events_stay_silent(tmp_path: Path) -> None:
    """Overflow to inf, division by zero, 0/0 and inf - inf give torch's values, and no warning
    (numpy would warn; under ``-W error`` the run would fail), without touching the caller's numpy state."""
    import warnings

    pytest.importorskip("executorch")
    from pyrt.runtime.program import Program

    model = _Overflow()
    x = torch.tensor([[2.0, 0.0, -3.0, 1e-30]])
    path = _export(model, x, tmp_path / "overflow.pte")
    before = np.geterr()
    with Program(path, kernels="torch") as prog:
        steps = [s for chain in prog._runners["forward"]._fast for s in chain]
        assert sum(1 for s in steps if getattr(s, "small", False)) >= 5
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = prog(x)
    torch.testing.assert_close(got, model(x), equal_nan=True)
    assert np.geterr() == before
