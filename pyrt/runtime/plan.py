"""Load-time plan of one method: value table, arenas, resolved kernels, one step per instruction.

Data flows one way: reader -> plan -> executor. Everything that can be
decided once is decided here, in two phases: :func:`~pyrt.runtime.load_plan.plan_load`
validates every index from the file and resolves kernels into the method's load plan,
allocating nothing (:mod:`pyrt.runtime.load_plan`); :func:`finish_method` allocates arenas and the initial
objects of every value (:mod:`pyrt.runtime.materialize`), then builds each instruction's
step with its arguments resolved (folding what it can, :mod:`pyrt.runtime.fold`) into
the :class:`MethodPlan` the executor runs.

>>> from pyrt.pte_reader import PteFile                                 # doctest: +SKIP
>>> plan = MethodPlan.build(PteFile.open("add.pte").program.method("forward"), host)  # doctest: +SKIP
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pyrt.errors import UnsupportedOperatorError
from pyrt.format.limits import allocating
from pyrt.format.pytree import Spec
from pyrt.format.schema import DelegateCall, JumpFalseCall, KernelCall, MoveCall
from pyrt.kernels.base import Kernel, KernelSite, Step, noop
from pyrt.memory.host import NumpyHost, TorchHost
from pyrt.memory.table import UNPLANNED, ValueTable
from pyrt.pte_reader import ExecutionPlan
from pyrt.runtime.delegate_steps import step_factory
from pyrt.runtime.device_context import DeviceContext
from pyrt.runtime.fold import Folder
from pyrt.runtime.load_plan import MethodLoadPlan, where
from pyrt.runtime.materialize import allocate_arenas, bind_unplanned, classify, materialize


@dataclass(slots=True)
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
    io_specs: tuple[Spec | None, Spec | None]  # validated pytree specs of inputs and outputs (pyrt.format.pytree)
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

def build_steps(plan: ExecutionPlan, table: ValueTable, kernels: list[Kernel],
                delegate_step: Callable[[int, DelegateCall, int], Step] | None,
                folder: Folder | None = None) -> list[list[Instr]]:
    """One :class:`Instr` per instruction, steps built with arguments resolved now.

    With a ``folder``, kernel calls on constant data run now and become :func:`noop` steps.
    """
    ops = plan.operators
    chains: list[list[Instr]] = []
    for chain in plan.chains:
        out: list[Instr] = []
        for pc, ins in enumerate(chain.instructions):
            if isinstance(ins, KernelCall):
                op = ops[ins.op_index].qualified_name
                site = KernelSite(table.method, pc, op, ins.args, table,
                                  folder.unread(pc) if folder is not None else frozenset())
                kernel = kernels[ins.op_index]
                if folder is None:
                    out.append(Instr("KernelCall", kernel.build(site), what=op))
                    continue
                step = folder.step(pc, ins.args, kernel, functools.partial(kernel.build, site))
                out.append(Instr("KernelCall", step, what=f"{op} (folded at load)" if step is noop else op))
            elif isinstance(ins, DelegateCall):
                if delegate_step is None:
                    raise UnsupportedOperatorError(f"{where(plan)}: delegate calls need an engine loader")
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
        return noop  # planned memory stays with the arena, as in ExecuTorch
    vals = table.vals

    def free() -> None:
        vals[i] = None

    return free


def finish_method(load_plan: MethodLoadPlan, host: NumpyHost | TorchHost, cuda: Any = None,
                  devices: DeviceContext | None = None, *, fold: bool = True) -> MethodPlan:
    """Phase 2: allocate arenas, build the value table and every step (``fold``: see :mod:`pyrt.runtime.fold`)."""
    xplan = load_plan.xplan
    arenas, device_allocs = allocate_arenas(xplan, host, load_plan.arena_devices, cuda)
    try:
        with allocating(f"{where(xplan)}: the method's values and steps"):  # what the named allocations left
            vals = materialize(xplan, host, load_plan.kinds, load_plan.items, load_plan.raw, load_plan.infos, arenas)
            table = ValueTable(xplan.name, host, load_plan.kinds, load_plan.items, load_plan.infos, vals, arenas=arenas,
                               devices=devices, read_only=load_plan.constant_holders)
            classify(table, load_plan.rebound, xplan.inputs)
            bind_unplanned(table, xplan.inputs)
            delegate_step = step_factory(devices, load_plan, table) if load_plan.delegates and devices else None
            chains = build_steps(xplan, table, load_plan.kernels, delegate_step,
                                 Folder(xplan, table, load_plan.kernels, load_plan.raw) if fold else None)
    except BaseException:
        for alloc in device_allocs:
            alloc.free()
        raise
    return MethodPlan(xplan.name, table, xplan.inputs, xplan.outputs, chains, load_plan.io_specs,
                      engines=[d.engine for d in load_plan.delegates], device_arenas=device_allocs)
