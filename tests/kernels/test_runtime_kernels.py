"""The numpy core kernel set against torch's ATen kernels, op by op, on awkward arguments."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pyrt.errors import InputError, UnsupportedOperatorError
from pyrt.kernels.numpy_base import OPS
from pyrt.kernels.numpy_library import supported
from pyrt.kernels.registry import choose_library

torch = pytest.importorskip("torch")
aten = torch.ops.aten
rng = np.random.default_rng(0)


def r(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def t(x: Any) -> Any:
    return torch.from_numpy(x) if isinstance(x, np.ndarray) else x


def check(name: str, args: tuple, ref: Any, n_out: int = 1) -> None:
    ours = OPS[name].fn(*args)
    refs = list(ref) if n_out > 1 else [ref]
    got = list(ours) if n_out > 1 else [ours]
    for a, b in zip(got, refs, strict=True):
        b = b.numpy()
        a = np.asarray(a).astype(b.dtype)
        assert a.shape == b.shape, (name, a.shape, b.shape)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("stride, padding, dilation, groups", [
    ([1, 1], [0, 0], [1, 1], 1), ([2, 1], [1, 2], [1, 1], 1), ([1, 2], [2, 1], [2, 1], 2), ([3, 3], [0, 1], [1, 2], 4),
])
def test_conv2d(stride: list, padding: list, dilation: list, groups: int) -> None:
    x, w, b = r(2, 4, 9, 8), r(6 if groups != 4 else 8, 4 // groups, 3, 2), None
    b = r(w.shape[0])
    args = (x, w, b, stride, padding, dilation, False, [0, 0], groups)
    check("aten::convolution.out", args, aten.convolution(*(t(a) for a in args)))


def test_conv1d_without_bias() -> None:
    x, w = r(1, 3, 10), r(5, 3, 3)
    args = (x, w, None, [2], [1], [1], False, [0], 1)
    check("aten::convolution.out", args, aten.convolution(*(t(a) for a in args)))


@pytest.mark.parametrize("kernel, stride, padding, dilation, ceil", [
    ([2, 2], [2, 2], [0, 0], [1, 1], False), ([3, 3], [2, 2], [1, 1], [1, 1], True),
    ([3, 2], [1, 2], [1, 0], [2, 1], False), ([2, 2], [], [0, 0], [1, 1], True),
])
def test_max_pool_with_indices(kernel: list, stride: list, padding: list, dilation: list, ceil: bool) -> None:
    x = r(2, 3, 7, 9)
    args = (x, kernel, stride, padding, dilation, ceil)
    check("aten::max_pool2d_with_indices.out", args, aten.max_pool2d_with_indices(t(x), *args[1:]), n_out=2)


@pytest.mark.parametrize("ceil, include_pad, divisor", [(False, True, None), (True, False, None), (True, True, None),
                                                         (False, True, 3)])
def test_avg_pool(ceil: bool, include_pad: bool, divisor: Any) -> None:
    x = r(1, 2, 7, 6)
    args = (x, [3, 2], [2, 2], [1, 1], ceil, include_pad, divisor)
    check("aten::avg_pool2d.out", args, aten.avg_pool2d(t(x), *args[1:]))


@pytest.mark.parametrize("name, fn", [("aten::_softmax.out", aten._softmax),
                                      ("aten::_log_softmax.out", aten._log_softmax)])
def test_softmax(name: str, fn: Any) -> None:
    x = r(3, 5) * 20
    for dim in (0, 1, -1):
        check(name, (x, dim, False), fn(t(x), dim, False))


@pytest.mark.parametrize("start, end, step", [(1, 3, 1), (-3, None, 1), (0, 100, 2), (-100, -1, 3), (4, 2, 1)])
def test_slice(start: Any, end: Any, step: int) -> None:
    x = r(5, 6)
    check("aten::slice_copy.Tensor_out", (x, 1, start, end, step), aten.slice_copy(t(x), 1, start, end, step))


def test_index_with_gaps_and_masks() -> None:
    x = r(4, 5, 6)
    i, j = np.array([0, 3, 1]), np.array([[1], [4]])
    check("aten::index.Tensor_out", (x, [None, t(j).numpy(), None]), aten.index(t(x), [None, t(j), None]))
    check("aten::index.Tensor_out", (x, [i, None, np.array([5, 0, 2])]),
          aten.index(t(x), [t(i), None, torch.tensor([5, 0, 2])]))
    mask = x[:, 0, 0] > 0
    check("aten::index.Tensor_out", (x, [mask]), aten.index(t(x), [t(mask)]))


@pytest.mark.parametrize("dim, keepdim", [(None, False), ([], False), ([0, 2], True), ([-1], False)])
def test_reductions(dim: Any, keepdim: bool) -> None:
    x = r(3, 4, 5)
    check("aten::sum.IntList_out", (x, dim, keepdim, None), aten.sum.dim_IntList(t(x), dim, keepdim))
    check("aten::mean.out", (x, dim, keepdim, None), aten.mean.dim(t(x), dim, keepdim))
    if dim:
        check("aten::amax.out", (x, dim, keepdim), aten.amax(t(x), dim, keepdim))
        check("aten::amin.out", (x, dim, keepdim), aten.amin(t(x), dim, keepdim))


def test_sum_with_dtype() -> None:
    x = (r(4, 3) * 10).astype(np.int32)
    check("aten::sum.IntList_out", (x, [0], False, 4), aten.sum.dim_IntList(t(x), [0], False, dtype=torch.int64))


@pytest.mark.parametrize("mode", [None, "trunc", "floor"])
def test_div_modes(mode: Any) -> None:
    a, b = r(6) * 10, r(6) + 3
    check("aten::div.out_mode", (a, b, mode), aten.div.Tensor_mode(t(a), t(b), rounding_mode=mode))


def test_layout_ops() -> None:
    x = r(2, 1, 3)
    check("aten::expand_copy.out", (x, [4, 2, -1, 3], False), aten.expand_copy(t(x), [4, 2, -1, 3]))
    check("aten::permute_copy.out", (x, [2, 0, 1]), aten.permute_copy(t(x), [2, 0, 1]))
    check("aten::squeeze_copy.dims_out", (x, [1, 2]), aten.squeeze_copy.dims(t(x), [1, 2]))
    check("aten::unsqueeze_copy.out", (x, -1), aten.unsqueeze_copy(t(x), -1))
    check("aten::select_copy.int_out", (x, 2, -1), aten.select_copy.int(t(x), 2, -1))
    check("aten::constant_pad_nd.out", (x, [1, 2, 0, 1], 0.5), aten.constant_pad_nd(t(x), [1, 2, 0, 1], 0.5))
    check("aten::repeat.out", (x, [2, 1, 1, 2]), aten.repeat(t(x), [2, 1, 1, 2]))
    y = r(7, 2)
    check("aten::split_with_sizes_copy.out", (y, [3, 4], 0), aten.split_with_sizes_copy(t(y), [3, 4]), n_out=2)
    check("aten::split_copy.Tensor_out", (x, 2, 2), aten.split_copy.Tensor(t(x), 2, 2), n_out=2)


@pytest.mark.parametrize("size, scales", [([6, 9], None), (None, [2.0, 1.5]), ([3, 2], None)])
def test_upsample_nearest(size: Any, scales: Any) -> None:
    x = r(1, 2, 4, 6)
    check("aten::upsample_nearest2d.vec_out", (x, size, scales), aten.upsample_nearest2d.vec(t(x), size, scales))


@pytest.mark.parametrize("name", ["aten::upsample_nearest2d.vec_out", "aten::upsample_bilinear2d.vec_out"])
def test_upsample_without_size_or_scales(name: str) -> None:
    args = (r(1, 2, 4, 6), None, None) if "nearest" in name else (r(1, 2, 4, 6), None, False, None)
    with pytest.raises(InputError, match="neither an output size nor scale factors"):
        OPS[name].fn(*args)


def test_norms_and_activations() -> None:
    x = r(2, 3, 4)
    w, b = r(4), r(4)
    check("aten::native_layer_norm.out", (x, [4], w, b, 1e-5), aten.native_layer_norm(t(x), [4], t(w), t(b), 1e-5),
          n_out=3)
    gamma, mean, var = r(3), r(3), np.abs(r(3)) + 0.5
    ref = aten._native_batch_norm_legit_no_training(t(x), t(gamma), None, t(mean), t(var), 0.1, 1e-5)
    check("aten::_native_batch_norm_legit_no_training.out", (x, gamma, None, mean, var, 0.1, 1e-5), ref, n_out=3)
    for approx in ("none", "tanh"):
        check("aten::gelu.out", (x, approx), aten.gelu(t(x), approximate=approx))
    check("aten::sigmoid.out", (x * 50,), aten.sigmoid(t(x * 50)))
    check("aten::hardtanh.out", (x, -0.5, 0.5), aten.hardtanh(t(x), -0.5, 0.5))
    bias, m1, m2 = r(3), r(2, 4), r(4, 3)
    check("aten::addmm.out", (bias, m1, m2, 0.5, 2.0), aten.addmm(t(bias), t(m1), t(m2), beta=0.5, alpha=2.0))


def test_library_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYRT_KERNELS", raising=False)
    assert choose_library(None) == "torch"
    assert choose_library("numpy") == "numpy"
    monkeypatch.setenv("PYRT_KERNELS", "numpy")
    assert choose_library(None) == "numpy"
    with pytest.raises(UnsupportedOperatorError, match="kernels='cuda'"):
        choose_library("cuda")
    assert "aten::convolution.out" in supported() and len(supported()) > 100
