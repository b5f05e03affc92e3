"""ATen kernels through ``torch.ops``: allowed operators torch knows, by name and overload.

Only names in :func:`pyrt.kernels.allowlist.allowed_operators` (ExecuTorch's kernel set
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

if TYPE_CHECKING:  # torch is imported lazily, by TorchLibrary
    import torch
    from torch._ops import OpOverload
>>> TorchLibrary().lookup(Operator("aten::add", "out")).name           # doctest: +SKIP
'aten::add.out'
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from pyrt.errors import InputError, UnsupportedOperatorError
from pyrt.kernels import quantized, small_numpy_fastpath, small_numpy_fastpath_args, torch_inplace, torch_outs
from pyrt.kernels.allowlist import allowed_operators
from pyrt.kernels.base import RANDOM_OPS, Kernel, KernelSite, Step, with_steady
from pyrt.memory.tensors import Value
from pyrt.pte_reader import Operator

if TYPE_CHECKING:  # torch is imported lazily, by TorchLibrary
    import torch
    from torch._ops import OpOverload

_FOUND: dict[tuple[str, int], Kernel] = {}
VIEW_OPS = {  # *_copy operators -> the aten view op giving the same result as a view of the input
    "aten::permute_copy": "permute", "aten::squeeze_copy": "squeeze", "aten::unsqueeze_copy": "unsqueeze",
    "aten::view_copy": "view", "aten::alias_copy": "alias", "aten::slice_copy": "slice",
    "aten::select_copy": "select", "aten::split_copy": "split", "aten::split_with_sizes_copy": "split_with_sizes",
    "aten::unbind_copy": "unbind", "aten::expand_copy": "expand", "aten::transpose_copy": "transpose",
    "aten::t_copy": "t", "aten::diagonal_copy": "diagonal", "aten::narrow_copy": "narrow",
    "aten::detach_copy": "detach",
}

BYTE_VIEW_OPS = frozenset({  # operators whose result depends on the input's strides, not only its values
    "aten::as_strided_copy", "aten::as_strided", "aten::_unsafe_view", "aten::set_", "aten::view",
    "aten::_reshape_alias", "aten::_reshape_alias_copy", "aten::as_strided_scatter"})


class TorchLibrary:
    """Resolve ``ns::name.overload`` to ``torch.ops.ns.name.overload``.

    ``small_numel``: instructions whose tensors are static, fixed and at most this many
    elements each run through numpy views of the same memory where numpy computes what
    torch does (:mod:`pyrt.kernels.small_numpy_fastpath`); 0 calls torch for everything.
    """

    name = "torch"

    def __init__(self, small_numel: int = small_numpy_fastpath_args.SMALL_NUMEL) -> None:
        import torch

        self.torch = torch
        self.small_numel = small_numel

    def lookup(self, op: Operator) -> Kernel | None:
        """The kernel of ``op``; found kernels are kept for the process (they hold no program state)."""
        key = (op.qualified_name, self.small_numel)
        kernel = _FOUND.get(key)
        if kernel is None:
            kernel = self._lookup(op)
            if kernel is not None:
                _FOUND[key] = kernel
        return kernel

    def _lookup(self, op: Operator) -> Kernel | None:
        if op.qualified_name in quantized.OPS:  # pyrt's own: torch.ops has them only where executorch is imported
            return quantized.torch_kernel(op.qualified_name)
        overload = self._overload(op)
        if overload is None:
            return None
        schema = overload._schema
        fast = self._bindings(op, schema)
        sig = _Signature(schema)
        names = [a.name for a in schema.arguments]
        tensors = [a.name for a in schema.arguments if _is_tensor_type(str(a.type))]
        small = small_numpy_fastpath.builder(op.qualified_name, names, tensors, self.small_numel)
        later = small_numpy_fastpath.rebinder(op.qualified_name, names, tensors, self.small_numel)
        return Kernel(
            op.qualified_name,
            build=lambda site: _build(overload, sig, site, fast, small, later),
            rebinds=_rebinds(schema),
            writes=_writes(schema),
            pure=op.name not in RANDOM_OPS and not any("Generator" in str(a.type) for a in schema.arguments),
            view=self._view(op, schema),
            strided=op.name not in BYTE_VIEW_OPS,
        )

    def _view(self, op: Operator, schema: torch.FunctionSchema) -> Callable[[list[Value], tuple[int, ...]], Any] | None:
        """``(vals, args) -> view`` of a ``*_copy`` out-variant through its view op (``VIEW_OPS``)."""
        if op.qualified_name == "aten::cat.out":
            return _cat_of_one
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

    def _overload(self, op: Operator) -> OpOverload | None:
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

    def _bindings(self, op: Operator, schema: torch.FunctionSchema) -> list[Callable[..., Any]]:
        """Faster entry points than ``torch.ops`` for an ``aten`` out-variant, to try in order.

        torch's Python binding called with ``out=`` (``torch.<op>`` or, for NN ops,
        ``torch._C._nn.<op>``); then, for operators whose binding has no ``out=``
        (``native_layer_norm``, ``embedding``, ``convolution``...), the functional binding
        with its results copied into the outs (what ATen's generated out wrappers do).
        Each raises TypeError before writing anything where it does not apply.
        """
        ns, _, name = op.name.partition("::")
        outs = [a for a in schema.arguments if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write]
        if ns != "aten" or not outs or any(r.alias_info is None for r in schema.returns):
            return []
        vf = self.torch._C._VariableFunctions
        if op.qualified_name == "aten::relu.out":  # ATen's relu is clamp_min(self, 0); its binding has no out=
            clamp_min = vf.clamp_min
            return [lambda x, *, out: clamp_min(x, 0, out=out)]
        if op.qualified_name in torch_inplace.ENTRY_POINTS:  # ATen's own would clone the arena behind self
            return [torch_inplace.ENTRY_POINTS[op.qualified_name]]
        found = getattr(vf, name, None)
        if found is None:
            found = getattr(self.torch._C._nn, name, None)  # gelu, elu, pads...
        if found is None:
            return []
        if all(str(a.type) == "Tensor" for a in outs) and len(schema.returns) == len(outs):
            return [found, _functional_out(found, [a.name for a in outs])]
        return [found]


def _cat_of_one(vals: list[Value], args: tuple[int, ...]) -> torch.Tensor:
    """``cat.out`` of a one-tensor list as a view of that tensor (ValueError for longer lists)."""
    tensors = cast("list[torch.Tensor]", vals[args[0]])  # a TensorList slot of the torch library's table
    if len(tensors) != 1:
        raise ValueError("cat of several tensors is no view")
    return tensors[0][...]


def _functional_out(fn: Callable[..., Any], names: list[str], skip: frozenset[str] = frozenset()) -> Callable[..., Any]:
    """``fn(*args, **kwargs, <names>=outs)`` through the functional ``fn``, results copied into the outs
    (those named in ``skip``, which nothing reads, left alone).

    Raises TypeError, before writing anything, where a result's dtype is not its out's.
    ``call.functional`` keeps ``(fn, names)`` for :func:`_skipping`.
    """
    single = len(names) == 1
    keep = [k for k, n in enumerate(names) if n not in skip]

    def call(*args: Any, **kwargs: Any) -> Any:
        kw = kwargs.copy()
        outs = [kw.pop(n) for n in names]
        results = fn(*args, **kw)
        if single:
            results = (results,)
        if len(results) != len(outs) or any(o.dtype != r.dtype for o, r in zip(outs, results, strict=True)):
            raise TypeError(f"{fn.__name__}: results do not match the out tensors")
        for k in keep:
            o, r = outs[k], results[k]
            if o.shape != r.shape:
                o.resize_(r.shape)
            o.copy_(r)
        return outs[0] if single else tuple(outs)

    call.functional = (fn, names)  # type: ignore[attr-defined]
    return call


def _skipping(impls: Sequence[Callable[..., Any]], sig: _Signature, site: KernelSite) -> list[Callable[..., Any]]:
    """``impls`` with the functional entry point copying no result into an out nothing reads."""
    skip = frozenset(name for name, k in sig.kw if k in sig.out_args and site.args[k] in site.unread)
    if not skip:
        return list(impls)
    out = []
    for f in impls:
        functional = getattr(f, "functional", None)
        out.append(f if functional is None else _functional_out(functional[0], functional[1], skip))
    return out


def _rebinds(schema: torch.FunctionSchema) -> Callable[[tuple[int, ...]], list[int]]:
    """``args -> slots`` of returns that are not aliases of an argument (scalar results, fresh tensors).

    The positions come from the schema once per operator, not once per instruction.
    """
    n = len(schema.arguments)
    plain = [n + j for j, ret in enumerate(schema.returns) if ret.alias_info is None]
    return lambda args: [args[k] for k in plain if k < len(args)]


def _writes(schema: torch.FunctionSchema) -> Callable[[tuple[int, ...]], list[int]]:
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

    __slots__ = ("n", "tensor_args", "pos_idx", "kw", "plain_returns", "n_returns", "out_args", "defaults")

    def __init__(self, schema: torch.FunctionSchema) -> None:
        args = schema.arguments
        self.n = len(args)
        self.tensor_args = [k for k, a in enumerate(args) if _is_tensor_type(str(a.type))]
        self.pos_idx = [k for k, a in enumerate(args) if not a.kwarg_only]
        self.kw = [(a.name, k) for k, a in enumerate(args) if a.kwarg_only]
        self.plain_returns = [j for j, r in enumerate(schema.returns) if r.alias_info is None]
        self.n_returns = len(schema.returns)
        self.out_args = [k for k, a in enumerate(args)
                         if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write]
        # keyword-only arguments with a default (``alpha=1``, ``dtype=None``): a call passing
        # exactly the default may leave them out (torch's argument parser is faster without them)
        self.defaults = {k: a.default_value for k, a in enumerate(args)
                         if a.kwarg_only and a.has_default_value() and k not in self.out_args}

    def kwargs(self, site: KernelSite) -> list[tuple[str, int]]:
        """The keyword arguments to pass at ``site``: constants equal to their default are left out."""
        return [(name, k) for name, k in self.kw
                if not (k in self.defaults and site.is_const(k) and _is_default(site.value(k), self.defaults[k]))]


def _is_default(v: Value, default: object) -> bool:
    """Is ``v`` exactly the schema default (same type and value: ``1`` is not ``1.0`` or ``True``)?"""
    return type(v) is type(default) and v == default


def _build(overload: OpOverload, sig: _Signature, site: KernelSite, fast: Sequence[Callable[..., Any]] = (),
           small: Callable[[KernelSite], Step | None] | None = None,
           later: Callable[[KernelSite], small_numpy_fastpath.Rebind | None] | None = None) -> Step:
    """The step of one call: numpy on small static tensors (``small``), else torch, with steady runs
    of dynamic calls on numpy where ``later`` can bind their tensors (:mod:`pyrt.kernels.small_numpy_fastpath`)."""
    n = sig.n
    site.require_args(n)
    for k in sig.tensor_args:
        _reject_device(site, k)
    if small is not None and (step := small(site)) is not None:
        return step
    step = _build_torch(overload, sig, site, fast)
    rebind = later(site) if later is not None and not sig.plain_returns else None
    return step if rebind is None else _rebinding(step, rebind)


def _rebinding(step: Step, rebind: small_numpy_fastpath.Rebind) -> Step:
    """``step`` with a steady variant on numpy, bound at the first steady run after each full run.

    A steady run repeats the last full run's shapes (:mod:`pyrt.runtime.steady`). Where the call reads
    slots a run rebinds, the steady chain asks ``step.steady_if(stable)``: numpy only when those
    slots are among the ones its steady runs leave alone, else the torch call.
    """
    torch_steady = getattr(step, "steady", step)
    bound: list[Step | None] = [None]

    def full() -> None:
        bound[0] = None
        step()

    def numpy_steady() -> None:
        s = bound[0]
        if s is None:
            s = bound[0] = rebind.bind() or torch_steady
        s()

    numpy_steady.bound = bound  # type: ignore[attr-defined]  # what the steady runs now call (tests)
    slots = rebind.slots
    with_steady(full, torch_steady if slots else numpy_steady)
    full.run_context = small_numpy_fastpath.quiet  # type: ignore[attr-defined]  # its steady runs may call numpy
    full.steady_if = lambda stable: numpy_steady if slots <= stable else torch_steady  # type: ignore[attr-defined]
    return full


def _build_torch(overload: OpOverload, sig: _Signature, site: KernelSite, fast: Sequence[Callable[..., Any]]) -> Step:
    return torch_outs.checking_static_outs(_build_torch_call(overload, sig, site, fast), site, sig.out_args,
                                           sig.tensor_args)


def _build_torch_call(overload: OpOverload, sig: _Signature, site: KernelSite,
                      fast: Sequence[Callable[..., Any]]) -> Step:
    n = sig.n
    fn = overload._op
    returns = [(j, site.setter(n + j)) for j in sig.plain_returns if n + j < len(site.args)]
    dyn_outs = _dynamic_outs(sig.out_args, site)
    call = _bind_call(fn, site, sig.pos_idx, sig.kwargs(site), _skipping(fast, sig, site) if site.unread else fast)
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

    def steady() -> None:  # outputs already have this run's shapes (pyrt.runtime.steady)
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


def _one_dynamic_out(call: Callable[[], Any], out: torch.Tensor, cap: int, where: str) -> Step:
    """The common dynamic step: one out tensor, the same object every run (torch resizes it in place)."""
    resize, numel = out.resize_, out.numel

    def step() -> None:
        resize(0)
        call()
        if numel() > cap:
            raise InputError(f"{where}: output of shape {tuple(out.shape)} exceeds its memory-planned "
                             f"bound of {cap} elements")

    return with_steady(step, call)


def _dynamic_outs(out_args: list[int],
                  site: KernelSite) -> list[tuple[Callable[[], torch.Tensor], int, torch.Tensor | None]]:
    """(getter, element bound, the tensor when its slot never changes) of each dynamic out tensor.

    The torch library's table holds torch tensors (a ``TorchHost``), so its tensor slots are ``torch.Tensor``.
    """
    out = []
    table = site.table
    for k in out_args:
        idxs = [site.args[k]]
        if site.kind(k) == "TensorList":
            idxs = list(table.items[site.args[k]])
        for j in idxs:
            info = table.infos.get(j)
            if info is not None and info.dynamic:
                fixed = table.vals[j] if table.is_const(j) else None
                out.append((cast("Callable[[], torch.Tensor]", table.getter(j)), info.capacity,
                            cast("torch.Tensor | None", fixed)))
    return out


def _bind_call(fn: Callable[..., Any], site: KernelSite, pos_idx: list[int],
               kw: list[tuple[str, int]], fast: Sequence[Callable[..., Any]] = ()) -> Callable[[], Any]:
    """A closure calling ``fn`` with the instruction's arguments, constants captured now.

    With ``fast`` (faster entry points of the same out-variant, see ``TorchLibrary._bindings``)
    the closure calls the first; if it raises TypeError (its argument parser rejects the call,
    raised before any work is done) the closure moves on to the next, then to ``fn``, for good.
    """
    ks = pos_idx + [k for _, k in kw]
    impls = [*fast, fn]
    impl = [impls[0]]

    def fall_back() -> Callable[..., Any]:
        impl[0] = impls[impls.index(impl[0]) + 1]
        return impl[0]

    if all(site.is_const(k) for k in ks):
        pos = tuple(site.value(k) for k in pos_idx)
        kwargs = {name: site.value(k) for name, k in kw}
        if not fast:
            return lambda: fn(*pos, **kwargs)

        def call_const() -> Any:
            while True:
                try:
                    return impl[0](*pos, **kwargs)
                except TypeError:
                    if impl[0] is fn:
                        raise
                    fall_back()

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
        while True:
            try:
                return impl[0](*args, **kwargs)
            except TypeError:
                if impl[0] is fn:
                    raise
                fall_back()

    return call
