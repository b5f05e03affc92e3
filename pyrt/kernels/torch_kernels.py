"""ATen kernels through ``torch.ops``: allowed operators torch knows, by name and overload.

Only names in :func:`pyrt.kernels.allowed_operators` (ExecuTorch's kernel set
plus pyrt's documented extras) are looked up: ``torch.ops`` also reaches
operators with side effects (``aten::from_file``, ``aten::_print``, anything a
loaded extension registered), which a .pte must never call.

Arguments follow the operator's schema (positional, then keyword-only ones as
keywords); out-variants write into the arena views the plan built, so no
output is allocated on the hot path. Returns that alias an out argument are
already in place; other returns (``aten::sym_size.int`` style scalars) rebind
their value slot. Dynamic-shape outputs are emptied before the call so torch
resizes them in place (their storage is the arena, which cannot grow) and are
checked against their memory-planned bound afterwards.

>>> from pyrt.pte_reader import Operator
>>> TorchLibrary().lookup(Operator("aten::add", "out")).name           # doctest: +SKIP
'aten::add.out'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyrt.errors import InputError, UnsupportedOperatorError
from pyrt.kernels import RANDOM_OPS, Kernel, KernelSite, Step, allowed_operators, with_steady
from pyrt.pte_reader import Operator
from pyrt.tensors import Value

_FOUND: dict[str, Kernel] = {}
VIEW_OPS = {  # *_copy operators -> the aten view op giving the same result as a view of the input
    "aten::permute_copy": "permute", "aten::squeeze_copy": "squeeze", "aten::unsqueeze_copy": "unsqueeze",
    "aten::view_copy": "view", "aten::alias_copy": "alias", "aten::slice_copy": "slice",
    "aten::select_copy": "select", "aten::split_copy": "split", "aten::split_with_sizes_copy": "split_with_sizes",
    "aten::unbind_copy": "unbind", "aten::expand_copy": "expand", "aten::transpose_copy": "transpose",
    "aten::t_copy": "t", "aten::diagonal_copy": "diagonal", "aten::narrow_copy": "narrow",
    "aten::detach_copy": "detach",
}


class TorchLibrary:
    """Resolve ``ns::name.overload`` to ``torch.ops.ns.name.overload``."""

    name = "torch"

    def __init__(self) -> None:
        import torch

        self.torch = torch

    def lookup(self, op: Operator) -> Kernel | None:
        """The kernel of ``op``; found kernels are kept for the process (they hold no program state)."""
        kernel = _FOUND.get(op.qualified_name)
        if kernel is None:
            kernel = self._lookup(op)
            if kernel is not None:
                _FOUND[op.qualified_name] = kernel
        return kernel

    def _lookup(self, op: Operator) -> Kernel | None:
        overload = self._overload(op)
        if overload is None:
            return None
        schema = overload._schema
        fast = self._binding(op, schema)
        sig = _Signature(schema)
        return Kernel(
            op.qualified_name,
            build=lambda site: _build(overload, sig, site, fast),
            rebinds=_rebinds(schema),
            writes=_writes(schema),
            pure=op.name not in RANDOM_OPS and not any("Generator" in str(a.type) for a in schema.arguments),
            view=self._view(op, schema),
        )

    def _view(self, op: Operator, schema: Any) -> Callable[[list[Value], tuple[int, ...]], Any] | None:
        """``(vals, args) -> view`` of a ``*_copy`` out-variant through its view op (``VIEW_OPS``)."""
        base = VIEW_OPS.get(op.name)
        if base is None:
            return None
        name = op.overload.removesuffix("out").removesuffix("_") or "default"
        view_op = getattr(getattr(self.torch.ops.aten, base, None), name, None)
        if view_op is None:
            return None
        ins = [a for a in schema.arguments if not (a.alias_info is not None and a.alias_info.is_write)]
        if [a.name for a in view_op._schema.arguments] != [a.name for a in ins]:
            return None
        pos = [k for k, a in enumerate(schema.arguments) if a in ins and not a.kwarg_only]
        kw = [(a.name, k) for k, a in enumerate(schema.arguments) if a in ins and a.kwarg_only]

        def view(vals: list[Value], args: tuple[int, ...]) -> Any:
            return view_op(*[vals[args[k]] for k in pos], **{n: vals[args[k]] for n, k in kw})

        return view

    def _overload(self, op: Operator) -> Any:
        if op.qualified_name not in allowed_operators():
            return None
        ns, sep, name = op.name.partition("::")
        if not sep or not ns or not name:
            return None
        try:
            packet = getattr(getattr(self.torch.ops, ns), name)
            return getattr(packet, op.overload or "default")
        except (AttributeError, RuntimeError):
            return None

    def _binding(self, op: Operator, schema: Any) -> Callable[..., Any] | None:
        """torch's Python binding of an ``aten`` out-variant (faster to call than ``torch.ops``): ``torch.<op>``
        or, for NN ops, ``torch._C._nn.<op>``."""
        ns, _, name = op.name.partition("::")
        writes_out = any(a.kwarg_only and a.alias_info is not None and a.alias_info.is_write
                         for a in schema.arguments)
        if ns != "aten" or not writes_out or any(r.alias_info is None for r in schema.returns):
            return None
        if op.qualified_name == "aten::relu.out":  # ATen's relu is clamp_min(self, 0); its binding has no out=
            clamp_min = self.torch._C._VariableFunctions.clamp_min
            return lambda x, *, out: clamp_min(x, 0, out=out)
        found = getattr(self.torch._C._VariableFunctions, name, None)
        return found if found is not None else getattr(self.torch._C._nn, name, None)  # gelu, elu, pads...


def _rebinds(schema: Any) -> Callable[[tuple[int, ...]], list[int]]:
    """``args -> slots`` of returns that are not aliases of an argument (scalar results, fresh tensors).

    The positions come from the schema once per operator, not once per instruction.
    """
    n = len(schema.arguments)
    plain = [n + j for j, ret in enumerate(schema.returns) if ret.alias_info is None]
    return lambda args: [args[k] for k in plain if k < len(args)]


def _writes(schema: Any) -> Callable[[tuple[int, ...]], list[int]]:
    """``args -> written values``: the arguments the schema marks ``Tensor(a!)`` (outs, in-place ``self``).

    Return slots after the arguments that are not fresh results alias those outs (ExecuTorch
    also writes a slot for ``-> ()`` out-variants such as ``split_copy``): written too.
    """
    n = len(schema.arguments)
    positions = [k for k, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write]
    fresh = {n + j for j, r in enumerate(schema.returns) if r.alias_info is None}
    return lambda args: ([args[k] for k in positions if k < len(args)]
                         + [args[k] for k in range(n, len(args)) if k not in fresh])


def _is_tensor_type(type_str: str) -> bool:
    return type_str in ("Tensor", "List[Tensor]", "Optional[Tensor]", "List[Optional[Tensor]]")


class _Signature:
    """What every step of one operator needs from its schema, worked out once per operator."""

    __slots__ = ("n", "tensor_args", "pos_idx", "kw", "plain_returns", "n_returns", "out_args")

    def __init__(self, schema: Any) -> None:
        args = schema.arguments
        self.n = len(args)
        self.tensor_args = [k for k, a in enumerate(args) if _is_tensor_type(str(a.type))]
        self.pos_idx = [k for k, a in enumerate(args) if not a.kwarg_only]
        self.kw = [(a.name, k) for k, a in enumerate(args) if a.kwarg_only]
        self.plain_returns = [j for j, r in enumerate(schema.returns) if r.alias_info is None]
        self.n_returns = len(schema.returns)
        self.out_args = [k for k, a in enumerate(args)
                         if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write]


def _build(overload: Any, sig: _Signature, site: KernelSite, fast: Callable[..., Any] | None = None) -> Step:
    n = sig.n
    site.require_args(n)
    fn = overload._op
    for k in sig.tensor_args:
        _reject_device(site, k)
    returns = [(j, site.setter(n + j)) for j in sig.plain_returns if n + j < len(site.args)]
    dyn_outs = _dynamic_outs(sig.out_args, site)
    call = _bind_call(fn, site, sig.pos_idx, sig.kw, fast)
    if not returns and not dyn_outs:
        return call
    where = site.where
    multiple = sig.n_returns > 1
    if not returns and len(dyn_outs) == 1 and dyn_outs[0][2] is not None:
        return _one_dynamic_out(call, dyn_outs[0][2], dyn_outs[0][1], where)

    def step() -> None:
        for t, _cap, _ in dyn_outs:
            t().resize_(0)
        result = call()
        for j, store in returns:
            store(result[j] if multiple else result)
        for t, cap, _ in dyn_outs:
            if t().numel() > cap:
                raise InputError(f"{where}: output of shape {tuple(t().shape)} exceeds its memory-planned "
                                 f"bound of {cap} elements")

    if not returns:
        return with_steady(step, call)

    def steady() -> None:  # outputs already have this run's shapes (pyrt.steady)
        result = call()
        for j, store in returns:
            store(result[j] if multiple else result)

    return with_steady(step, steady)


def _reject_device(site: KernelSite, k: int) -> None:
    table = site.table
    idxs = [site.args[k]]
    if site.kind(k) in ("TensorList", "OptionalTensorList"):
        idxs = [j for j in table.items[site.args[k]] if j >= 0]
    for j in idxs:
        info = table.infos.get(j)
        if info is not None and info.device is not None:
            raise UnsupportedOperatorError(
                f"{site.where}: argument {k} (value {j}) lives in CUDA memory; only delegates and "
                f"et_copy ops may touch device tensors"
            )


def _one_dynamic_out(call: Callable[[], Any], out: Any, cap: int, where: str) -> Step:
    """The common dynamic step: one out tensor, the same object every run (torch resizes it in place)."""
    resize, numel = out.resize_, out.numel

    def step() -> None:
        resize(0)
        call()
        if numel() > cap:
            raise InputError(f"{where}: output of shape {tuple(out.shape)} exceeds its memory-planned "
                             f"bound of {cap} elements")

    return with_steady(step, call)


def _dynamic_outs(out_args: list[int], site: KernelSite) -> list[tuple[Callable[[], Any], int, Any]]:
    """(getter, element bound, the tensor when its slot never changes) of each dynamic out tensor."""
    out = []
    table = site.table
    for k in out_args:
        idxs = [site.args[k]]
        if site.kind(k) == "TensorList":
            idxs = list(table.items[site.args[k]])
        for j in idxs:
            info = table.infos.get(j)
            if info is not None and info.dynamic:
                out.append((table.getter(j), info.capacity, table.vals[j] if table.is_const(j) else None))
    return out


def _bind_call(fn: Callable[..., Any], site: KernelSite, pos_idx: list[int],
               kw: list[tuple[str, int]], fast: Callable[..., Any] | None = None) -> Callable[[], Any]:
    """A closure calling ``fn`` with the instruction's arguments, constants captured now.

    With ``fast`` (torch's Python binding of the same out-variant) the closure
    calls that instead; if its argument parser rejects the call (TypeError, raised
    before any work is done) the closure falls back to ``fn`` for good.
    """
    ks = pos_idx + [k for _, k in kw]
    impl = [fast or fn]
    if all(site.is_const(k) for k in ks):
        pos = tuple(site.value(k) for k in pos_idx)
        kwargs = {name: site.value(k) for name, k in kw}
        if fast is None:
            return lambda: fn(*pos, **kwargs)

        def call_const() -> Any:
            try:
                return impl[0](*pos, **kwargs)
            except TypeError:
                if impl[0] is fn:
                    raise
                impl[0] = fn
                return fn(*pos, **kwargs)

        return call_const
    # Constants are placed once; only the slots rebound at run time are read per call.
    template = [site.value(k) if site.is_const(k) else None for k in pos_idx]
    pos_get = [(n, site.getter(k)) for n, k in enumerate(pos_idx) if not site.is_const(k)]
    kw_const = {name: site.value(k) for name, k in kw if site.is_const(k)}
    kw_get = [(name, site.getter(k)) for name, k in kw if not site.is_const(k)]

    def call() -> Any:
        args = template.copy()
        for n, g in pos_get:
            args[n] = g()
        kwargs = kw_const if not kw_get else {**kw_const, **{name: g() for name, g in kw_get}}
        try:
            return impl[0](*args, **kwargs)
        except TypeError:
            if impl[0] is fn:
                raise
            impl[0] = fn
            return fn(*args, **kwargs)

    return call
