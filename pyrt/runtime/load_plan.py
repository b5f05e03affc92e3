"""Phase 1 of loading a method, its load plan: the file's values, tensors and instructions validated, kernels resolved.

Every index from the file is checked here (:class:`~pyrt.errors.PteFormatError` at load,
never an IndexError at run time): list items, tensor storage (arena bounds, alignment,
devices), operator, value, jump and delegate indices; programs that would write constant
data or loop forever are refused; the host memory the load will take is counted. Nothing
is allocated: :mod:`pyrt.runtime.materialize` and :mod:`pyrt.runtime.plan` do phase 2.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from pyrt.device.names import DeviceMap, remap_device
from pyrt.errors import PteFormatError, UnsupportedOperatorError
from pyrt.format.dtypes import ScalarType
from pyrt.format.limits import check_declared
from pyrt.format.pytree import Spec, parse_spec
from pyrt.format.schema import (
    DelegateCall,
    DeviceType,
    JumpFalseCall,
    KernelCall,
    MoveCall,
    Payload,
    ShapeDynamism,
    TensorDataLocation,
    ValueKind,
)
from pyrt.kernels.base import Kernel
from pyrt.kernels.registry import resolve
from pyrt.memory.table import CONSTANT, LIST_KINDS, PLANNED, UNPLANNED, TensorInfo
from pyrt.pte_reader import ExecutionPlan
from pyrt.runtime.delegates import TensorRTDelegate, tensorrt_delegates
from pyrt.runtime.instructions import check_instructions

SCALAR_KINDS = ("Int", "Double", "Bool")


def decode_values(plan: ExecutionPlan) -> tuple[list[ValueKind], dict[int, tuple[int, ...]], list[Payload]]:
    """Kinds, list items (validated) and raw payloads of every value."""
    values = plan.values
    kinds = [v.kind for v in values]
    items: dict[int, tuple[int, ...]] = {}
    for i, v in enumerate(values):
        if v.kind not in LIST_KINDS:
            continue
        want = "Int" if v.kind == "IntList" else "Tensor"
        indices = cast(tuple[int, ...], v.value)  # IntList, TensorList, OptionalTensorList: value indices
        for j in indices:
            if v.kind == "OptionalTensorList" and j < 0:
                continue
            if not 0 <= j < len(values):
                raise PteFormatError(f"{where(plan)}: {v.kind} value {i} item {j} out of range ({len(values)} values)")
            if kinds[j] != want and not (v.kind == "OptionalTensorList" and kinds[j] == "Null"):
                raise PteFormatError(f"{where(plan)}: {v.kind} value {i} item {j} is a {kinds[j]}, not {want}")
        items[i] = indices
    return kinds, items, [v.value for v in values]


_REFUSED_TYPES = frozenset(st for st in ScalarType if st.name.startswith(("Q", "BITS"))) | {
    ScalarType.FLOAT8E5M2FNUZ, ScalarType.FLOAT8E4M3FNUZ}
_STATIC = ShapeDynamism.STATIC
_CONTIGUOUS = tuple(tuple(range(n)) for n in range(17))  # default dim orders, shared


def tensor_infos(plan: ExecutionPlan, device_map: DeviceMap | None) -> dict[int, TensorInfo]:
    """Validated storage of every tensor value (arena bounds, alignment, devices): one pass, no allocation."""
    sizes = plan.non_const_buffer_sizes
    arena_device: dict[int, tuple[DeviceType, int]] = {}
    for bd in plan.non_const_buffer_device:  # the first entry of an arena wins, as in buffer_device()
        arena_device.setdefault(bd.buffer_idx, (bd.device_type, bd.device_index))
    infos: dict[int, TensorInfo] = {}
    for i, v in enumerate(plan.values):
        if v.kind != "Tensor":
            continue
        t = v.tensor
        st, tsizes = t.scalar_type, t.sizes
        if st in _REFUSED_TYPES:
            raise UnsupportedOperatorError(f"{where(plan)}: tensor value {i} has unsupported scalar type {st.name}")
        dim_order = t.dim_order or (_CONTIGUOUS[len(tsizes)] if len(tsizes) < 17 else tuple(range(len(tsizes))))
        if len(dim_order) != len(tsizes):
            raise PteFormatError(f"{where(plan)}: tensor value {i} has dim_order {t.dim_order} for sizes {t.sizes}")
        dynamic = t.shape_dynamism != _STATIC
        alloc, extra = t.allocation_info, t.extra_tensor_info
        external = extra is not None and extra.location == TensorDataLocation.EXTERNAL  # Tensor.is_external
        if external:  # a missing key or a mismatched .ptd entry is reported before any device work
            plan.program.external_data(t)
        if alloc is None:
            storage = CONSTANT if external or t.data_buffer_idx > 0 else UNPLANNED  # Tensor.is_constant
            infos[i] = TensorInfo(i, st, tsizes, dim_order, dynamic, storage)
            continue
        mem, off = alloc.memory_id, alloc.memory_offset
        if not 0 < mem < len(sizes):
            raise PteFormatError(
                f"{where(plan)}: tensor value {i} memory_id {mem} out of range (arenas 1..{len(sizes) - 1})"
            )
        itemsize = st.itemsize
        nbytes = math.prod(tsizes) * itemsize
        if off + nbytes > sizes[mem]:
            raise PteFormatError(
                f"{where(plan)}: tensor value {i} at offset {off} size {nbytes} overruns arena {mem} "
                f"({sizes[mem]} bytes)"
            )
        if off % itemsize:
            raise PteFormatError(f"{where(plan)}: tensor value {i} offset {off} is not aligned to "
                                 f"its {itemsize}-byte elements")
        dev = arena_device.get(mem)
        device = remap_device(dev[1], device_map) if dev is not None and dev[0] == DeviceType.CUDA else None
        infos[i] = TensorInfo(i, st, tsizes, dim_order, dynamic, PLANNED, device, mem, off)
    return infos


def arena_devices(plan: ExecutionPlan, device_map: DeviceMap | None) -> dict[int, int]:
    """memory_id -> CUDA ordinal for every CUDA-tagged arena (validated indices)."""
    sizes = plan.non_const_buffer_sizes
    out: dict[int, int] = {}
    for bd in plan.non_const_buffer_device:
        if not 0 < bd.buffer_idx < len(sizes):
            raise PteFormatError(f"{where(plan)}: non_const_buffer_device names arena {bd.buffer_idx}, "
                                 f"the method has arenas 1..{len(sizes) - 1}")
        if bd.device_type == DeviceType.CUDA:
            out[bd.buffer_idx] = remap_device(bd.device_index, device_map)
    return out


def host_memory(plan: ExecutionPlan, infos: dict[int, TensorInfo], devices: dict[int, int]) -> list[tuple[str, int]]:
    """(what, bytes) of every host allocation the file declares: host arenas, unplanned non-input tensors.

    Each is checked against :data:`pyrt.format.limits.MAX_DECLARED_BYTES` (device arenas too); nothing is allocated.
    """
    source, method = plan.program.pte.source, f"method {plan.name!r}"
    items: list[tuple[str, int]] = []
    for mem, size in enumerate(plan.non_const_buffer_sizes):
        if mem == 0:
            continue
        what = f"{method} arena {mem} (non_const_buffer_sizes[{mem}])"
        check_declared(size, f"{source}: {what}")
        if mem not in devices:
            items.append((what, size))
    inputs = set(plan.inputs)
    for i, info in infos.items():
        if info.storage == UNPLANNED and i not in inputs:
            what = f"{method} unplanned tensor value {i} (sizes {list(info.sizes)}, {info.scalar_type.name})"
            check_declared(info.nbytes, f"{source}: {what}")
            items.append((what, info.nbytes))
    return items


def instruction_writes(plan: ExecutionPlan, kernels: list[Kernel]) -> set[int]:
    """Values rebound at run time: MoveCall targets and what kernels rebind (indices checked already)."""
    out: set[int] = set()
    for chain in plan.chains:
        for ins in chain.instructions:
            if isinstance(ins, MoveCall):
                out.add(ins.move_to)
            elif isinstance(ins, KernelCall):
                out.update(kernels[ins.op_index].rebinds(ins.args))
    return out


VIEW_OPS = ("executorch_prim::et_view.default",)  # kernels whose result slot is a view of their first argument


def constant_holders(plan: ExecutionPlan, kinds: list[ValueKind], items: dict[int, tuple[int, ...]],
                     infos: dict[int, TensorInfo]) -> set[int]:
    """Values that may hold constant data from the file at run time (read-only memory: never written).

    The constants themselves, then whatever a MoveCall or a view op (``et_view``) can carry
    them into, and every list holding one of those, to a fixed point.
    """
    held = {i for i, info in infos.items() if info.storage == CONSTANT}
    if not held:
        return held
    view_ops = {k for k, op in enumerate(plan.operators) if op.qualified_name in VIEW_OPS}
    edges: list[tuple[int, int]] = []
    for chain in plan.chains:
        for ins in chain.instructions:
            if isinstance(ins, MoveCall):
                edges.append((ins.move_from, ins.move_to))
            elif isinstance(ins, KernelCall) and ins.op_index in view_ops and len(ins.args) >= 3:
                edges.append((ins.args[0], ins.args[2]))
    lists = list(items.items())
    changed = True
    while changed:  # a list holding a constant holds constant data; moves and views carry both along
        grown = [i for i, it in lists if i not in held and not held.isdisjoint(it)]
        held.update(grown)
        changed = bool(grown)
        for src, dst in edges:
            if src in held and dst not in held:
                held.add(dst)
                changed = True
    return held


def check_constant_writes(plan: ExecutionPlan, kernels: list[Kernel], kinds: list[ValueKind],
                          items: dict[int, tuple[int, ...]], held: set[int]) -> None:
    """PteFormatError for a kernel that writes, or an input that overwrites, a value holding constant data.

    Constants are views of the file (read-only memory): torch would write through them and fault.
    """
    if not held:
        return
    for pos, i in enumerate(plan.inputs):
        if i in held:
            raise PteFormatError(f"{where(plan)}: input {pos} (value {i}) may hold constant data from the file")
    for ci, chain in enumerate(plan.chains):
        for pc, ins in enumerate(chain.instructions):
            if not isinstance(ins, KernelCall):
                continue
            kernel = kernels[ins.op_index]
            written = ins.args if kernel.writes is None else kernel.writes(ins.args)
            for w in written:
                for j in (items[w] if w in items else (w,)):
                    if j in held:
                        raise PteFormatError(f"{where(plan)}: chain {ci} instruction {pc} ({kernel.name}) writes "
                                             f"value {j}, which holds constant data from the file (read-only)")


def check_loops(plan: ExecutionPlan, rebound: set[int], kinds: list[ValueKind], items: dict[int, tuple[int, ...]],
                raw: list[Payload]) -> None:
    """PteFormatError for a backward jump whose condition nothing in the method can change (it never ends).

    A condition can change when it is a method input, a MoveCall target, a value a
    kernel rebinds, or an argument (or list item of one) of any kernel or delegate
    call, which may write it in place. A falsy scalar or any tensor outside that set
    keeps its load-time value, so jumping back on it loops forever. Other loops run
    as the program says, as in ExecuTorch.
    """
    backward = [(ci, pc, ins) for ci, chain in enumerate(plan.chains) for pc, ins in enumerate(chain.instructions)
                if isinstance(ins, JumpFalseCall) and ins.destination_instruction <= pc]
    if not backward:  # straight-line code, the common case: nothing can loop
        return
    changing = set(plan.inputs) | rebound
    for chain in plan.chains:
        for ins in chain.instructions:
            if isinstance(ins, (KernelCall, DelegateCall)):
                changing.update(ins.args)
    for i in list(changing):
        if 0 <= i < len(kinds) and kinds[i] in LIST_KINDS:
            changing.update(j for j in items[i] if j >= 0)
    for ci, pc, ins in backward:
        c = ins.cond_value_index
        if c in changing or (kinds[c] in SCALAR_KINDS and raw[c]) or kinds[c] not in (*SCALAR_KINDS, "Tensor"):
            continue
        raise PteFormatError(f"{where(plan)}: chain {ci} instruction {pc} jumps back to "
                             f"{ins.destination_instruction} on value {c} ({kinds[c]}), which nothing in the "
                             f"method changes: the loop would never end")


def where(plan: ExecutionPlan) -> str:
    """The file and method an error names."""
    return f"{plan.program.pte.source}: method {plan.name!r}"



@dataclass
class MethodLoadPlan:
    """A method's load plan (phase 1 of loading it): everything validated and resolved, nothing allocated."""

    xplan: ExecutionPlan
    kinds: list[ValueKind]
    items: dict[int, tuple[int, ...]]
    raw: list[Payload]
    infos: dict[int, TensorInfo]
    arena_devices: dict[int, int]
    kernels: list[Kernel]
    rebound: set[int]
    io_specs: tuple[Spec | None, Spec | None] = (None, None)
    delegates: list[TensorRTDelegate] = field(default_factory=list)
    host_bytes: list[tuple[str, int]] = field(default_factory=list)  # (what, bytes) the load will allocate
    constant_holders: set[int] = field(default_factory=set)  # values that may hold read-only file data

    @property
    def name(self) -> str:
        return self.xplan.name

    def devices(self) -> set[int]:
        """CUDA ordinals this method needs (arenas and engines)."""
        return set(self.arena_devices.values()) | {d.device for d in self.delegates}


def plan_load(xplan: ExecutionPlan, libraries: Sequence[Any], device_map: DeviceMap | None) -> MethodLoadPlan:
    """The load plan of a method: validated, its kernels and delegates resolved; raises before anything is allocated."""

    kinds, items, raw = decode_values(xplan)
    infos = tensor_infos(xplan, device_map)
    devices = arena_devices(xplan, device_map)
    for i in (*xplan.inputs, *xplan.outputs):
        if kinds[i] not in ("Tensor", "Null", "String", "TensorList", *SCALAR_KINDS):
            raise PteFormatError(f"{where(xplan)}: input/output value {i} is a {kinds[i]}")
    if not xplan.chains:
        raise PteFormatError(f"{where(xplan)}: the method has no instruction chain")
    in_text, out_text = xplan.container_meta_type
    specs = (parse_spec(in_text, f"{where(xplan)}: container_meta_type.encoded_inp_str"),
             parse_spec(out_text, f"{where(xplan)}: container_meta_type.encoded_out_str"))
    kernels = resolve(xplan.name, xplan.operators, libraries)
    check_instructions(xplan, kinds, infos, where(xplan))
    rebound = instruction_writes(xplan, kernels)
    check_loops(xplan, rebound, kinds, items, raw)
    held = constant_holders(xplan, kinds, items, infos)
    check_constant_writes(xplan, kernels, kinds, items, held)
    delegates: list[Any] = []
    if any(isinstance(ins, DelegateCall) for chain in xplan.chains for ins in chain.instructions):
        delegates = tensorrt_delegates(xplan, device_map)
    return MethodLoadPlan(xplan, kinds, items, raw, infos, devices, kernels, rebound, specs, delegates,
                       host_memory(xplan, infos, devices), held)


__all__ = ["SCALAR_KINDS", "MethodLoadPlan", "plan_load", "where"]
