"""Weight-only quantized operators as ExecuTorch's runtime runs them, in numpy and torch.

ExecuTorch 1.5.1's quantized kernel library (``executorch.kernels.quantized``) runs group-wise
quantized weights through ``quantized_decomposed::embedding_byte`` (int8 values) and
``embedding_4bit`` (two values a byte, :func:`pyrt.format.weight_quant.pack_int4`'s ``"offset8"``
layout), in their ``out`` and ``dtype_out`` overloads: the rows ``indices`` picks, dequantized as
``(float(q) - zero_point) * scale`` per group. pyrt's portable exporter dequantizes a linear layer's
weight with them (``indices`` = every row) before ``aten::linear``; embeddings use them as ExecuTorch
meant. Both libraries here compute what ExecuTorch's C++ kernels compute (float32 arithmetic, one
rounding to the out dtype).

A file is untrusted: values and scales that are constants are checked when the method loads (shapes,
dtypes, every scale finite and > 0), and every run checks its indices. These calls are never folded
at load (:attr:`pyrt.kernels.base.Kernel.pure` is False): folding would keep every layer's float
weights in memory, which is what quantization is for avoiding.

:func:`torch_dequantize` is also what pyrt's reference engines and the exporter's graphs run.

>>> import numpy as np
>>> from pyrt.format.weight_quant import pack_int4
>>> packed = pack_int4(np.array([[1, -2, 3, -4]], dtype=np.int8), "offset8")
>>> embedding(packed, np.array([[0.5, 2.0]], np.float32), None, np.array([0, 0]), bits=4).tolist()
[[0.5, -1.0, 6.0, -8.0], [0.5, -1.0, 6.0, -8.0]]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from pyrt.errors import InputError, PteFormatError
from pyrt.format.weight_quant import check_scale_values, unpack_int4
from pyrt.kernels.base import Kernel, KernelSite, Step
from pyrt.kernels.numpy_base import Out, op
from pyrt.memory.table import CONSTANT

# qualified name -> (bits of a stored value, number of input arguments before ``out``)
OPS: dict[str, tuple[int, int]] = {
    "quantized_decomposed::embedding_byte.out": (8, 6),
    "quantized_decomposed::embedding_byte.dtype_out": (8, 7),
    "quantized_decomposed::embedding_4bit.out": (4, 6),
    "quantized_decomposed::embedding_4bit.dtype_out": (4, 7),
}
_WEIGHT_DTYPES = {8: ("int8", "uint8"), 4: ("uint8",)}
_SCALE_DTYPES = ("float32", "float16")  # what ExecuTorch's kernels take (no bfloat16)


# -- numpy ---------------------------------------------------------------------------------------------


def embedding(weight: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, indices: np.ndarray, *,
              bits: int) -> np.ndarray:
    """The dequantized rows ``indices`` picks, float32 ``indices.shape + [K]`` (numpy)."""
    rows = weight.shape[0]
    flat = np.asarray(indices).reshape(-1)
    if flat.size and (flat.min() < 0 or flat.max() >= rows):
        bad = int(flat[(flat < 0) | (flat >= rows)][0])
        raise InputError(f"quantized embedding: index {bad} is outside [0, {rows})")
    picked = weight[flat]
    cols = picked.shape[1] * (2 if bits == 4 else 1)
    values = (unpack_int4(picked, cols, "offset8") if bits == 4 else picked).astype(np.float32)
    groups = 1 if scales.ndim == 1 else scales.shape[1]
    blocks = values.reshape(flat.size, groups, cols // groups)
    if zero_points is not None:
        blocks = blocks - np.asarray(zero_points, np.float32).reshape(rows, groups)[flat][:, :, None]
    s = np.asarray(scales, np.float32).reshape(rows, groups)[flat]
    return (blocks * s[:, :, None]).reshape(*np.shape(indices), cols)


def _numpy_op(bits: int, n_in: int) -> Any:
    """The numpy kernel of an ``out`` (6 inputs) or ``dtype_out`` (7: the dtype, which the out tensor has) overload."""
    def run(weight: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, qmin: int, qmax: int,
            indices: np.ndarray) -> Out:
        return embedding(weight, scales, zero_points, indices, bits=bits)

    def run_dtype(weight: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, qmin: int, qmax: int,
                  indices: np.ndarray, dtype: int | None) -> Out:
        return embedding(weight, scales, zero_points, indices, bits=bits)

    return run if n_in == 6 else run_dtype


def _checker(bits: int, n_in: int) -> Callable[[KernelSite], None]:
    return lambda site: check_site(site, bits, n_in)


for _name, (_bits, _n_in) in OPS.items():
    op(_name, n_in=_n_in, check=_checker(_bits, _n_in))(_numpy_op(_bits, _n_in))


# -- torch ---------------------------------------------------------------------------------------------


def torch_unpack_int4(packed: Any, cols: int, layout: str) -> Any:
    """uint8 [N, cols // 2] -> float32 [N, cols] in torch (meta tensors too): :func:`unpack_int4`'s twin."""
    import torch

    rows = packed.shape[0]
    values = torch.empty(rows, cols // 2, 2, dtype=torch.float32, device=packed.device)
    if layout == "twos":  # (v ^ 8) - 8 sign-extends a two's complement nibble
        values[..., 0], values[..., 1] = (packed & 0xF) ^ 8, (packed >> 4) ^ 8
    else:  # "offset8"
        values[..., 0], values[..., 1] = packed >> 4, packed & 0xF
    return values.sub_(8).view(rows, cols)


def torch_dequantize(q: Any, scales: Any, *, bits: int, cols: int, layout: str, dtype: Any,
                     zero_points: Any = None) -> Any:
    """``(q - zero_point) * scale`` per group in float32, rounded once to ``dtype``: [N, cols] (torch)."""
    import torch

    values = torch_unpack_int4(q, cols, layout) if bits == 4 else q.to(torch.float32)
    rows, groups = q.shape[0], (1 if scales.dim() == 1 else scales.shape[1])
    blocks = values.view(rows, groups, cols // groups)
    if zero_points is not None:
        blocks = blocks - zero_points.to(torch.float32).reshape(rows, groups, 1)
    return (blocks * scales.to(torch.float32).reshape(rows, groups, 1)).view(rows, cols).to(dtype)


def torch_embedding(weight: Any, scales: Any, zero_points: Any, indices: Any, *, bits: int, dtype: Any) -> Any:
    """:func:`embedding` in torch, rounded to ``dtype``. Every row in order (a linear layer's weight) is
    dequantized in place of a gather."""
    rows = weight.shape[0]
    flat = indices.reshape(-1)
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= rows):
        bad = int(flat[(flat < 0) | (flat >= rows)][0])
        raise InputError(f"quantized embedding: index {bad} is outside [0, {rows})")
    cols = weight.shape[1] * (2 if bits == 4 else 1)
    groups = 1 if scales.dim() == 1 else scales.shape[1]
    scales, zp = scales.reshape(rows, groups), None if zero_points is None else zero_points.reshape(rows, groups)
    if not _every_row(flat, rows):
        weight, scales, zp = weight[flat], scales[flat], None if zp is None else zp[flat]
    out = torch_dequantize(weight, scales, bits=bits, cols=cols, layout="offset8", dtype=dtype, zero_points=zp)
    return out.reshape(*indices.shape, cols)


def _every_row(flat: Any, rows: int) -> bool:
    import torch

    return flat.numel() == rows and bool(torch.equal(flat, torch.arange(rows, dtype=flat.dtype)))


def torch_kernel(name: str) -> Kernel:
    """The torch library's kernel for one of :data:`OPS`."""
    bits, n_in = OPS[name]

    def build(site: KernelSite) -> Step:
        site.require_args(n_in + 1)
        check_site(site, bits, n_in)
        get = [site.getter(k) for k in (0, 1, 2, 5)]
        table, out_index, where = site.table, site.args[n_in], site.where
        info = site.info(n_in)
        if info is None:
            raise PteFormatError(f"{where}: out (value {out_index}) is not a tensor")

        def step() -> None:
            weight, scales, zp, indices = (g() for g in get)
            out: Any = table.vals[out_index]  # a torch tensor: the torch library's table
            result = torch_embedding(weight, scales, zp, indices, bits=bits, dtype=out.dtype)
            if tuple(out.shape) != tuple(result.shape):
                if not info.dynamic:
                    raise InputError(f"{where}: result shape {tuple(result.shape)} does not match the planned "
                                     f"{tuple(out.shape)}")
                out = table.resize(out_index, tuple(result.shape))
            out.copy_(result)

        return step

    return Kernel(name, build=build, writes=lambda args: args[n_in:n_in + 1], pure=False)


# -- load-time checks ----------------------------------------------------------------------------------


def check_site(site: KernelSite, bits: int, n_in: int) -> None:
    """PteFormatError, at load, for quantized values or scales that cannot be what the operator needs."""
    site.require_args(n_in + 1)
    w, s, out = site.info(0), site.info(1), site.info(n_in)
    if w is None or s is None or out is None:
        raise PteFormatError(f"{site.where}: weight, scales and out must be tensors")
    name = f"{site.where}: weight (value {site.args[0]})"
    if w.scalar_type.dtype_name not in _WEIGHT_DTYPES[bits] or len(w.sizes) != 2:
        raise PteFormatError(f"{name} is {w.scalar_type.dtype_name}{list(w.sizes)}; int{bits} values need a 2-D "
                             f"{' or '.join(_WEIGHT_DTYPES[bits])} tensor")
    rows, cols = w.sizes[0], w.sizes[1] * (2 if bits == 4 else 1)
    scales = f"{site.where}: scales (value {site.args[1]})"
    if s.scalar_type.dtype_name not in _SCALE_DTYPES or len(s.sizes) not in (1, 2) or s.sizes[0] != rows:
        raise PteFormatError(f"{scales} are {s.scalar_type.dtype_name}{list(s.sizes)}; weight {list(w.sizes)} "
                             f"needs float32 or float16 [{rows}] or [{rows}, groups]")
    groups = 1 if len(s.sizes) == 1 else s.sizes[1]
    if groups < 1 or cols % groups:
        raise PteFormatError(f"{scales} hold {groups} groups per row, which do not divide {cols} values (packed "
                             f"weight {list(w.sizes)})")
    if not out.dynamic and (not out.sizes or out.sizes[-1] != cols):
        raise PteFormatError(f"{site.where}: out (value {site.args[n_in]}) is {list(out.sizes)}; the weight "
                             f"{list(w.sizes)} holds rows of {cols} values")
    if s.storage == CONSTANT and site.is_const(1):
        check_scale_values(f"value {site.args[1]}", _as_numpy(site.value(1)),
                           lambda m: PteFormatError(f"{site.where}: {m}"))
    zp = site.info(2)
    if zp is not None and tuple(zp.sizes) != tuple(s.sizes):
        raise PteFormatError(f"{site.where}: zero points {list(zp.sizes)} do not match scales {list(s.sizes)}")


def _as_numpy(value: Any) -> np.ndarray:
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)
