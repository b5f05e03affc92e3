"""The small-tensor numpy path's arguments: what numpy may see, and the checks a builder makes.

:func:`site_args` gives an instruction's arguments with numpy views in place of its
tensors, where each tensor sits in a fixed slot, has a static shape, lives on the CPU
and has at most ``SMALL_NUMEL`` elements (see :mod:`pyrt.kernels.small_numpy_fastpath` for
why). The predicates below (one dtype, weak scalars, broadcast shapes, no overlap
between out and inputs) are what :mod:`~pyrt.kernels.small_numpy_fastpath`'s builders check
before binding a step, so that numpy computes what the torch out-variant computes.

>>> import numpy as np
>>> broadcast_shape((2, 1), (3,)), _weak_scalar(1.5, np.dtype(np.float32)), _weak_scalar(1e300, np.dtype(np.float32))
((2, 3), True, False)
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from pyrt.kernels.base import KernelSite

SMALL_NUMEL = 4096  # elements per tensor; above this the work, not the call, dominates
FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
INTS = (np.dtype(np.int32), np.dtype(np.int64))  # wrap around alike in both libraries

T = TypeVar("T")
# Argument name -> value (numpy arrays in place of the tensors). Any: each builder reads its operator's
# names, whose types differ by operator and which its checks establish before any use.
Args = Mapping[str, Any]


# -- what numpy may see --------------------------------------------------------------------------


def numpy_view(t: Any, limit: int) -> np.ndarray | None:  # Any: a torch tensor, or whatever a slot holds
    """A numpy view of CPU tensor ``t`` sharing its memory, or None (too big, autograd, conj/neg bit...)."""
    try:
        if t.requires_grad or t.device.type != "cpu" or t.numel() > limit:
            return None
        a = t.numpy()
    except (AttributeError, RuntimeError, TypeError):
        return None
    return a


def _tensor_arg(site: KernelSite, k: int, limit: int) -> np.ndarray | None:
    """Argument ``k`` as a numpy view, where its slot and shape never change; else None."""
    if not site.is_const(k) or site.kind(k) != "Tensor":
        return None
    info = site.info(k)
    if info is None or info.dynamic or info.device is not None:
        return None
    return numpy_view(site.value(k), limit)


def tensor_slots(site: KernelSite, k: int) -> Sequence[int]:
    """The value slots of argument ``k``'s tensors: itself, a list's items, or none."""
    kind = site.kind(k)
    if kind == "Tensor":
        return [site.args[k]]
    return site.table.items[site.args[k]] if kind == "TensorList" else []


def _list_arg(site: KernelSite, k: int, limit: int) -> list[np.ndarray] | None:
    """A constant ``Tensor[]`` argument as numpy views, or None."""
    if not site.is_const(k) or site.kind(k) != "TensorList":
        return None
    out = []
    for j in tensor_slots(site, k):
        info = site.table.infos.get(j)
        if j < 0 or info is None or info.dynamic or info.device is not None or not site.table.is_const(j):
            return None
        a = numpy_view(site.table.vals[j], limit)
        if a is None:
            return None
        out.append(a)
    return out


def site_args(site: KernelSite, names: Sequence[str], tensors: Collection[str],
              limit: int = SMALL_NUMEL) -> dict[str, object] | None:
    """``name -> value`` of the instruction's arguments (schema ``names``), tensors as numpy views.

    None when any tensor argument (``tensors``: the names the schema types ``Tensor`` or
    ``Tensor[]``) may not go to numpy (see the module docstring), or is not a tensor in the
    file, or any argument is rebound at run time.
    """
    if len(site.args) < len(names):
        return None
    args: dict[str, object] = {}
    for k, name in enumerate(names):
        kind = site.kind(k)
        if (name in tensors) != (kind in ("Tensor", "TensorList")):
            return None  # torch will name the mismatch
        a: object
        if kind == "Tensor":
            a = _tensor_arg(site, k, limit)
        elif kind == "TensorList":
            a = _list_arg(site, k, limit)
        elif not site.is_const(k):
            return None
        else:
            a = site.value(k)
            if kind in ("Null", "None"):
                a = None
        if a is None and kind in ("Tensor", "TensorList"):
            return None
        args[name] = a
    return args


def broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...] | None:
    """The broadcast shape, or None where the shapes do not broadcast (torch raises then)."""
    try:
        return np.broadcast_shapes(*shapes)
    except ValueError:
        return None


def same_dtype(*arrays: np.ndarray) -> bool:
    """One dtype for all (copies: exact in any dtype numpy can view)."""
    return all(a.dtype == arrays[0].dtype for a in arrays)


def are_floats(*arrays: np.ndarray) -> bool:
    """One floating dtype for all."""
    return arrays[0].dtype in FLOATS and same_dtype(*arrays)


def _weak_scalar(v: Any, dtype: np.dtype) -> bool:  # Any: narrowed by type() below, which mypy cannot follow
    """A Python number numpy applies in floating ``dtype`` as torch does: weak (NEP 50), and in range
    (inf and nan are; a finite double past the dtype's range is left to torch)."""
    if type(v) not in (int, float) or dtype not in FLOATS:
        return False
    return math.isnan(v) or math.isinf(v) or abs(v) <= float(np.finfo(dtype).max)


def is_one(v: object) -> bool:
    return type(v) in (int, float) and v == 1


def apart(out: np.ndarray, *ins: object) -> bool:
    """``out`` shares no memory with any array in ``ins`` (torch rejects partial overlap; numpy would not)."""
    return not any(isinstance(a, np.ndarray) and np.may_share_memory(out, a) for a in ins)


def apart_or_same(out: np.ndarray, *ins: object) -> bool:
    """Like :func:`apart`, but an input that is exactly ``out`` (an in-place call) is fine for ufuncs."""
    return all(not isinstance(a, np.ndarray) or not np.may_share_memory(out, a)
               or (a.__array_interface__ == out.__array_interface__) for a in ins)


def other_fits(x: np.ndarray, y: object, out: np.ndarray) -> bool:
    """``y`` is a tensor of ``x``'s dtype that broadcasts with ``x`` to ``out``'s shape, or a weak
    scalar and ``x`` already has ``out``'s shape."""
    if isinstance(y, np.ndarray):
        return y.dtype == x.dtype and broadcast_shape(x.shape, y.shape) == out.shape
    return _weak_scalar(y, x.dtype) and x.shape == out.shape


def shaped(a: T, shape: tuple[int, ...]) -> T | np.ndarray:
    """``a`` viewed in ``shape`` where it broadcasts to ``shape`` without repeating anything (a
    (64,) bias on a (1, 64) out): numpy's same-shape loops skip the broadcasting set-up (~0.5-1 us).
    Anything else (a scalar, a real broadcast, a strided array) as it is."""
    if isinstance(a, np.ndarray) and a.shape != shape and a.size == math.prod(shape) and a.flags.c_contiguous:
        return a.reshape(shape)  # a view: reshaping a contiguous array never copies
    return a
