"""Load-time plan of one method: value table, arenas, resolved kernels.

Data flows one way: reader -> plan -> executor. Everything that can be
decided once is decided here: every index from the file is validated
(:class:`~pyrt.errors.PteFormatError` at load, never an IndexError at run
time), memory-planned arenas are allocated once (host arenas on the host,
CUDA-tagged arenas in device memory), tensors become views into them,
constants become read-only views of the mmap, mutable buffers get their
initial bytes, and each value is classified *constant* (one object for the
method's life: kernels capture it) or *slot* (rebound at run time: read
through the table).

>>> from pyrt.pte_reader import PteFile                                 # doctest: +SKIP
>>> plan = MethodPlan.build(PteFile.open("add.pte").program.method("forward"), host)  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyrt.dtypes import ScalarType
from pyrt.errors import InputError, PteFormatError, UnsupportedOperatorError
from pyrt.kernels import Kernel, KernelSite, Step
from pyrt.pte_reader import (
    DelegateCall,
    DeviceType,
    ExecutionPlan,
    FreeCall,
    JumpFalseCall,
    KernelCall,
    MoveCall,
    ShapeDynamism,
)
from pyrt.pte_reader import Tensor as TensorDecl
from pyrt.tensors import DeviceTensor, NumpyHost, TorchHost, dim_order_strides

PLANNED, CONSTANT, UNPLANNED = "planned", "constant", "unplanned"
LIST_KINDS = ("IntList", "TensorList", "OptionalTensorList")
SCALAR_KINDS = ("Int", "Double", "Bool")
DeviceMap = Mapping[Any, Any]


@dataclass(frozen=True)
class TensorInfo:
    """What the file says about one tensor value, after validation."""

    index: int
    scalar_type: ScalarType
    sizes: tuple[int, ...]
    dim_order: tuple[int, ...]
    dynamic: bool
    storage: str  # planned | constant | unplanned
    device: int | None = None  # CUDA ordinal (after device_map) of a device arena; None = host
    memory_id: int = 0
    offset: int = 0

    @property
    def capacity(self) -> int:
        """Element bound: the sizes in the file are upper bounds for dynamic tensors."""
        return math.prod(self.sizes)

    @property
    def nbytes(self) -> int:
        return self.capacity * self.scalar_type.itemsize


@dataclass
class ValueTable:
    """The method's values at run time (``vals``) plus what the plan knows about each."""

    method: str
    host: NumpyHost | TorchHost
    kinds: list[str]
    items: dict[int, tuple[int, ...]]
    infos: dict[int, TensorInfo]
    vals: list[Any]
    unstable: set[int] = field(default_factory=set)
    arenas: dict[int, Any] = field(default_factory=dict)
    devices: Any = None  # pyrt.delegates.DeviceContext when the method touches CUDA

    def is_const(self, i: int) -> bool:
        return i not in self.unstable

    def getter(self, i: int) -> Callable[[], Any]:
        """Zero-argument callable returning value ``i`` as kernels see it at run time."""
        if self.is_const(i):
            v = self.vals[i]
            return lambda: v
        kind = self.kinds[i]
        if kind in LIST_KINDS:
            vals, items = self.vals, self.items[i]
            if kind == "OptionalTensorList":
                return lambda: [None if j < 0 else vals[j] for j in items]
            return lambda: [vals[j] for j in items]
        return functools.partial(self.vals.__getitem__, i)

    def resize(self, i: int, shape: Sequence[int]) -> Any:
        """Give dynamic tensor ``i`` a new shape within its bound; returns the (new) tensor."""
        info = self.infos[i]
        shape = tuple(int(d) for d in shape)
        if len(shape) != len(info.sizes) or math.prod(shape) > info.capacity:
            raise InputError(
                f"method {self.method!r}: value {i} cannot take shape {shape}: its memory-planned "
                f"bound is {info.sizes} ({info.capacity} elements)"
            )
        t = self.vals[i]
        if isinstance(t, DeviceTensor):
            t.resize(shape, f"method {self.method!r} value {i}")
            return t
        if isinstance(self.host, TorchHost):
            if tuple(t.shape) != shape:
                t.as_strided_(shape, dim_order_strides(shape, info.dim_order))
            return t
        arena = self.arenas.get(info.memory_id)
        if info.storage != PLANNED or arena is None:
            new = self.host.empty(info.scalar_type, shape, info.dim_order)
        else:
            new = self.host.view(arena, info.offset, info.scalar_type, shape, info.dim_order)
        self.vals[i] = new
        return new


@dataclass
class Instr:
    """One instruction after planning: its step, or control flow for the executor."""

    kind: str
    step: Step | None = None
    cond: int = -1  # JumpFalseCall: value index of the condition
    target: int = -1  # JumpFalseCall: destination
    what: str = ""


@dataclass
class MethodPlan:
    """Everything the executor needs to run one method."""

    name: str
    table: ValueTable
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    chains: list[list[Instr]]
    container_meta_type: tuple[str, str]
    engines: list[Any] = field(default_factory=list)
    device_arenas: list[Any] = field(default_factory=list)
    on_close: list[Callable[[], None]] = field(default_factory=list)

    @property
    def has_jumps(self) -> bool:
        return any(ins.kind == "JumpFalseCall" for chain in self.chains for ins in chain)

    def close(self) -> None:
        for fn in reversed(self.on_close):
            fn()
        self.on_close.clear()
        for arena in self.device_arenas:
            arena.free()
        self.device_arenas.clear()
        self.table.vals.clear()
        self.table.arenas.clear()


# -- building ----------------------------------------------------------------------------------


def decode_values(plan: ExecutionPlan) -> tuple[list[str], dict[int, tuple[int, ...]], list[Any]]:
    """Kinds, list items (validated) and raw payloads of every value."""
    values = plan.values
    kinds = [v.kind for v in values]
    items: dict[int, tuple[int, ...]] = {}
    for i, v in enumerate(values):
        if v.kind not in LIST_KINDS:
            continue
        want = "Int" if v.kind == "IntList" else "Tensor"
        for j in v.value:
            if v.kind == "OptionalTensorList" and j < 0:
                continue
            if not 0 <= j < len(values):
                raise PteFormatError(f"{_where(plan)}: {v.kind} value {i} item {j} out of range ({len(values)} values)")
            if kinds[j] != want and not (v.kind == "OptionalTensorList" and kinds[j] == "Null"):
                raise PteFormatError(f"{_where(plan)}: {v.kind} value {i} item {j} is a {kinds[j]}, not {want}")
        items[i] = tuple(v.value)
    return kinds, items, [v.value for v in values]


def tensor_infos(plan: ExecutionPlan, device_map: DeviceMap | None) -> dict[int, TensorInfo]:
    """Validated storage of every tensor value (arena bounds, alignment, devices)."""
    sizes = plan.non_const_buffer_sizes
    infos: dict[int, TensorInfo] = {}
    for i, v in enumerate(plan.values):
        if v.kind != "Tensor":
            continue
        t: TensorDecl = v.value
        _check_dtype(plan, i, t.scalar_type)
        dim_order = t.dim_order or tuple(range(len(t.sizes)))
        if len(dim_order) != len(t.sizes):
            raise PteFormatError(f"{_where(plan)}: tensor value {i} has dim_order {t.dim_order} for sizes {t.sizes}")
        dynamic = t.shape_dynamism != ShapeDynamism.STATIC
        if t.is_constant:
            infos[i] = TensorInfo(i, t.scalar_type, t.sizes, dim_order, dynamic, CONSTANT)
            continue
        if t.allocation_info is None:
            infos[i] = TensorInfo(i, t.scalar_type, t.sizes, dim_order, dynamic, UNPLANNED)
            continue
        mem, off = t.allocation_info.memory_id, t.allocation_info.memory_offset
        if not 0 < mem < len(sizes):
            raise PteFormatError(
                f"{_where(plan)}: tensor value {i} memory_id {mem} out of range (arenas 1..{len(sizes) - 1})"
            )
        if off + t.nbytes > sizes[mem]:
            raise PteFormatError(
                f"{_where(plan)}: tensor value {i} at offset {off} size {t.nbytes} overruns arena {mem} "
                f"({sizes[mem]} bytes)"
            )
        if off % t.scalar_type.itemsize:
            raise PteFormatError(f"{_where(plan)}: tensor value {i} offset {off} is not aligned to "
                                 f"its {t.scalar_type.itemsize}-byte elements")
        dev_type, dev_index = plan.buffer_device(mem)
        device = remap_device(dev_index, device_map) if dev_type == DeviceType.CUDA else None
        infos[i] = TensorInfo(i, t.scalar_type, t.sizes, dim_order, dynamic, PLANNED, device, mem, off)
    return infos


def _check_dtype(plan: ExecutionPlan, i: int, st: ScalarType) -> None:
    if st.name.startswith(("Q", "BITS")) or st in (ScalarType.FLOAT8E5M2FNUZ, ScalarType.FLOAT8E4M3FNUZ):
        raise UnsupportedOperatorError(f"{_where(plan)}: tensor value {i} has unsupported scalar type {st.name}")


def remap_device(index: int, device_map: DeviceMap | None) -> int:
    """Apply ``device_map`` ({0: 1} or {"cuda:0": "cuda:1"}) to a CUDA ordinal."""
    if not device_map:
        return index
    for key in (index, f"cuda:{index}"):
        if key in device_map:
            return parse_device(device_map[key], "device_map value")
    return index


def parse_device(value: Any, what: str) -> int:
    """``2``, ``"cuda:2"`` or a torch.device -> 2."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    text = str(value)
    if text.startswith("cuda:") and text[5:].isdigit():
        return int(text[5:])
    if text == "cuda":
        return 0
    from pyrt.errors import DeviceError

    raise DeviceError(f"{what} {value!r} is not a CUDA device (expected an int >= 0 or 'cuda:N')")


def arena_devices(plan: ExecutionPlan, device_map: DeviceMap | None) -> dict[int, int]:
    """memory_id -> CUDA ordinal for every CUDA-tagged arena (validated indices)."""
    sizes = plan.non_const_buffer_sizes
    out: dict[int, int] = {}
    for bd in plan.non_const_buffer_device:
        if not 0 < bd.buffer_idx < len(sizes):
            raise PteFormatError(f"{_where(plan)}: non_const_buffer_device names arena {bd.buffer_idx}, "
                                 f"the method has arenas 1..{len(sizes) - 1}")
        if bd.device_type == DeviceType.CUDA:
            out[bd.buffer_idx] = remap_device(bd.device_index, device_map)
    return out


def allocate_arenas(plan: ExecutionPlan, host: NumpyHost | TorchHost, devices: dict[int, int],
                    cuda: Any) -> tuple[dict[int, Any], list[Any]]:
    """Host arenas (zeroed) and device arenas (through pyrt.cuda), once per method."""
    arenas: dict[int, Any] = {}
    device_allocs: list[Any] = []
    for mem, size in enumerate(plan.non_const_buffer_sizes):
        if mem == 0:
            continue
        if mem in devices:
            alloc = cuda.alloc(int(size), devices[mem])
            device_allocs.append(alloc)
            arenas[mem] = alloc
        else:
            arenas[mem] = host.arena(int(size))
    return arenas, device_allocs


def materialize(plan: ExecutionPlan, host: NumpyHost | TorchHost, kinds: list[str], items: dict[int, tuple[int, ...]],
                raw: list[Any], infos: dict[int, TensorInfo], arenas: dict[int, Any]) -> list[Any]:
    """Initial Python object of every value."""
    program = plan.program
    vals: list[Any] = [None] * len(kinds)
    for i, kind in enumerate(kinds):
        if kind in SCALAR_KINDS or kind == "String":
            vals[i] = raw[i]
        elif kind in ("DoubleList", "BoolList"):
            vals[i] = list(raw[i])
    for i, info in infos.items():
        decl: TensorDecl = raw[i]
        if info.storage == CONSTANT:
            vals[i] = host.constant(program.constant_data(decl), info.scalar_type, info.sizes, info.dim_order)
        elif info.storage == UNPLANNED:
            vals[i] = None  # bound per run (inputs) or allocated by the plan (see bind_unplanned)
        elif info.device is not None:
            vals[i] = DeviceTensor(arenas[info.memory_id], info.offset, info.scalar_type, info.sizes,
                                   info.capacity, info.dim_order)
            if decl.data_buffer_idx > 0:  # a mutable buffer kept in device memory (a KV cache)
                _initialize_device(vals[i], program.mutable_data(decl))
        else:
            vals[i] = host.view(arenas[info.memory_id], info.offset, info.scalar_type, info.sizes, info.dim_order)
            if decl.data_buffer_idx > 0:  # mutable buffer with an initial value in the file
                _initialize(vals[i], program.mutable_data(decl), host)
    for i, it in items.items():
        vals[i] = [None if j < 0 else vals[j] for j in it]
    return vals


def _initialize(view: Any, data: memoryview, host: NumpyHost | TorchHost) -> None:
    import numpy as np

    dst = host.to_numpy(view)
    src = np.frombuffer(data, dtype=np.uint8)
    if dst.flags.c_contiguous:
        dst.reshape(-1).view(np.uint8)[:] = src
    else:  # a non-default dim order: bytes are in memory order
        base = np.lib.stride_tricks.as_strided(dst, (dst.size,), (dst.itemsize,))
        base.view(np.uint8)[:] = src


def _initialize_device(tensor: DeviceTensor, data: memoryview) -> None:
    """Upload a device-resident mutable buffer's initial bytes (once, at load)."""
    import numpy as np

    from pyrt import cuda as cuda_seam

    src = np.frombuffer(data, dtype=np.uint8)
    if src.nbytes != tensor.nbytes:
        raise PteFormatError(f"mutable buffer of {tensor.nbytes} bytes has {src.nbytes} bytes of initial data")
    if src.nbytes:
        cuda_seam.current().memcpy_htod(tensor.allocation, src, dst_offset=tensor.offset)


def instruction_writes(plan: ExecutionPlan, kernels: list[Kernel]) -> set[int]:
    """Values rebound at run time: MoveCall targets and what kernels rebind."""
    out: set[int] = set()
    for ci, chain in enumerate(plan.chains):
        for pc, ins in enumerate(chain.instructions):
            if isinstance(ins, MoveCall):
                for idx, what in ((ins.move_from, "move_from"), (ins.move_to, "move_to")):
                    plan.check_value_index(idx, f"chain {ci} instruction {pc} {what}")
                out.add(ins.move_to)
            elif isinstance(ins, KernelCall):
                if not 0 <= ins.op_index < len(kernels):
                    raise PteFormatError(f"{_where(plan)}: chain {ci} instruction {pc} op_index {ins.op_index} "
                                         f"out of range ({len(kernels)} operators)")
                out.update(kernels[ins.op_index].rebinds(ins.args))
            elif isinstance(ins, JumpFalseCall):
                plan.check_value_index(ins.cond_value_index, f"chain {ci} instruction {pc} cond_value_index")
                if not 0 <= ins.destination_instruction <= len(chain.instructions):
                    raise PteFormatError(f"{_where(plan)}: chain {ci} instruction {pc} jumps to "
                                         f"{ins.destination_instruction} ({len(chain.instructions)} instructions)")
            elif isinstance(ins, FreeCall):
                plan.check_value_index(ins.value_index, f"chain {ci} instruction {pc} value_index")
            elif isinstance(ins, DelegateCall) and not 0 <= ins.delegate_index < len(plan.delegates):
                raise PteFormatError(f"{_where(plan)}: chain {ci} instruction {pc} delegate_index "
                                     f"{ins.delegate_index} out of range ({len(plan.delegates)} delegates)")
    return out


def classify(table: ValueTable, rebound: set[int], inputs: Sequence[int]) -> None:
    """Mark slot values: rebound ones, unplanned inputs, numpy-dynamic tensors, lists over slots."""
    unstable = set(rebound)
    for i, info in table.infos.items():
        if info.storage == UNPLANNED and i in inputs:
            unstable.add(i)
        elif info.dynamic and info.device is None and isinstance(table.host, NumpyHost) and info.storage != CONSTANT:
            unstable.add(i)
    for i, it in table.items.items():
        if any(j in unstable for j in it if j >= 0):
            unstable.add(i)
    table.unstable = unstable


def bind_unplanned(table: ValueTable, inputs: Sequence[int]) -> None:
    """Unplanned tensors that are not inputs (e.g. outputs when alloc_graph_output=False): own buffers."""
    for i, info in table.infos.items():
        if info.storage == UNPLANNED and i not in inputs and i not in table.unstable:
            table.vals[i] = table.host.empty(info.scalar_type, info.sizes, info.dim_order)
    for i, it in table.items.items():  # constant lists now see those buffers
        if i not in table.unstable:
            table.vals[i] = [None if j < 0 else table.vals[j] for j in it]


def build_steps(plan: ExecutionPlan, table: ValueTable, kernels: list[Kernel],
                delegate_step: Callable[[int, DelegateCall, int], Step] | None) -> list[list[Instr]]:
    """One :class:`Instr` per instruction, steps built with arguments resolved now."""
    ops = plan.operators
    chains: list[list[Instr]] = []
    for chain in plan.chains:
        out: list[Instr] = []
        for pc, ins in enumerate(chain.instructions):
            if isinstance(ins, KernelCall):
                op = ops[ins.op_index].qualified_name
                site = KernelSite(table.method, pc, op, ins.args, table)
                out.append(Instr("KernelCall", kernels[ins.op_index].build(site), what=op))
            elif isinstance(ins, DelegateCall):
                if delegate_step is None:
                    raise UnsupportedOperatorError(f"{_where(plan)}: delegate calls need an engine loader")
                out.append(Instr("DelegateCall", delegate_step(pc, ins, len(out)),
                                 what=f"delegate {ins.delegate_index} ({plan.delegates[ins.delegate_index].id})"))
            elif isinstance(ins, MoveCall):
                out.append(Instr("MoveCall", _move(table, ins.move_from, ins.move_to), what="move"))
            elif isinstance(ins, JumpFalseCall):
                out.append(Instr("JumpFalseCall", cond=ins.cond_value_index, target=ins.destination_instruction,
                                 what="jump_false"))
            else:
                out.append(Instr("FreeCall", _free(table, ins.value_index), what="free"))
        chains.append(out)
    return chains


def _move(table: ValueTable, src: int, dst: int) -> Step:
    vals = table.vals
    get = table.getter(src)

    def move() -> None:
        vals[dst] = get()

    return move


def _free(table: ValueTable, i: int) -> Step:
    info = table.infos.get(i)
    if info is None or info.storage != UNPLANNED or table.is_const(i):
        return _noop  # planned memory stays with the arena, as in ExecuTorch
    vals = table.vals

    def free() -> None:
        vals[i] = None

    return free


def _noop() -> None:
    return None


def _where(plan: ExecutionPlan) -> str:
    return f"{plan.program.pte.source}: method {plan.name!r}"


# -- the two phases ------------------------------------------------------------------------------


@dataclass
class MethodDraft:
    """Phase 1 of loading a method: everything validated, nothing allocated."""

    xplan: ExecutionPlan
    kinds: list[str]
    items: dict[int, tuple[int, ...]]
    raw: list[Any]
    infos: dict[int, TensorInfo]
    arena_devices: dict[int, int]
    kernels: list[Kernel]
    rebound: set[int]
    delegates: list[Any] = field(default_factory=list)  # pyrt.delegates.DelegateDraft

    @property
    def name(self) -> str:
        return self.xplan.name

    def devices(self) -> set[int]:
        """CUDA ordinals this method needs (arenas and engines)."""
        return set(self.arena_devices.values()) | {d.device for d in self.delegates}


def draft_method(xplan: ExecutionPlan, libraries: Sequence[Any], device_map: DeviceMap | None) -> MethodDraft:
    """Validate a method and resolve its kernels; raises before anything is allocated."""
    from pyrt.kernels import resolve

    kinds, items, raw = decode_values(xplan)
    infos = tensor_infos(xplan, device_map)
    devices = arena_devices(xplan, device_map)
    for i in (*xplan.inputs, *xplan.outputs):
        if kinds[i] not in ("Tensor", "Null", "String", "TensorList", *SCALAR_KINDS):
            raise PteFormatError(f"{_where(xplan)}: input/output value {i} is a {kinds[i]}")
    if not xplan.chains:
        raise PteFormatError(f"{_where(xplan)}: the method has no instruction chain")
    kernels = resolve(xplan.name, xplan.operators, libraries)
    rebound = instruction_writes(xplan, kernels)
    delegates: list[Any] = []
    if any(isinstance(ins, DelegateCall) for chain in xplan.chains for ins in chain.instructions):
        from pyrt.delegates import draft_delegates

        delegates = draft_delegates(xplan, device_map)
    return MethodDraft(xplan, kinds, items, raw, infos, devices, kernels, rebound, delegates)


def finish_method(draft: MethodDraft, host: NumpyHost | TorchHost, cuda: Any = None,
                  devices: Any = None) -> MethodPlan:
    """Phase 2: allocate arenas, build the value table and every step."""
    xplan = draft.xplan
    arenas, device_allocs = allocate_arenas(xplan, host, draft.arena_devices, cuda)
    try:
        vals = materialize(xplan, host, draft.kinds, draft.items, draft.raw, draft.infos, arenas)
        table = ValueTable(xplan.name, host, draft.kinds, draft.items, draft.infos, vals, arenas=arenas,
                           devices=devices)
        classify(table, draft.rebound, xplan.inputs)
        bind_unplanned(table, xplan.inputs)
        delegate_step = devices.step_factory(draft, table) if draft.delegates else None
        chains = build_steps(xplan, table, draft.kernels, delegate_step)
    except BaseException:
        for alloc in device_allocs:
            alloc.free()
        raise
    return MethodPlan(xplan.name, table, xplan.inputs, xplan.outputs, chains, xplan.container_meta_type,
                      engines=[d.engine for d in draft.delegates], device_arenas=device_allocs)
