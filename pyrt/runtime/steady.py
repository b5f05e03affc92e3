"""The steady chain of a dynamic-shape method: what a run must do when its shapes repeat the last run's.

A method with dynamic shapes spends much of a run on shape work: ``sym_size`` and
prim scalar math, ``et_view`` views, and emptying every dynamic out tensor before
its kernel (torch then sizes it) and checking it against its bound after. When every
input has the shape it had in the previous run, and no operator's output shape
depends on tensor data (:data:`pyrt.kernels.DATA_DEPENDENT_OPS`: nonzero,
masked_select, ``_local_scalar_dense``...), every shape in the run repeats too, so

* shape-only steps (:class:`pyrt.kernels.ShapeOnly`) whose reads are constants or
  results of other skipped steps would rebind what their slots already hold: skipped;
  an ``et_view`` is skipped only when the tensor it views is the same object as
  before (a constant slot, or the result of another skipped view);
* kernel steps run their ``steady`` variant: the out tensors already have their
  shapes (and passed their bound check when they got them).

Only torch-host methods with one straight chain, no delegates and no device tensors
qualify (numpy hosts rebind resized tensors on every run).

>>> steps = steady_chain(plan)          # doctest: +SKIP
>>> key = shape_key(plan.table.vals)     # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from pyrt.kernels.base import DATA_DEPENDENT_OPS, ShapeOnly, Step, noop
from pyrt.memory.host import TorchHost
from pyrt.memory.tensors import Value
from pyrt.runtime.plan import MethodPlan


def steady_chain(plan: MethodPlan) -> tuple[list[Step], list[int]] | None:
    """(steady steps, the instruction of each) of ``plan``; None when it has no steady chain."""
    table = plan.table
    dynamic = [i for i in plan.inputs if (info := table.infos.get(i)) is not None and info.dynamic]
    if not dynamic or not isinstance(table.host, TorchHost) or len(plan.chains) != 1 or plan.has_jumps:
        return None
    if plan.engines or any(info.device is not None for info in table.infos.values()):
        return None
    chain = plan.chains[0]
    if any(ins.kind != "KernelCall" and ins.step is not noop for ins in chain):
        return None  # MoveCall, unplanned frees, delegates: left to the full chain
    if any(ins.what.partition(".")[0] in DATA_DEPENDENT_OPS for ins in chain):
        return None
    stable = {i for i in range(len(table.kinds)) if table.is_const(i)}
    steps: list[Step] = []
    pcs: list[int] = []
    for pc, ins in enumerate(chain):
        step = ins.step
        if step is None or step is noop:
            continue
        marks: ShapeOnly | None = getattr(step, "shape_only", None)
        if marks is not None and _skippable(marks, stable):
            stable.update(marks.rebinds)
            continue
        pick = getattr(step, "steady_if", None)  # a variant that needs the slots it reads left alone
        steady = pick(stable) if pick is not None else getattr(step, "steady", step)
        if steady is noop:  # pyrt.runtime.fold: data that follows from the shapes (in private memory), or shape views
            continue
        steps.append(steady)
        pcs.append(pc)
    return steps, pcs


def _skippable(marks: ShapeOnly, stable: set[int]) -> bool:
    if not all(i in stable for i in marks.reads):
        return False
    return marks.tensor < 0 or marks.tensor in stable


def shape_key(vals: list[Value], inputs: tuple[int, ...]) -> tuple[Any, ...]:
    """The shapes of the inputs' tensors (None for non-tensors), as bound for this run."""
    return tuple(getattr(vals[i], "shape", None) for i in inputs)


__all__ = ["steady_chain", "shape_key"]
