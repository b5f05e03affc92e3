"""The numpy kernel library's machinery: the operator registry, step construction, shared helpers.

Each operator is a plain function of its input arguments (schema order, out
arguments excluded) returning the result array(s), registered with :func:`op`;
the step writes results into the out tensors the plan built (casting to the out
dtype, as the out-variants do), resizing dynamic outputs within their
memory-planned bound. The kernels themselves live in the per-topic modules
:mod:`~pyrt.kernels.numpy_elementwise`, :mod:`~pyrt.kernels.numpy_shape`,
:mod:`~pyrt.kernels.numpy_index`, :mod:`~pyrt.kernels.numpy_reduce` and
:mod:`~pyrt.kernels.numpy_nn`; :mod:`~pyrt.kernels.numpy_library` imports them all.
Argument values the set cannot honour (a transposed convolution) are rejected
at load with :class:`~pyrt.errors.UnsupportedOperatorError`.

>>> reduce_axes([-1], 3), reduce_axes([], 3)
((2,), None)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias, TypeVar, cast

import numpy as np

from pyrt.errors import InputError, UnsupportedOperatorError
from pyrt.format.dtypes import ScalarType
from pyrt.kernels.base import KernelSite, Step
from pyrt.memory.layout import numpy_dtype

if TYPE_CHECKING:
    from pyrt.memory.table import ValueTable

# What numpy kernels take and return: the value table's values (:data:`~pyrt.memory.tensors.Value`),
# where the numpy library's host tensors are numpy arrays (``HostTensor`` without torch).
Scalar: TypeAlias = int | float | bool  # a ``Scalar`` argument (``alpha``, ``eps``, a fill value)
Operand: TypeAlias = np.ndarray | Scalar  # a tensor, or a Python number where the overload takes a Scalar
Dims: TypeAlias = int | Sequence[int] | None  # reduction dims: None or [] reduce everything
Out: TypeAlias = np.ndarray | np.generic  # one result: an array or a numpy scalar, copied into its out tensor
Results: TypeAlias = Out | Sequence[Out]  # what a kernel returns: one result, or one per out (tuple or list)
Writer = Callable[[Results], None]
KernelFn = TypeVar("KernelFn", bound=Callable[..., Results])


@dataclass(frozen=True)
class NpOp:
    """``fn(*args[:n_in]) -> result(s)`` written to ``args[n_in:n_in + n_out]``."""

    fn: Callable[..., Results]
    n_in: int
    n_out: int = 1
    check: Callable[[KernelSite], None] | None = None


OPS: dict[str, NpOp] = {}


def op(*names: str, n_in: int, n_out: int = 1,
       check: Callable[[KernelSite], None] | None = None) -> Callable[[KernelFn], KernelFn]:
    def register(fn: KernelFn) -> KernelFn:
        for name in names:
            OPS[name] = NpOp(fn, n_in, n_out, check)
        return fn

    return register


# -- step construction -----------------------------------------------------------------------------


def build_step(spec: NpOp, site: KernelSite) -> Step:
    site.require_args(spec.n_in + spec.n_out)
    if spec.check is not None:
        spec.check(site)
    _reject_device(site, spec.n_in + spec.n_out)
    getters = [site.getter(k) for k in range(spec.n_in)]
    writers = [_writer(site, spec.n_in + j) for j in range(spec.n_out)]
    fn, where = spec.fn, site.where
    if spec.n_out == 1:
        (write,) = writers
        if all(site.is_const(k) for k in range(spec.n_in)):
            args = [g() for g in getters]
            return lambda: write(fn(*args))
        return lambda: write(fn(*[g() for g in getters]))

    def step() -> None:
        results = cast(Sequence[Out], fn(*[g() for g in getters]))
        if len(results) != len(writers):
            raise InputError(f"{where}: kernel produced {len(results)} results for {len(writers)} outputs")
        for w, r in zip(writers, results, strict=True):
            w(r)

    return step


def _reject_device(site: KernelSite, n: int) -> None:
    for k in range(n):
        idxs = [site.args[k]]
        if site.kind(k) in ("TensorList", "OptionalTensorList"):
            idxs = [j for j in site.table.items[site.args[k]] if j >= 0]
        for j in idxs:
            info = site.table.infos.get(j)
            if info is not None and info.device is not None:
                raise UnsupportedOperatorError(f"{site.where}: value {j} lives in CUDA memory")


def _writer(site: KernelSite, k: int) -> Writer:
    """Store a result into out argument ``k`` (a tensor or a tensor list)."""
    table, where = site.table, site.where
    if site.kind(k) == "TensorList":
        item_writers = [_tensor_writer(table, j, where) for j in table.items[site.args[k]]]

        def write_list(out: Results) -> None:
            results = cast(Sequence[Out], out)
            if len(results) != len(item_writers):
                raise InputError(f"{where}: {len(results)} results for {len(item_writers)} outputs")
            for w, r in zip(item_writers, results, strict=True):
                w(r)

        return write_list
    return _tensor_writer(table, site.args[k], where)


def _tensor_writer(table: ValueTable, i: int, where: str) -> Writer:
    info = table.infos.get(i)
    if info is None:
        raise UnsupportedOperatorError(f"{where}: out value {i} is a {table.kinds[i]}, not a tensor")
    vals = table.vals
    if not info.dynamic:
        def write_static(r: Results) -> None:
            out = cast(np.ndarray, vals[i])
            if np.shape(r) != out.shape:
                raise InputError(f"{where}: result shape {np.shape(r)} does not match the planned {out.shape}")
            np.copyto(out, r, casting="unsafe")

        return write_static

    def write_dynamic(r: Results) -> None:
        out = table.resize(i, np.shape(r))
        np.copyto(out, r, casting="unsafe")

    return write_dynamic


# -- helpers ---------------------------------------------------------------------------------------


def optional_dtype(v: int | None) -> np.dtype | None:
    return None if v is None else numpy_dtype(ScalarType(int(v)))


def reduce_axes(dim: Dims, ndim: int) -> tuple[int, ...] | None:
    """torch reduction dims: None or [] reduce everything."""
    if dim is None:
        return None
    dims = [int(dim)] if isinstance(dim, (int, np.integer)) else list(dim)
    if not dims:
        return None
    return tuple(d % max(ndim, 1) for d in dims)


def as_float(x: np.ndarray) -> np.ndarray:
    return x if np.issubdtype(x.dtype, np.floating) else x.astype(np.float32)


def clip_slice(n: int, start: int | None, end: int | None, step: int) -> slice:
    start = 0 if start is None else int(start)
    end = n if end is None else int(end)
    start = max(start + n, 0) if start < 0 else min(start, n)
    end = max(end + n, 0) if end < 0 else min(end, n)
    return slice(start, max(end, start), step)
