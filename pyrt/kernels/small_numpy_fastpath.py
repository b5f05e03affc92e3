"""Small static tensors through numpy: the torch library's path where call overhead dominates.

A torch out-variant called from Python costs about 1 us before it does any work
(argument parsing, dispatch, TensorIterator set-up); a numpy ufunc on arrays bound
once costs about 0.3 us. Real models full of tiny tensors (an LSTM step on a
(1, 16) state, a small decoder's norms and rotary products) spend most of their
run time there. So, for an instruction whose tensors all sit in fixed slots, have
static shapes and at most ``SMALL_NUMEL`` elements, the torch library binds numpy
views of those very tensors once at load and runs the numpy equivalent: the same
memory is written, so the torch steps before and after see the results.

A numpy step is built only where numpy computes what the torch out-variant computes:

* every tensor has one dtype, shared with the out (comparisons: a bool out); no type
  promotion, no casting. Math needs float32 or float64; ``add``/``sub``/``mul`` and
  comparisons of two tensors also take int32/int64 (both wrap around alike); copies
  (``cat``, ``*_copy``) take any dtype numpy can view;
* scalars are Python ``int``/``float`` numpy treats as weak (NEP 50), with float
  tensors, in the dtype's range; ``alpha``/``beta`` are 1;
* the out has the shape torch would give it (no resize) and overlaps no input;
* the operands are CPU tensors numpy can view (no autograd, no conjugate/negative bit).

In a dynamic-shape method the tensors change shape between runs, so the numpy step is
bound later (:class:`Rebind`): at the first run that repeats the last run's shapes
(:mod:`pyrt.runtime.steady`), for the runs that follow until the shapes change.

Anything else is left to torch. Elementwise arithmetic, negation, squares,
reciprocal square roots and comparisons give torch's bits; ``sqrt`` (torch's float32
one is not correctly rounded, numpy's is), ``tanh``/``exp``, sums and matrix products
may differ in the last bit (another SIMD math library, another BLAS, another
summation order), as they do between torch builds.

>>> import torch
>>> from pyrt.kernels.small_numpy_fastpath import bind
>>> x, out = torch.tensor([1.0, 4.0]), torch.empty(2)
>>> step = bind("aten::sqrt.out", {"self": x, "out": out}, tensors={"self", "out"})
>>> _ = step(); out.tolist()
[1.0, 2.0]
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from pyrt.kernels.base import KernelSite, Step
from pyrt.kernels.small_numpy_fastpath_args import (
    FLOATS,
    INTS,
    SMALL_NUMEL,
    Args,
    apart,
    apart_or_same,
    are_floats,
    broadcast_shape,
    is_one,
    numpy_view,
    other_fits,
    same_dtype,
    shaped,
    site_args,
    tensor_slots,
)
from pyrt.memory.tensors import Value

Builder = Callable[[Args], "Step | None"]


def quiet() -> contextlib.AbstractContextManager[object]:
    """The context a run with numpy steps runs in: floating-point events (overflow to inf, 0/0...)
    stay silent, as in torch and ExecuTorch, instead of numpy's RuntimeWarnings (errors under
    ``-W error``). Entered once per run (a step's worth of time), thread-local like numpy's state."""
    return np.errstate(all="ignore")


def _mark(step: Step) -> Step:
    """Mark a numpy step (``small``: tests, profiles) and the context its runs need (``run_context``)."""
    step.small = True  # type: ignore[attr-defined]
    step.run_context = quiet  # type: ignore[attr-defined]
    return step


# -- builders: args -> step or None ----------------------------------------------------------------


def _binary(ufunc: np.ufunc, ints: bool = False) -> Builder:
    """``op(self, other[, alpha])`` -> ``ufunc(self, other, out)``; ``other`` a tensor or a weak scalar
    (``ints``: integer tensors too, tensor with tensor)."""

    def build(a: Args) -> Step | None:
        x, y, out = a["self"], a["other"], a["out"]
        if not is_one(a.get("alpha", 1)) or out.dtype != x.dtype:
            return None
        if x.dtype not in FLOATS and not (ints and x.dtype in INTS):
            return None
        if not other_fits(x, y, out) or not apart_or_same(out, x, y):
            return None
        return functools.partial(ufunc, shaped(x, out.shape), shaped(y, out.shape), out)

    return build


def _compare(ufunc: np.ufunc) -> Builder:
    """``eq``/``lt``/...: tensor against tensor or weak scalar, a bool out."""

    def build(a: Args) -> Step | None:
        x, y, out = a["self"], a["other"], a["out"]
        if out.dtype != np.bool_ or x.dtype not in FLOATS + INTS:
            return None
        if not other_fits(x, y, out) or not apart(out, x, y):
            return None
        return functools.partial(ufunc, shaped(x, out.shape), shaped(y, out.shape), out)

    return build


def _unary(*ufuncs: Callable[[np.ndarray, np.ndarray], object]) -> Builder:
    """``op(self)`` -> the first ufunc into out, the others in place on out."""

    def build(a: Args) -> Step | None:
        x, out = a["self"], a["out"]
        if not are_floats(x, out) or x.shape != out.shape or not apart_or_same(out, x):
            return None
        first = functools.partial(ufuncs[0], x, out)
        if len(ufuncs) == 1:
            return first
        rest = [functools.partial(u, out, out) for u in ufuncs[1:]]

        def step() -> None:
            first()
            for r in rest:
                r()

        return step

    return build


def _reciprocal_in_place(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    return np.divide(1.0, x, out)


def _logical_not(a: Args) -> Step | None:
    x, out = a["self"], a["out"]
    if x.dtype != np.bool_ or out.dtype != np.bool_ or x.shape != out.shape or not apart_or_same(out, x):
        return None
    return functools.partial(np.logical_not, x, out)


_POWERS = {2: np.square, 0.5: np.sqrt}  # exponents torch special-cases to exactly these


def _pow_scalar(a: Args) -> Step | None:
    e = a["exponent"]
    if type(e) not in (int, float):
        return None
    if e == 3:  # torch: x * x * x, left to right
        x, out = a["self"], a["out"]
        if not are_floats(x, out) or x.shape != out.shape or not apart(out, x):
            return None
        multiply = np.multiply

        def cube() -> None:
            multiply(x, x, out)
            multiply(out, x, out)

        return cube
    if e not in _POWERS:
        return None
    return _unary(_POWERS[e])(a)


def _mean(a: Args) -> Step | None:
    """``mean.out`` over a dim list: a sum, then one division by the count (what ATen does)."""
    x, out, dims = a["self"], a["out"], a["dim"]
    if a.get("dtype") is not None or not isinstance(dims, list) or not dims or not are_floats(x, out):
        return None
    nd = x.ndim
    if any(type(d) is not int or not -nd <= d < nd for d in dims):
        return None
    axis = tuple(sorted({d % nd for d in dims}))
    if len(axis) != len(dims):
        return None
    keep = a.get("keepdim", False)
    if type(keep) is not bool:
        return None
    shape = tuple(1 if i in axis else s for i, s in enumerate(x.shape) if keep or i not in axis)
    count = math.prod(x.shape[i] for i in axis)
    if shape != out.shape or count == 0 or not apart(out, x):
        return None
    add_reduce: Callable[..., object] = np.add.reduce  # positional (array, axis, dtype, out, keepdims): fastest
    divide = np.divide

    def step() -> None:
        add_reduce(x, axis, None, out, keep)
        divide(out, count, out)

    return step


def _matmul_shapes(x: np.ndarray, y: np.ndarray, out: np.ndarray, nd: int) -> bool:
    return (x.ndim == y.ndim == out.ndim == nd and x.shape[-1] == y.shape[-2]
            and out.shape == (*x.shape[:-1], y.shape[-1]) and x.shape[:-2] == y.shape[:-2])


def _mm(a: Args) -> Step | None:
    x, y, out = a["self"], a["mat2"], a["out"]
    if not are_floats(x, y, out) or not _matmul_shapes(x, y, out, 2) or not out.flags.c_contiguous:
        return None
    if not apart(out, x, y):
        return None
    return functools.partial(np.dot, x, y, out)


def _addmm(a: Args) -> Step | None:
    """``addmm`` with beta = alpha = 1: ``dot`` into out, then the bias added in place."""
    bias, x, y, out = a["self"], a["mat1"], a["mat2"], a["out"]
    if not (is_one(a.get("beta", 1)) and is_one(a.get("alpha", 1))):
        return None
    if not are_floats(bias, x, y, out) or not _matmul_shapes(x, y, out, 2) or not out.flags.c_contiguous:
        return None
    if broadcast_shape(bias.shape, out.shape) != out.shape or not apart(out, bias, x, y):
        return None
    dot, add = np.dot, np.add
    bias = shaped(bias, out.shape)  # (n,) on a (1, n) out: no broadcasting

    def step() -> None:
        dot(x, y, out)
        add(out, bias, out)

    return step


def _bmm(a: Args) -> Step | None:
    x, y, out = a["self"], a["mat2"], a["out"]
    if not are_floats(x, y, out) or not _matmul_shapes(x, y, out, 3) or not apart(out, x, y):
        return None
    return functools.partial(np.matmul, x, y, out=out)


def _cat(a: Args) -> Step | None:
    parts, out, dim = a["tensors"], a["out"], a["dim"]
    if not parts or type(dim) is not int or not same_dtype(*parts, out):
        return None
    nd = out.ndim
    if not -nd <= dim < nd or any(p.ndim != nd or p.size == 0 for p in parts):
        return None
    axis = dim % nd
    rest = [s for i, s in enumerate(out.shape) if i != axis]
    if any([s for i, s in enumerate(p.shape) if i != axis] != rest for p in parts):
        return None
    if sum(p.shape[axis] for p in parts) != out.shape[axis] or not apart(out, *parts):
        return None
    return functools.partial(np.concatenate, tuple(parts), axis, out)


def _permute_copy(a: Args) -> Step | None:
    x, out, dims = a["self"], a["out"], a["dims"]
    nd = x.ndim
    if not isinstance(dims, list) or any(type(d) is not int or not -nd <= d < nd for d in dims):
        return None
    perm = [d % nd for d in dims]
    if sorted(perm) != list(range(nd)) or not same_dtype(x, out):
        return None
    view = x.transpose(perm)
    if view.shape != out.shape or not apart(out, x):
        return None
    return functools.partial(np.copyto, out, view)


def _expand_copy(a: Args) -> Step | None:
    """``expand_copy``: the input broadcast to ``size`` (-1 keeps a dim), copied into out."""
    x, out, size = a["self"], a["out"], a["size"]
    if not isinstance(size, list) or len(size) < x.ndim or any(type(d) is not int for d in size):
        return None
    lead = len(size) - x.ndim
    target = tuple(x.shape[i - lead] if d == -1 and i >= lead else d for i, d in enumerate(size))
    if any(d < 0 for d in target) or target != out.shape or not same_dtype(x, out) or not apart(out, x):
        return None
    try:
        view = np.broadcast_to(x, target)
    except ValueError:
        return None
    return functools.partial(np.copyto, out, view)


def _view_copy(a: Args) -> Step | None:
    """``view_copy``/``alias_copy``: the input's values in out's shape (``size`` may hold one -1)."""
    x, out = a["self"], a["out"]
    size = a.get("size", list(x.shape))
    if not isinstance(size, list) or any(type(d) is not int or d < -1 for d in size) or size.count(-1) > 1:
        return None
    if -1 in size:
        known = math.prod(d for d in size if d != -1)
        if known == 0 or x.size % known:
            return None
        size = [x.size // known if d == -1 else d for d in size]
    if tuple(size) != out.shape or math.prod(size) != x.size or not same_dtype(x, out) or not apart(out, x):
        return None
    if x.shape == out.shape:
        view = x
    elif x.flags.c_contiguous:  # reshaping a contiguous array is always a view, never a copy made now
        view = x.reshape(out.shape)
    else:
        return None
    return functools.partial(np.copyto, out, view)


def _split_copy(a: Args) -> Step | None:
    """``split_with_sizes_copy``/``split_copy``: consecutive slices of ``dim`` copied into the outs."""
    x, outs, dim = a["self"], a["out"], a.get("dim", 0)
    sizes = a.get("split_sizes")
    if type(dim) is not int or not -x.ndim <= dim < x.ndim or x.ndim == 0:
        return None
    axis = dim % x.ndim
    if sizes is None:
        step = a.get("split_size")
        if type(step) is not int or step <= 0:
            return None
        n = x.shape[axis]
        sizes = [min(step, n - i) for i in range(0, n, step)] or [0]
    if not isinstance(sizes, list) or any(type(d) is not int or d < 0 for d in sizes):
        return None
    if len(sizes) != len(outs) or sum(sizes) != x.shape[axis] or not same_dtype(x, *outs):
        return None
    pairs = []
    start = 0
    for size, out in zip(sizes, outs, strict=True):
        part = x[(slice(None),) * axis + (slice(start, start + size),)]
        if part.shape != out.shape or not apart(out, x):
            return None
        pairs.append(functools.partial(np.copyto, out, part))
        start += size

    def step_all() -> None:
        for copy in pairs:
            copy()

    return step_all


BUILDERS: dict[str, Builder] = {
    "aten::add.out": _binary(np.add, ints=True), "aten::add.Scalar_out": _binary(np.add),
    "aten::sub.out": _binary(np.subtract, ints=True), "aten::sub.Scalar_out": _binary(np.subtract),
    "aten::mul.out": _binary(np.multiply, ints=True), "aten::mul.Scalar_out": _binary(np.multiply),
    "aten::div.out": _binary(np.true_divide),
    "aten::eq.Scalar_out": _compare(np.equal), "aten::eq.Tensor_out": _compare(np.equal),
    "aten::ne.Scalar_out": _compare(np.not_equal), "aten::ne.Tensor_out": _compare(np.not_equal),
    "aten::lt.Scalar_out": _compare(np.less), "aten::lt.Tensor_out": _compare(np.less),
    "aten::le.Scalar_out": _compare(np.less_equal), "aten::le.Tensor_out": _compare(np.less_equal),
    "aten::gt.Scalar_out": _compare(np.greater), "aten::gt.Tensor_out": _compare(np.greater),
    "aten::ge.Scalar_out": _compare(np.greater_equal), "aten::ge.Tensor_out": _compare(np.greater_equal),
    "aten::neg.out": _unary(np.negative), "aten::abs.out": _unary(np.absolute),
    "aten::sqrt.out": _unary(np.sqrt), "aten::rsqrt.out": _unary(np.sqrt, _reciprocal_in_place),
    "aten::tanh.out": _unary(np.tanh), "aten::exp.out": _unary(np.exp),
    "aten::logical_not.out": _logical_not, "aten::pow.Tensor_Scalar_out": _pow_scalar,
    "aten::mean.out": _mean, "aten::mm.out": _mm, "aten::addmm.out": _addmm, "aten::bmm.out": _bmm,
    "aten::cat.out": _cat, "aten::permute_copy.out": _permute_copy, "aten::expand_copy.out": _expand_copy,
    "aten::view_copy.out": _view_copy, "aten::alias_copy.out": _view_copy,
    "aten::split_with_sizes_copy.out": _split_copy, "aten::split_copy.Tensor_out": _split_copy,
}


def builder(qualified_name: str, names: Sequence[str], tensors: Collection[str],
            limit: int = SMALL_NUMEL) -> Callable[[KernelSite], Step | None] | None:
    """``site -> numpy step or None`` for operator ``qualified_name`` (schema argument ``names``, of
    which ``tensors`` are tensors or tensor lists), or None where numpy has no such step."""
    build = BUILDERS.get(qualified_name)
    if build is None or limit <= 0:
        return None
    tensors = frozenset(tensors)

    def at_site(site: KernelSite) -> Step | None:
        args = site_args(site, names, tensors, limit)
        step = None if args is None else build(args)
        return None if step is None else _mark(step)

    return at_site


@dataclass(frozen=True)
class Rebind:
    """Binds a numpy step to one instruction's tensors as they are now (see :func:`rebinder`).

    ``fixed``: arguments whose slots never change; ``moving``: ``(name, slots, getter)`` of
    arguments a run rebinds (``et_view`` results, lists of ``sym_size`` results...), read at
    :meth:`bind` time; ``slots``: the value or, for a list, its items.
    """

    name: str
    fixed: Mapping[str, Value]
    moving: tuple[tuple[str, tuple[int, ...], Callable[[], Value]], ...]
    tensors: frozenset[str]
    limit: int

    @property
    def slots(self) -> frozenset[int]:
        """The rebound slots the step reads: it stays right only while these hold the same objects."""
        return frozenset(slot for _, slots, _ in self.moving for slot in slots)

    def bind(self) -> Step | None:
        """The numpy step on the arguments' current objects and shapes, or None (torch must run)."""
        args = dict(self.fixed)
        for name, _, get in self.moving:
            args[name] = get()
        step = bind(self.name, args, self.tensors, self.limit)
        return None if step is None else _mark(step)


def rebinder(qualified_name: str, names: Sequence[str], tensors: Collection[str],
             limit: int = SMALL_NUMEL) -> Callable[[KernelSite], Rebind | None] | None:
    """``site -> Rebind or None`` for an instruction whose tensors change shape between runs.

    Shapes change only in a dynamic method's full runs; its steady runs (:mod:`pyrt.runtime.steady`)
    repeat the last full run's shapes on the same objects, so a step bound to the views of
    that run stays right until the next full run. None where a tensor lives on a device.
    """
    if BUILDERS.get(qualified_name) is None or limit <= 0:
        return None
    tensor_names = frozenset(tensors)

    def at_site(site: KernelSite) -> Rebind | None:
        if len(site.args) < len(names):
            return None
        fixed: dict[str, Value] = {}
        moving: list[tuple[str, tuple[int, ...], Callable[[], Value]]] = []
        for k, name in enumerate(names):
            kind = site.kind(k)
            if any(j < 0 or (info := site.table.infos.get(j)) is None or info.device is not None
                   for j in tensor_slots(site, k)):
                return None
            if site.is_const(k):
                fixed[name] = None if kind in ("Null", "None") else site.value(k)
            else:
                i = site.args[k]
                moving.append((name, tuple(j for j in site.table.items.get(i, (i,)) if j >= 0), site.getter(k)))
        return Rebind(qualified_name, fixed, tuple(moving), tensor_names, limit)

    return at_site


def bind(qualified_name: str, args: Mapping[str, Value], tensors: Collection[str],
         limit: int = SMALL_NUMEL) -> Step | None:
    """The numpy step of ``qualified_name`` on torch tensors ``args`` (by schema name; ``tensors``: the
    names the schema types as tensors or tensor lists), or None where torch must run it."""
    build = BUILDERS.get(qualified_name)
    if build is None:
        return None
    viewed: dict[str, object] = {}
    for name, v in args.items():
        if name not in tensors:
            viewed[name] = v
        elif isinstance(v, list) and v:
            views = [numpy_view(t, limit) for t in v]
            if any(w is None for w in views):
                return None
            viewed[name] = views
        elif (w := numpy_view(v, limit)) is not None:
            viewed[name] = w
        else:
            return None
    return build(viewed)
