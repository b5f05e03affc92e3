"""Load-time validation: every index from the file is checked with a typed error before any run.

Programs are exported by ExecuTorch 1.5.1, turned back into ExecuTorch's
Program dataclass, corrupted one field at a time and re-serialized by
ExecuTorch; pyrt must answer each with PteFormatError (or
UnsupportedOperatorError), never an IndexError or a crash half-way through a run.
"""

from __future__ import annotations

import copy
import io
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("executorch")

from pyrt.errors import PteFormatError, UnsupportedOperatorError  # noqa: E402
from pyrt.runtime.program import Program  # noqa: E402
from tests.fixtures.pte import raw_program, serialize_program  # noqa: E402


class AddCat(torch.nn.Module):
    def forward(self, x: Any, y: Any) -> Any:
        return torch.cat([torch.relu(x + y), x], dim=0)


@pytest.fixture(scope="module")
def base() -> Any:
    """(ExecuTorch Program dataclass, original bytes) of a small delegate-free program."""
    from executorch.exir import to_edge_transform_and_lower
    from torch.export import export

    et = to_edge_transform_and_lower(export(AddCat(), (torch.randn(2, 3), torch.randn(2, 3)))).to_executorch()
    data = bytes(et.buffer)
    return raw_program(data)[1], data


def write(program: Any) -> bytes:
    out = serialize_program(program)
    buf = io.BytesIO()
    out.write_to_file(buf)
    return buf.getvalue()


def corrupt(base: Any, edit: Callable[[Any], None]) -> bytes:
    program = copy.deepcopy(base[0])
    edit(program.execution_plan[0])
    return write(program)


def values_of(plan: Any, kind: str) -> list[int]:
    return [i for i, v in enumerate(plan.values) if type(v.val).__name__ == kind]


def test_roundtrip_runs(base: Any) -> None:
    x = np.ones((2, 3), np.float32)
    with Program(write(copy.deepcopy(base[0])), kernels="numpy") as prog:
        np.testing.assert_array_equal(prog(x, x), np.concatenate([2 * x, x]))


def _bad_op_index(plan: Any) -> None:
    plan.chains[0].instructions[0].instr_args.op_index = 42


def _bad_arg_count(plan: Any) -> None:
    ins = plan.chains[0].instructions[0].instr_args
    ins.args = ins.args[:1]


def _bad_memory_id(plan: Any) -> None:
    t = plan.values[values_of(plan, "Tensor")[0]].val
    t.allocation_info.memory_id = 7


def _overrun(plan: Any) -> None:
    t = plan.values[values_of(plan, "Tensor")[0]].val
    t.allocation_info.memory_offset_low = plan.non_const_buffer_sizes[1] - 4


def _misaligned(plan: Any) -> None:
    t = plan.values[values_of(plan, "Tensor")[0]].val
    t.allocation_info.memory_offset_low = 2


def _bad_move(plan: Any) -> None:
    from executorch.exir import schema as s

    plan.chains[0].instructions.append(s.Instruction(s.MoveCall(move_from=0, move_to=10_000)))


def _bad_jump(plan: Any) -> None:
    from executorch.exir import schema as s

    plan.chains[0].instructions.insert(0, s.Instruction(s.JumpFalseCall(0, 99)))


def _bad_free(plan: Any) -> None:
    from executorch.exir import schema as s

    plan.chains[0].instructions.append(s.Instruction(s.FreeCall(value_index=-3)))


def _bad_delegate(plan: Any) -> None:
    from executorch.exir import schema as s

    plan.chains[0].instructions.append(s.Instruction(s.DelegateCall(delegate_index=3, args=[0])))


def _bad_tensor_list(plan: Any) -> None:
    plan.values[values_of(plan, "TensorList")[0]].val.items = [0, 9_999]


def _wrong_kind_in_list(plan: Any) -> None:
    plan.values[values_of(plan, "TensorList")[0]].val.items = [0, values_of(plan, "Int")[0]]


def _kernel_calls(plan: Any) -> list[Any]:
    from executorch.exir import schema as s

    return [i.instr_args for i in plan.chains[0].instructions if isinstance(i.instr_args, s.KernelCall)]


def _list_for_tensor(plan: Any) -> None:  # a tensor list where add.out's 'self' tensor belongs (AttributeError before)
    _kernel_calls(plan)[0].args[0] = values_of(plan, "TensorList")[0]


def _int_for_tensor_out(plan: Any) -> None:
    call = _kernel_calls(plan)[0]
    call.args[-1] = values_of(plan, "Int")[0]


def _move_kind(plan: Any) -> None:
    from executorch.exir import schema as s

    move = s.MoveCall(move_from=values_of(plan, "Int")[0], move_to=values_of(plan, "Tensor")[0])
    plan.chains[0].instructions.insert(0, s.Instruction(move))


def _free_kind(plan: Any) -> None:
    from executorch.exir import schema as s

    plan.chains[0].instructions.append(s.Instruction(s.FreeCall(value_index=values_of(plan, "TensorList")[0])))


def _bad_device_arena(plan: Any) -> None:
    from executorch.exir import schema as s

    plan.non_const_buffer_device = [s.NonConstBufferDevice(buffer_idx=5, device_type=s.DeviceType.CUDA)]


@pytest.mark.parametrize("edit, match", [
    (_bad_op_index, "op_index 42"),
    (_bad_arg_count, r"instruction 0 \(aten::\w+\.out\): takes \d+ arguments"),
    (_bad_memory_id, "memory_id 7"),
    (_overrun, "overruns arena 1"),
    (_misaligned, "not aligned"),
    (_bad_move, "move_to 10000 out of range"),
    (_bad_jump, "jumps to 99"),
    (_bad_free, "value_index -3 out of range"),
    (_bad_delegate, "delegate_index 3"),
    (_bad_tensor_list, "9999 out of range"),
    (_wrong_kind_in_list, "is a Int, not Tensor"),
    (_bad_device_arena, "names arena 5"),
    (_list_for_tensor, r"instruction 0 \(aten::add\.out\): argument 0 \('self', value \d+\) is a TensorList; "
                       r"the schema wants Tensor"),
    (_int_for_tensor_out, r"instruction 0 \(aten::add\.out\): argument 4 \('result', value \d+\) is a Int"),
    (_move_kind, r"chain 0 instruction 0: moves value \d+ \(a Int\) into value \d+ \(a Tensor\)"),
    (_free_kind, r"frees value \d+, a TensorList; only a Tensor can be freed"),
])
@pytest.mark.parametrize("kernels", ["torch", "numpy"])
def test_corrupt_index_is_pte_format_error(base: Any, edit: Callable[[Any], None], match: str, kernels: str) -> None:
    data = corrupt(base, edit)
    with pytest.raises(PteFormatError, match=match):
        Program(data, kernels=kernels)


@pytest.mark.parametrize("kernels", ["torch", "numpy"])
def test_unknown_operator_named_with_method_at_load(base: Any, kernels: str) -> None:
    from executorch.exir import schema as s

    def edit(plan: Any) -> None:
        plan.operators[0] = s.Operator(name="mylib::frobnicate", overload="out")

    with pytest.raises(UnsupportedOperatorError, match=r"method 'forward'.*mylib::frobnicate\.out"):
        Program(corrupt(base, edit), kernels=kernels)


def test_numpy_set_reports_ops_it_lacks(base: Any) -> None:
    from executorch.exir import schema as s

    def edit(plan: Any) -> None:  # in ExecuTorch's kernel set, not in the numpy core set
        assert plan.operators[0].name == "aten::add"
        plan.operators[0] = s.Operator(name="aten::bitwise_left_shift", overload="Tensor_out")
        for ins in plan.chains[0].instructions:  # its schema has no alpha: (self, other, *, out) -> out
            if isinstance(ins.instr_args, s.KernelCall) and ins.instr_args.op_index == 0:
                del ins.instr_args.args[2]

    Program(corrupt(base, edit), kernels="torch").close()  # torch knows it: loads
    with pytest.raises(UnsupportedOperatorError, match=r"no kernel library \(numpy\).*aten::bitwise_left_shift"):
        Program(corrupt(base, edit), kernels="numpy")


def test_foreign_delegate_backend_rejected(base: Any) -> None:
    from executorch.exir import schema as s

    program = copy.deepcopy(base[0])
    plan = program.execution_plan[0]
    ref = s.BackendDelegateDataReference(location=s.DataLocation.INLINE, index=0)
    plan.delegates = [s.BackendDelegate(id="XnnpackBackend", processed=ref, compile_specs=[])]
    plan.chains[0].instructions.append(s.Instruction(s.DelegateCall(delegate_index=0, args=[0])))
    program = replace(program, backend_delegate_data=[s.BackendDelegateInlineData(data=b"xx")])
    with pytest.raises(UnsupportedOperatorError, match="XnnpackBackend"):
        Program(write(program))


def test_truncated_file_is_pte_format_error(base: Any) -> None:
    with pytest.raises(PteFormatError):
        Program(base[1][: len(base[1]) // 2])


def test_delegate_argument_of_another_kind_is_refused_at_load(delegated_inline_pte: Any) -> None:
    """A TensorRT delegate binds tensors: an Int (or any non-tensor) argument is refused before engines load."""
    from executorch.exir import schema as s

    program = raw_program(delegated_inline_pte.read_bytes())[1]
    plan = program.execution_plan[0]
    scalar = len(plan.values)
    plan.values.append(s.EValue(s.Int(3)))
    call = next(i.instr_args for c in plan.chains for i in c.instructions if isinstance(i.instr_args, s.DelegateCall))
    call.args[0] = scalar
    with pytest.raises(PteFormatError, match=rf"instruction \d+: delegate argument 0 \(value {scalar}\) is a Int; "
                                             r"a delegate takes Tensor or TensorList values"):
        Program(write(program))
