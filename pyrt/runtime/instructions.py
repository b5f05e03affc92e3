"""Load-time check of every instruction's indices and of the kind of every value it refers to.

ExecuTorch's runtime unboxes each value an instruction refers to by the kind it expects
and fails on a mismatch; pyrt checks the same at load, so no kernel, delegate or move ever
sees a value of another kind (a tensor list where a tensor belongs, an index past what an
operator reads). One :class:`~pyrt.errors.PteFormatError` names the chain, the instruction,
the argument and the kind found, before anything is allocated:

* ``KernelCall``: ``op_index`` in range; the arguments, results included, match the
  operator's schema (:func:`pyrt.kernels.schemas.schema`: arity and kinds);
* ``DelegateCall``: ``delegate_index`` in range; every argument a tensor or a tensor list
  (a TensorRT engine binds tensors only);
* ``MoveCall``: both indices in range, both values of the same kind (the target keeps the
  kind every later reader was checked against);
* ``JumpFalseCall``: the condition in range and a ``Bool`` or a bool tensor, as ExecuTorch's
  ``parse_cond_value`` requires; the destination inside the chain;
* ``FreeCall``: the value in range and a tensor (ExecuTorch: "FreeCall target ... is not a Tensor").
"""

from __future__ import annotations

from collections.abc import Sequence

from pyrt.errors import PteFormatError, UnsupportedOperatorError
from pyrt.format.dtypes import ScalarType
from pyrt.format.schema import DelegateCall, FreeCall, Instruction, JumpFalseCall, KernelCall, MoveCall, ValueKind
from pyrt.kernels.schemas import schema
from pyrt.memory.table import TensorInfo
from pyrt.pte_reader import ExecutionPlan

DELEGATE_ARG_KINDS = ("Tensor", "TensorList")


def check_instructions(plan: ExecutionPlan, kinds: Sequence[ValueKind], infos: dict[int, TensorInfo],
                       where: str) -> None:
    """PteFormatError for the first instruction with an index out of range or a value of the wrong kind."""
    for ci, chain in enumerate(plan.chains):
        n = len(chain.instructions)
        for pc, ins in enumerate(chain.instructions):
            _check(plan, kinds, infos, ins, f"{where}: chain {ci} instruction {pc}", n)


def _index(i: int, kinds: Sequence[ValueKind], at: str, field: str) -> ValueKind:
    if not 0 <= i < len(kinds):
        raise PteFormatError(f"{at}: {field} {i} out of range ({len(kinds)} values)")
    return kinds[i]


def _check(plan: ExecutionPlan, kinds: Sequence[ValueKind], infos: dict[int, TensorInfo], ins: Instruction,
           at: str, n_instructions: int) -> None:
    if isinstance(ins, KernelCall):
        ops = plan.operators
        if not 0 <= ins.op_index < len(ops):
            raise PteFormatError(f"{at}: op_index {ins.op_index} out of range ({len(ops)} operators)")
        name = ops[ins.op_index].qualified_name
        for j, a in enumerate(ins.args):
            _index(a, kinds, f"{at} ({name})", f"argument {j} value index")
        op_schema = schema(name)
        if op_schema is None:  # every allowed operator has one (tests/kernels/test_allowlist.py); resolve() ran first
            raise UnsupportedOperatorError(f"{at}: operator {name} has no schema pyrt can check its arguments by")
        op_schema.check(f"{at} ({name})", ins.args, kinds)
    elif isinstance(ins, DelegateCall):
        if not 0 <= ins.delegate_index < len(plan.delegates):
            raise PteFormatError(f"{at}: delegate_index {ins.delegate_index} out of range "
                                 f"({len(plan.delegates)} delegates)")
        for j, a in enumerate(ins.args):
            kind = _index(a, kinds, at, f"delegate argument {j} value index")
            if kind not in DELEGATE_ARG_KINDS:
                raise PteFormatError(f"{at}: delegate argument {j} (value {a}) is a {kind}; a delegate takes "
                                     f"Tensor or TensorList values")
    elif isinstance(ins, MoveCall):
        src = _index(ins.move_from, kinds, at, "move_from")
        dst = _index(ins.move_to, kinds, at, "move_to")
        if src != dst:
            raise PteFormatError(f"{at}: moves value {ins.move_from} (a {src}) into value {ins.move_to} "
                                 f"(a {dst}); a move keeps the kind of its target")
    elif isinstance(ins, JumpFalseCall):
        if not 0 <= ins.destination_instruction <= n_instructions:
            raise PteFormatError(f"{at}: jumps to {ins.destination_instruction} ({n_instructions} instructions)")
        c = ins.cond_value_index
        kind = _index(c, kinds, at, "cond_value_index")
        info = infos.get(c)
        if kind == "Tensor" and info is not None and info.scalar_type != ScalarType.BOOL:
            raise PteFormatError(f"{at}: the condition (value {c}) is a {info.scalar_type.name} tensor; a jump "
                                 f"takes a Bool or a BOOL tensor")
        if kind not in ("Bool", "Tensor"):
            raise PteFormatError(f"{at}: the condition (value {c}) is a {kind}; a jump takes a Bool or a BOOL tensor")
    elif isinstance(ins, FreeCall):
        kind = _index(ins.value_index, kinds, at, "value_index")
        if kind != "Tensor":
            raise PteFormatError(f"{at}: frees value {ins.value_index}, a {kind}; only a Tensor can be freed")


__all__ = ["DELEGATE_ARG_KINDS", "check_instructions"]
