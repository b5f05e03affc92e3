"""Kernels every program may need, independent of torch: ExecuTorch's prim ops and copies.

* ``executorch_prim::{add,sub,mul,floordiv,truediv,mod,eq,gt,...}.Scalar``: symbolic-int
  arithmetic on Int/Double/Bool values (results rebind their return slot);
* ``aten::sym_size.int`` / ``aten::sym_numel``: read a tensor's current shape;
* ``executorch_prim::et_view.default``: a view of a tensor with new sizes;
* ``executorch_prim::et_copy_index.tensor``: ``copy_to[index] = copy_from`` (loop outputs);
* ``dim_order_ops::_to_dim_order_copy.out`` / ``_clone_dim_order.out`` / ``_empty_dim_order.out``
  and ``aten::copy_``;
* ``et_copy::_h2d_copy.out`` / ``et_copy::_d2h_copy.out`` through :mod:`pyrt.cuda`.

Host tensors are numpy arrays or torch tensors (whichever host backend the
plan chose); every kernel here handles both.

>>> from pyrt.pte_reader import Operator
>>> PrimLibrary().lookup(Operator("executorch_prim::add", "Scalar")).name
'executorch_prim::add.Scalar'
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeAlias, cast

import numpy as np

from pyrt.errors import InputError
from pyrt.kernels.base import Kernel, KernelSite, Step, shape_only
from pyrt.kernels.numpy_index import put_into
from pyrt.memory.host import TorchHost
from pyrt.memory.layout import numpy_dtype
from pyrt.memory.tensors import DeviceTensor, HostTensor, Value
from pyrt.pte_reader import Operator

if TYPE_CHECKING:
    import torch

    from pyrt.memory.table import DeviceStreams, ValueTable

Num: TypeAlias = int | float | bool  # the SymInt/SymFloat/SymBool values executorch_prim ops compute on


def _floordiv(a: Num, b: Num) -> Num:
    if b == 0:
        raise InputError(f"executorch_prim::floordiv: division of {a} by zero")
    return a // b


def _truediv(a: Num, b: Num) -> float:
    if b == 0:
        raise InputError(f"executorch_prim::truediv: division of {a} by zero")
    return a / b


def _mod(a: Num, b: Num) -> Num:
    if b == 0:
        raise InputError(f"executorch_prim::mod: modulo of {a} by zero")
    return a % b


_BINARY: dict[str, Callable[[Num, Num], Num]] = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "floordiv": _floordiv,
    "truediv": _truediv, "mod": _mod, "eq": operator.eq, "gt": operator.gt, "lt": operator.lt,
    "ge": operator.ge, "le": operator.le, "sym_max": max, "sym_min": min,
}
_UNARY: dict[str, Callable[[Num], Num]] = {
    "neg": operator.neg, "sym_float": float, "sym_int": int, "ceil": math.ceil, "round": round,
    "trunc": math.trunc, "sym_not": operator.not_,
}


def _scalar_kernel(name: str, fn: Callable[..., Value], arity: int) -> Kernel:
    def build(site: KernelSite) -> Step:
        site.require_args(arity + 1)
        getters = [site.getter(k) for k in range(arity)]
        store = site.setter(arity)
        if arity == 1:
            (a,) = getters
            step: Step = lambda: store(fn(a()))  # noqa: E731
        elif arity == 2:
            a, b = getters
            step = lambda: store(fn(a(), b()))  # noqa: E731
        else:
            step = lambda: store(fn(*(g() for g in getters)))  # noqa: E731
        return shape_only(step, _scalar_reads(site, range(arity)), site.args[arity:arity + 1])

    return Kernel(name, build, rebinds=lambda args: args[arity:arity + 1], needs_library=False,
                  writes=_tensor_alias, pure=True)


def _ite(b: Value, t: Value, f: Value) -> Value:
    return t if b else f


def _sym_size(site: KernelSite) -> Step:
    site.require_args(3)
    get_t, get_d, store = site.getter(0), site.getter(1), site.setter(2)
    return shape_only(lambda: store(int(get_t().shape[get_d()])), _scalar_reads(site, [1]), site.args[2:3])


def _sym_numel(site: KernelSite) -> Step:
    site.require_args(2)
    get_t, store = site.getter(0), site.setter(1)
    return shape_only(lambda: store(int(math.prod(get_t().shape))), (), site.args[1:2])


def _et_view(site: KernelSite) -> Step:
    """``et_view(self, size) -> out``: out shares self's memory with the new sizes."""
    site.require_args(3)
    get_t, get_size, store = site.getter(0), site.getter(1), site.setter(2)
    where = site.where

    def view() -> None:
        t = get_t()
        size = [int(s) for s in get_size()]
        if isinstance(t, DeviceTensor):
            store(DeviceTensor(t.allocation, t.offset, t.scalar_type, _infer(size, math.prod(t.shape), where),
                               t.capacity, (), t.keepalive))
            return
        store(t.reshape(size))

    return shape_only(view, _scalar_reads(site, [1]), site.args[2:3], tensor=site.args[0])


def _scalar_reads(site: KernelSite, ks: Iterable[int]) -> tuple[int, ...]:
    """The values arguments ``ks`` read (an IntList: its items, read through the list at run time)."""
    out: list[int] = []
    for k in ks:
        i = site.args[k]
        items = site.table.items.get(i)
        out.extend([i] if items is None else [j for j in items if j >= 0])
    return tuple(out)


def _infer(size: list[int], numel: int, where: str) -> tuple[int, ...]:
    if -1 in size:
        known = math.prod(s for s in size if s != -1)
        size = [numel // known if s == -1 and known else s for s in size]
    if math.prod(size) != numel:
        raise InputError(f"{where}: cannot view {numel} elements as {size}")
    return tuple(size)


def _copy_into(dst: Any, src: Any, torch_host: bool) -> None:  # Any: torch tensors or arrays, per torch_host
    if torch_host:
        dst.copy_(src)
    else:
        np.copyto(dst, src, casting="unsafe")


def _resizing_out(site: KernelSite, k: int) -> Callable[[tuple[int, ...]], HostTensor]:
    """Return ``shape -> out tensor`` for argument ``k`` (resizing dynamic outputs)."""
    info = site.info(k)
    table, idx = site.table, site.args[k]
    get = site.getter(k)
    if info is None or not info.dynamic:
        return lambda shape: get()

    def out(shape: tuple[int, ...]) -> HostTensor:
        t = get()
        return t if tuple(t.shape) == tuple(shape) else table.resize(idx, shape)

    return out


def _to_dim_order_copy(site: KernelSite) -> Step:
    """``(self, *, non_blocking, dim_order, out)``: copy with dtype conversion; out carries the layout."""
    site.require_args(4)
    get_src, out_for = site.getter(0), _resizing_out(site, 3)
    torch_host = isinstance(site.table.host, TorchHost)
    src_info, out_info = site.info(0), site.info(3)
    if (torch_host and site.is_const(0) and site.is_const(3) and src_info is not None and out_info is not None
            and not src_info.dynamic and not out_info.dynamic and src_info.device is None and out_info.device is None):
        return functools.partial(site.value(3).copy_, site.value(0))  # the same tensors every run

    def copy() -> None:
        src = get_src()
        _copy_into(out_for(tuple(src.shape)), src, torch_host)

    return copy


def _empty_dim_order(site: KernelSite) -> Step:
    """``(size, *, dim_order, out)``: only resizes out (contents unspecified)."""
    site.require_args(3)
    get_size, out_for = site.getter(0), _resizing_out(site, 2)

    def empty() -> None:
        out_for(tuple(int(s) for s in get_size()))

    return empty


def _copy_(site: KernelSite) -> Step:
    """``aten::copy_(self, src, non_blocking) -> self``: in place, broadcasting src.

    Between two device tensors (a mutable buffer kept in device memory and the engine
    output that updates it) it is a device-to-device copy on the device's stream.
    """
    site.require_args(2)
    get_dst, get_src = site.getter(0), site.getter(1)
    table, where = site.table, site.where
    torch_host = isinstance(table.host, TorchHost)

    def copy() -> None:
        dst, src = get_dst(), get_src()
        if isinstance(dst, DeviceTensor) or isinstance(src, DeviceTensor):
            _copy_device(dst, src, table, where)
        else:
            _copy_into(dst, src, torch_host)

    return copy


def _index_put_(site: KernelSite) -> Step:
    """``aten::index_put_(self, indices, values, accumulate) -> self``: in place.

    ExecuTorch's reinplace pass writes a mutable buffer's ``index_put`` this way (the KV caches of
    pyrt's slot files): the cache is updated where it lies, not copied into a new tensor and back.
    """
    site.require_args(4)
    get_dst, get_indices, get_values, get_accumulate = (site.getter(k) for k in range(4))
    table, where = site.table, site.where
    torch_host = isinstance(table.host, TorchHost)

    def put() -> None:
        dst, indices, values = get_dst(), list(get_indices()), get_values()
        if isinstance(dst, DeviceTensor) or isinstance(values, DeviceTensor):
            raise InputError(f"{where}: index_put_ on device memory (engines update device buffers)")
        if torch_host:  # torch tensors: torch is imported already
            import torch

            try:
                torch.ops.aten.index_put_.default(dst, indices, values, bool(get_accumulate()))
            except (IndexError, RuntimeError) as exc:
                raise InputError(f"{where}: index_put_: {exc}") from None
        else:
            put_into(dst, indices, values, bool(get_accumulate()))

    return put


def _copy_device(dst: Value, src: Value, table: ValueTable, where: str) -> None:
    if not (isinstance(dst, DeviceTensor) and isinstance(src, DeviceTensor)):
        raise InputError(f"{where}: copy_ between host and device memory (use et_copy's h2d/d2h copies)")
    if tuple(dst.shape) != tuple(src.shape) or dst.scalar_type != src.scalar_type:
        raise InputError(f"{where}: copy_ of {src.dtype}{list(src.shape)} into {dst.dtype}{list(dst.shape)} "
                         "(device copies take equal shapes and dtypes)")
    if src.dim_order != dst.dim_order:
        raise InputError(f"{where}: copy_ between dim orders {src.dim_order} and {dst.dim_order}")
    if src.nbytes and (src.allocation is not dst.allocation or src.offset != dst.offset):
        devices = _devices(table, where)
        seam = devices.cuda
        kw: dict[str, Any] = {"dst_offset": dst.offset, "src_offset": src.offset, "stream": devices.stream(dst.device)}
        if src.device == dst.device:
            seam.memcpy_dtod(dst.allocation, src.allocation, src.nbytes, **kw)
        else:
            devices.order(src.device, dst.device)  # the source's writer (on its device's stream) first
            seam.memcpy_peer(dst.allocation, src.allocation, src.nbytes, **kw)


def _copy_index(site: KernelSite) -> Step:
    """``et_copy_index(copy_to, copy_from, index)``: ``copy_to[index] = copy_from``, growing dim 0."""
    site.require_args(3)
    get_from, get_index = site.getter(1), site.getter(2)
    table, idx = site.table, site.args[0]
    torch_host = isinstance(site.table.host, TorchHost)

    def copy() -> None:
        src, i = get_from(), int(get_index())
        dst: HostTensor = table.vals[idx]  # type: ignore[assignment]  # a host tensor list's arena tensor
        if dst.shape[0] <= i or tuple(dst.shape[1:]) != tuple(src.shape):
            dst = table.resize(idx, (i + 1, *src.shape))
        _copy_into(dst[i], src, torch_host)

    return copy


# -- device copies ---------------------------------------------------------------------------------


def _h2d(site: KernelSite) -> Step:
    """``et_copy::_h2d_copy.out(self, *, out)``: host tensor -> device tensor."""
    site.require_args(2)
    get_src, get_dst = site.getter(0), site.getter(1)
    table = site.table
    torch_host = isinstance(table.host, TorchHost)
    where = site.where

    def h2d() -> None:
        src, dst = get_src(), get_dst()
        if not isinstance(dst, DeviceTensor):
            raise InputError(f"{where}: out is not in device memory")
        dst.resize(tuple(src.shape), where)
        arr = src.numpy() if torch_host else src
        if arr.dtype != numpy_dtype(dst.scalar_type):
            raise InputError(f"{where}: {arr.dtype} -> {dst.dtype} copies are not supported")
        if arr.nbytes:
            devices = _devices(table, where)
            devices.copy_to_device(dst.allocation, arr, devices.stream(dst.device), dst_offset=dst.offset)

    return h2d


def _d2h(site: KernelSite) -> Step:
    """``et_copy::_d2h_copy.out(self, *, out)``: device tensor -> host tensor (synchronises)."""
    site.require_args(2)
    get_src = site.getter(0)
    out_for = _resizing_out(site, 1)
    table = site.table
    torch_host = isinstance(table.host, TorchHost)
    where = site.where

    def d2h() -> None:
        src = get_src()
        if not isinstance(src, DeviceTensor):
            raise InputError(f"{where}: self is not in device memory")
        dst = out_for(src.shape)
        arr = cast("torch.Tensor", dst).numpy() if torch_host else cast(np.ndarray, dst)
        if arr.dtype != numpy_dtype(src.scalar_type) or not arr.flags.c_contiguous:
            raise InputError(f"{where}: out must be a contiguous {src.dtype} tensor")
        if src.nbytes:
            devices = _devices(table, where)
            stream = devices.stream(src.device)
            devices.cuda.memcpy_dtoh(arr, src.allocation, src_offset=src.offset, stream=stream)
            stream.synchronize()  # host kernels read it next

    return d2h


def _devices(table: ValueTable, where: str) -> DeviceStreams:
    """The method's device context (every method with a device tensor has one)."""
    if table.devices is None:
        raise InputError(f"{where}: a device copy in a method without CUDA memory")
    return table.devices


def _tensor_alias(args: tuple[int, ...]) -> tuple[int, ...]:
    return ()


_SPECIAL: dict[str, Callable[[KernelSite], Step]] = {
    "aten::sym_size.int": _sym_size,
    "aten::sym_numel": _sym_numel,
    "aten::sym_numel.default": _sym_numel,
    "executorch_prim::et_view.default": _et_view,
    "executorch_prim::et_copy_index.tensor": _copy_index,
    "dim_order_ops::_to_dim_order_copy.out": _to_dim_order_copy,
    "dim_order_ops::_clone_dim_order.out": _to_dim_order_copy,
    "dim_order_ops::_empty_dim_order.out": _empty_dim_order,
    "aten::copy_": _copy_,
    "aten::copy_.default": _copy_,
    "aten::index_put_": _index_put_,
    "et_copy::_h2d_copy.out": _h2d,
    "et_copy::_d2h_copy.out": _d2h,
}
_REBINDS: dict[str, Callable[[tuple[int, ...]], tuple[int, ...]]] = {
    "aten::sym_size.int": lambda a: a[2:3],
    "aten::sym_numel": lambda a: a[1:2],
    "aten::sym_numel.default": lambda a: a[1:2],
    "executorch_prim::et_view.default": lambda a: a[2:3],
    "executorch_prim::et_copy_index.tensor": lambda a: a[0:1],
}


_WRITES: dict[str, Callable[[tuple[int, ...]], tuple[int, ...]]] = {  # tensors written in place
    "executorch_prim::et_copy_index.tensor": lambda a: a[0:1],
    "dim_order_ops::_to_dim_order_copy.out": lambda a: a[3:4],
    "dim_order_ops::_clone_dim_order.out": lambda a: a[3:4],
    "dim_order_ops::_empty_dim_order.out": lambda a: a[2:3],
    "aten::copy_": lambda a: a[0:1] + a[3:4],
    "aten::copy_.default": lambda a: a[0:1] + a[3:4],
    "aten::index_put_": lambda a: a[0:1] + a[4:5],
    "et_copy::_h2d_copy.out": lambda a: a[1:2],
    "et_copy::_d2h_copy.out": lambda a: a[1:2],
}


_COPIES = frozenset({"dim_order_ops::_to_dim_order_copy.out", "dim_order_ops::_clone_dim_order.out"})


def _same_tensor(vals: list[Value], args: tuple[int, ...]) -> torch.Tensor:
    """A copy's result as a view of its input (torch hosts; :mod:`pyrt.runtime.fold` checks dtype and layout)."""
    return cast("torch.Tensor", vals[args[0]])[...]


_VIEWS: dict[str, Callable[[list[Value], tuple[int, ...]], torch.Tensor]] = dict.fromkeys(_COPIES, _same_tensor)


_PURE = frozenset({"aten::sym_size.int", "aten::sym_numel", "aten::sym_numel.default",
                   "executorch_prim::et_view.default", "dim_order_ops::_to_dim_order_copy.out",
                   "dim_order_ops::_clone_dim_order.out", "dim_order_ops::_empty_dim_order.out"})


class PrimLibrary:
    """ExecuTorch's prim ops and copies; usable with either host backend and without torch."""

    name = "prim"

    def lookup(self, op: Operator) -> Kernel | None:
        q = op.qualified_name
        if q in _SPECIAL:
            return Kernel(q, _SPECIAL[q], rebinds=_REBINDS.get(q, _tensor_alias), needs_library=False,
                          writes=_WRITES.get(q, _tensor_alias), pure=q in _PURE, view=_VIEWS.get(q),
                          strided=q in _COPIES)
        ns, _, base = op.name.partition("::")
        if ns != "executorch_prim" or op.overload not in ("Scalar", "int", "float", "default"):
            return None
        if base in _BINARY:
            return _scalar_kernel(q, _BINARY[base], 2)
        if base in _UNARY:
            return _scalar_kernel(q, _UNARY[base], 1)
        if base == "sym_ite":
            return _scalar_kernel(q, _ite, 3)
        return None
