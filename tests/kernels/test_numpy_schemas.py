"""Every numpy kernel registration against its operator's schema, and the portable ops real models use.

The schema comes from torch (``torch.ops.<ns>.<op>.<overload>._schema``): the inputs a
kernel takes must be the schema's arguments minus its out arguments, in order, and
its results must fill exactly the out arguments. A mismatch makes the step read
the wrong value slots (``aten::any.out`` once took 1 input where the schema has 3).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from pyrt.errors import InputError
from pyrt.kernels.numpy_base import OPS
from pyrt.kernels.numpy_library import supported

torch = pytest.importorskip("torch")
aten = torch.ops.aten
rng = np.random.default_rng(1)


def _schema(name: str) -> Any:
    ns, _, rest = name.partition("::")
    base, _, overload = rest.partition(".")
    try:
        return getattr(getattr(getattr(torch.ops, ns), base), overload or "default")._schema
    except (AttributeError, RuntimeError):
        return _executorch_schema(name)


def _executorch_schema(name: str) -> Any:
    """ExecuTorch's quantized_decomposed ops exist in torch only once its Python package is imported: their
    schema as scripts/gen_allowed_ops.py recorded it from there (pyrt/kernels/op_schemas.txt), parsed by torch."""
    from importlib.resources import files

    lines = files("pyrt.kernels").joinpath("op_schemas.txt").read_text().splitlines()
    found = [line.split("\t", 1)[1] for line in lines if line.startswith(name + "\t")]
    return torch._C.parse_schema(found[0]) if name.startswith("quantized_decomposed::") and found else None


def _is_out(arg: Any) -> bool:
    return bool(arg.kwarg_only and arg.alias_info is not None and arg.alias_info.is_write)


@pytest.mark.parametrize("name", supported())
def test_registration_matches_schema(name: str) -> None:
    schema = _schema(name)
    assert schema is not None, f"{name}: no such operator in torch"
    spec = OPS[name]
    ins = [a.name for a in schema.arguments if not _is_out(a)]
    outs = [a.name for a in schema.arguments if _is_out(a)]
    assert (spec.n_in, spec.n_out) == (len(ins), len(outs)), f"{name}: inputs {ins}, outs {outs}"
    assert [_is_out(a) for a in schema.arguments] == [False] * len(ins) + [True] * len(outs), name
    if isinstance(spec.fn, np.ufunc):
        assert spec.fn.nin == len(ins), f"{name}: ufunc {spec.fn.__name__} takes {spec.fn.nin}, schema inputs {ins}"
        return
    params = [p for p in inspect.signature(spec.fn).parameters.values() if not p.name.startswith("_")]
    assert len(params) == len(ins), f"{name}: kernel takes {[p.name for p in params]}, schema inputs {ins}"


def test_portable_ops_models_need_are_registered() -> None:
    for name in ("any.out", "any.dims_out", "any.all_out", "as_strided_copy.out", "native_group_norm.out",
                 "masked_fill.Scalar_out", "scatter.src_out", "index_put.out", "slice_scatter.out",
                 "_native_batch_norm_legit.no_stats_out", "upsample_bilinear2d.vec_out", "topk.values"):
        assert f"aten::{name}" in OPS, name


def r(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _t(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return torch.from_numpy(x)
    if isinstance(x, list):
        return [_t(v) for v in x]
    return x


x4 = r(2, 4, 3, 5)
idx = rng.integers(0, 3, (2, 3)).astype(np.int64)
mask = r(2, 3, 4) > 0
CASES: list[tuple[str, tuple, Callable[..., Any]]] = [
    ("aten::any.out", (mask, 1, True), lambda a, d, k: aten.any.dim(a, d, k)),
    ("aten::any.out", (mask, -1, False), lambda a, d, k: aten.any.dim(a, d, k)),
    ("aten::any.dims_out", (mask, [0, 2], False), lambda a, d, k: aten.any.dims(a, d, k)),
    ("aten::any.all_out", (mask,), aten.any.default),
    ("aten::as_strided_copy.out", (r(4, 6), [3, 2, 2], [6, 1, 2], 2), aten.as_strided_copy.default),
    ("aten::native_group_norm.out", (x4, r(4), r(4), 2, 4, 15, 2, 1e-5), aten.native_group_norm.default),
    ("aten::native_group_norm.out", (x4, None, None, 2, 4, 15, 4, 1e-3), aten.native_group_norm.default),
    ("aten::_native_batch_norm_legit.no_stats_out", (x4, r(4), r(4), True, 0.1, 1e-5),
     aten._native_batch_norm_legit.no_stats),
    ("aten::masked_fill.Scalar_out", (r(2, 3, 4), mask, -1e9), aten.masked_fill.Scalar),
    ("aten::fill.Scalar_out", (r(2, 3), 2.5), aten.fill.Scalar),
    ("aten::erf.out", (r(3, 4),), aten.erf.default),
    ("aten::tril.out", (r(4, 5), 1), aten.tril.default),
    ("aten::floor_divide.out", (r(3, 4), np.float32(0.7)), lambda a, b: aten.floor_divide.default(a, torch.tensor(b))),
    ("aten::elu.out", (r(3, 4), 1.0, 1.0, 1.0), aten.elu.default),
    ("aten::glu.out", (r(3, 4), -1), aten.glu.default),
    ("aten::mean.dtype_out", (r(3, 4), None), lambda a, d: aten.mean.default(a, dtype=d)),
    ("aten::max.unary_out", (r(3, 4),), aten.max.default),
    ("aten::var_mean.correction_out", (r(3, 4), [1], 1, True),
     lambda a, d, c, k: aten.var_mean.correction(a, d, correction=c, keepdim=k)),
    ("aten::topk.values", (r(3, 7), 3, 1, True, True), aten.topk.default),
    ("aten::topk.values", (r(3, 7), 2, 0, False, True), aten.topk.default),
    ("aten::narrow_copy.out", (r(3, 7), 1, 2, 4), aten.narrow_copy.default),
    ("aten::diagonal_copy.out", (r(3, 4, 5), 1, 1, 2), aten.diagonal_copy.default),
    ("aten::roll.out", (r(3, 4), [1, -2], [0, 1]), aten.roll.default),
    ("aten::roll.out", (r(3, 4), [5], []), aten.roll.default),
    ("aten::pixel_shuffle.out", (r(1, 8, 2, 3), 2), aten.pixel_shuffle.default),
    ("aten::pixel_unshuffle.out", (r(1, 2, 4, 6), 2), aten.pixel_unshuffle.default),
    ("aten::reflection_pad1d.out", (r(1, 2, 5), [2, 1]), aten.reflection_pad1d.default),
    ("aten::replication_pad2d.out", (r(1, 2, 3, 4), [1, 2, 0, 1]), aten.replication_pad2d.default),
    ("aten::unfold_copy.out", (r(2, 9), 1, 3, 2), aten.unfold_copy.default),
    ("aten::scatter.src_out", (r(3, 4), 1, idx, r(3, 4)), aten.scatter.src),
    ("aten::scatter.value_out", (r(3, 4), 1, idx, 2.0), aten.scatter.value),
    ("aten::scatter_add.out", (r(3, 4), 0, idx, r(3, 4)), aten.scatter_add.default),
    ("aten::index_put.out", (r(5, 3), [np.array([0, 2, 2])], r(3, 3), True), aten.index_put.default),
    ("aten::index_put.out", (r(5, 3), [np.array([4, 1])], r(2, 3), False), aten.index_put.default),
    ("aten::copy.out", (r(4, 6), r(6), False), aten.copy.default),
    ("aten::copy.out", (np.zeros((2, 3), np.int64), r(1, 3) * 9, False), aten.copy.default),
    ("aten::slice_scatter.out", (r(4, 6), r(4, 2), 1, 1, 5, 2), aten.slice_scatter.default),
    ("aten::select_scatter.out", (r(4, 6), r(6), 0, -1), aten.select_scatter.default),
    ("aten::_adaptive_avg_pool2d.out", (r(1, 2, 7, 5), [3, 2]), aten._adaptive_avg_pool2d.default),
    ("aten::upsample_bilinear2d.vec_out", (r(1, 2, 3, 5), [6, 7], False, None), aten.upsample_bilinear2d.vec),
    ("aten::upsample_bilinear2d.vec_out", (r(1, 2, 3, 5), [4, 9], True, None), aten.upsample_bilinear2d.vec),
    ("aten::upsample_bilinear2d.vec_out", (r(1, 2, 3, 5), None, False, [2.0, 1.5]), aten.upsample_bilinear2d.vec),
    ("aten::logit.out", (np.abs(r(3, 4)) % 1, 1e-6), aten.logit.default),
    ("aten::nonzero.out", (mask,), aten.nonzero.default),
    ("aten::repeat_interleave.Tensor_out", (np.array([2, 0, 3]), None),
     lambda a, n: aten.repeat_interleave.Tensor(a, output_size=n)),
]


@pytest.mark.parametrize("name, args, ref", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_kernel_matches_aten(name: str, args: tuple, ref: Callable[..., Any]) -> None:
    ours = OPS[name].fn(*args)
    want = ref(*(_t(a) for a in args))
    got = list(ours) if OPS[name].n_out > 1 else [ours]
    refs = list(want) if OPS[name].n_out > 1 else [want]
    for a, b in zip(got, refs, strict=True):
        b = b.numpy()
        a = np.asarray(a)
        assert a.shape == b.shape, (name, a.shape, b.shape)
        np.testing.assert_allclose(a.astype(b.dtype), b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("args", [([2, 2], [1, 5], 0), ([2], [1, 1], 0), ([2, 2], [-1, 1], 0), ([2, 2], [6, 1], 1)])
def test_as_strided_out_of_bounds_is_input_error(args: tuple) -> None:
    with pytest.raises(InputError, match="as_strided_copy"):
        OPS["aten::as_strided_copy.out"].fn(np.zeros((2, 3), np.float32), *args)


def test_group_norm_bad_groups_is_input_error() -> None:
    with pytest.raises(InputError, match="native_group_norm"):
        OPS["aten::native_group_norm.out"].fn(x4, None, None, 2, 4, 15, 3, 1e-5)


def test_copy_of_a_src_that_does_not_broadcast_is_input_error() -> None:
    with pytest.raises(InputError, match=r"copy: src of shape \(4,\) does not broadcast to self's shape \(2, 3\)"):
        OPS["aten::copy.out"].fn(np.zeros((2, 3), np.float32), r(4), False)
