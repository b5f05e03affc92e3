"""Hostile programs that load but must not run as written: never-ending loops, writes into the file's data.

A backward jump whose condition nothing in the method changes would spin
forever (refused at load); a loop whose condition is recomputed but never true
runs until interrupted, as in ExecuTorch's runtime. A kernel writing into
constant data would write through read-only file memory: refused at load for
every way a value can come to hold constant data. bfloat16 I/O with torch
kernels (found by tests/runtime/test_fuzz_runtime.py) gives typed errors to numpy callers.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("executorch")

from pyrt.errors import InputError, PteFormatError  # noqa: E402
from pyrt.runtime.program import Program  # noqa: E402
from tests.fixtures.pte import hand_program, hand_tensor  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _st() -> Any:
    from executorch.exir.scalar_type import ScalarType

    return ScalarType



def _jump_program(cond: Any, *, changed_by_kernel: bool) -> bytes:
    """``jump_false(cond) -> 0`` after an instruction; the kernel either rewrites cond or leaves it alone."""
    from executorch.exir import schema as s

    values = [cond, s.EValue(s.Int(1)), s.EValue(s.Int(1)), s.EValue(s.Bool(False))]
    out = 0 if changed_by_kernel else 3  # executorch_prim::eq.Scalar(1, 1) -> True, stored in value 0 or 3
    instructions = [s.KernelCall(op_index=0, args=[1, 2, out]), s.JumpFalseCall(cond_value_index=0,
                                                                                destination_instruction=0)]
    return hand_program(values, instructions, [("executorch_prim::eq", "Scalar")], outputs=[0], buffer_sizes=[0, 8])


@pytest.mark.parametrize("cond", ["false", "tensor"])
def test_loop_whose_condition_never_changes_is_refused(cond: str) -> None:
    from executorch.exir import schema as s

    value = {"false": s.EValue(s.Bool(False)), "tensor": hand_tensor(_st().BOOL, [1], alloc=(1, 0))}[cond]
    data = _jump_program(value, changed_by_kernel=False)
    with pytest.raises(PteFormatError, match=r"instruction 1 jumps back to 0 on value 0 .*the loop would never end"):
        Program(data)


@pytest.mark.parametrize("cond, kind", [("zero", "Int"), ("float", "FLOAT tensor")])
def test_jump_condition_of_another_kind_is_refused(cond: str, kind: str) -> None:
    """ExecuTorch's parse_cond_value takes a Bool or a BOOL tensor only; pyrt refuses others at load."""
    from executorch.exir import schema as s

    value = {"zero": s.EValue(s.Int(0)), "float": hand_tensor(_st().FLOAT, [1], alloc=(1, 0))}[cond]
    with pytest.raises(PteFormatError, match=rf"chain 0 instruction 1: the condition \(value 0\) is a {kind}"):
        Program(_jump_program(value, changed_by_kernel=False))


def test_loop_whose_condition_changes_runs() -> None:
    from executorch.exir import schema as s

    with Program(_jump_program(s.EValue(s.Bool(False)), changed_by_kernel=True)) as prog:
        assert prog() == (True,)
    with Program(_jump_program(s.EValue(s.Bool(True)), changed_by_kernel=False)) as prog:  # never jumps
        assert prog() == (True,)


def test_a_loop_that_never_ends_can_be_interrupted() -> None:
    """A loop whose condition is recomputed but never true runs until interrupted, as in ExecuTorch; Ctrl-C works."""
    import signal

    from executorch.exir import schema as s

    values = [s.EValue(s.Bool(False)), s.EValue(s.Int(1)), s.EValue(s.Int(2))]
    instructions = [s.KernelCall(op_index=0, args=[1, 2, 0]), s.JumpFalseCall(cond_value_index=0,
                                                                            destination_instruction=0)]
    data = hand_program(values, instructions, [("executorch_prim::eq", "Scalar")], outputs=[0])

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    prog = Program(data)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with pytest.raises(KeyboardInterrupt):  # not swallowed into an ExecutionError
            prog()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        prog.close()


# -- dtypes numpy cannot hold (found by tests/runtime/test_fuzz_runtime.py) ---------------------------------------


def test_bfloat16_planned_io_with_torch_kernels() -> None:
    """A bfloat16 planned input/output loads (it raised TypeError at load); numpy callers pass ml_dtypes' bfloat16
    where it is installed, and get typed errors otherwise."""
    from executorch.exir import schema as s

    st = _st().BFLOAT16
    values = [hand_tensor(st, [2, 3], alloc=(1, 0)), hand_tensor(st, [2, 3], alloc=(1, 16))]
    data = hand_program(values, [s.KernelCall(op_index=0, args=[0, 1, 1])], [("aten::relu", "out")], inputs=[0],
                        outputs=[1], buffer_sizes=[0, 32])
    x = torch.tensor([[-1.0, 2.0, -3.0], [4.0, -5.0, 6.0]], dtype=torch.bfloat16)
    with Program(data, kernels="torch") as prog:
        torch.testing.assert_close(prog(x)[0], torch.relu(x))
        try:
            import ml_dtypes
        except ImportError:
            with pytest.raises(InputError, match=r"input 0: a BFLOAT16 input must be a CPU torch tensor"):
                prog(np.ones((2, 3), np.float32))
            return
        with pytest.raises(InputError, match=r"input 0 must be bfloat16, got float32"):
            prog(np.ones((2, 3), np.float32))
        got = prog(x.view(torch.int16).numpy().view(ml_dtypes.bfloat16))[0]
        assert got.dtype == ml_dtypes.bfloat16
        np.testing.assert_array_equal(got.view(np.int16), torch.relu(x).view(torch.int16).numpy())


# -- writes into constant data (read-only file memory) ------------------------------------------------------


def _constant_write_programs() -> dict[str, bytes]:
    """Programs whose kernels write a constant: directly, after a MoveCall, through et_view, in an out list."""
    from executorch.exir import schema as s

    from tests.fixtures.pte import serialize_program

    f = _st().FLOAT

    def program(values: list[Any], instructions: list[Any], ops: list[tuple[str, str]]) -> bytes:
        plan = s.ExecutionPlan(
            name="forward", container_meta_type=s.ContainerMetadata("", ""), values=values, inputs=[1], outputs=[1],
            chains=[s.Chain(inputs=[1], outputs=[1], instructions=[s.Instruction(i) for i in instructions],
                            stacktrace=None)],
            operators=[s.Operator(n, o) for n, o in ops], delegates=[], non_const_buffer_sizes=[0, 32])
        prog = s.Program(version=0, execution_plan=[plan], constant_buffer=[s.Buffer(storage=b""),
                                                                           s.Buffer(storage=bytes(16))],
                         backend_delegate_data=[], segments=[],
                         constant_segment=s.SubsegmentOffsets(segment_index=0, offsets=[]))
        out = io.BytesIO()
        serialize_program(prog).write_to_file(out)
        return out.getvalue()

    const, x = hand_tensor(f, [4], data_buffer_idx=1), hand_tensor(f, [4], alloc=(1, 0))
    spare, false = hand_tensor(f, [4], alloc=(1, 16)), s.EValue(s.Bool(False))
    sizes = s.EValue(s.IntList([4]))
    return {
        "copy_": program([const, x, false], [s.KernelCall(0, [0, 1, 2, 0])], [("aten::copy_", "")]),
        "out": program([const, x], [s.KernelCall(0, [1, 0, 0])], [("aten::relu", "out")]),
        "move": program([const, x, spare], [s.MoveCall(0, 2), s.KernelCall(0, [1, 2, 2])], [("aten::relu", "out")]),
        "view": program([const, x, sizes, spare, s.EValue(s.Int(4))],
                        [s.KernelCall(0, [0, 2, 3]), s.KernelCall(1, [1, 3, 3])],
                        [("executorch_prim::et_view", "default"), ("aten::relu", "out")]),
        "list": program([const, x, s.EValue(s.TensorList([0])), s.EValue(s.Int(1)), s.EValue(s.Int(0))],
                        [s.KernelCall(0, [1, 3, 4, 2, 2])], [("aten::split_copy", "Tensor_out")]),
    }


CHILD = """
import sys
sys.path.insert(0, {root!r})
import numpy as np, pyrt
from tests.runtime.test_hostile_programs import _constant_write_programs
for name, data in _constant_write_programs().items():
    path = {tmp!r} + "/" + name + ".pte"
    open(path, "wb").write(data)
    for kernels in ("torch", "numpy"):
        for source in (data, path):
            print(name, kernels, type(source).__name__, end=" ", flush=True)
            try:
                with pyrt.Program(source, kernels=kernels) as prog:
                    prog(np.ones(4, np.float32))
                print("ran", flush=True)
            except pyrt.PyrtError as exc:
                print(type(exc).__name__, str(exc).replace(chr(10), " "), flush=True)
"""


def test_writing_constant_data_is_refused_at_load(tmp_path: Path) -> None:
    """torch writes through read-only file memory and the process dies (SIGSEGV): hence a child process."""
    proc = subprocess.run([sys.executable, "-c", CHILD.format(root=str(ROOT), tmp=str(tmp_path))], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, f"child exited {proc.returncode} after {lines[-1:]}: {proc.stderr[-1500:]}"
    assert len(lines) == 20, lines
    for line in lines:
        assert "PteFormatError" in line and "holds constant data from the file (read-only)" in line, line


# -- a static out tensor of another shape than the result (torch resizes it with a warning only) -------------


@pytest.mark.parametrize("out_sizes", [[2, 4], [3], [3, 2]])
@pytest.mark.parametrize("kernels", ["torch", "numpy"])
def test_static_out_of_another_shape_is_refused(out_sizes: list[int], kernels: str) -> None:
    """torch's relu.out would resize the planned (static) out and hand back another shape than the file
    declares; both kernel sets refuse, naming the instruction, the operator and both shapes, on every run."""
    import warnings

    from executorch.exir import schema as s

    f = _st().FLOAT
    values = [hand_tensor(f, [2, 3], alloc=(1, 0)), hand_tensor(f, out_sizes, alloc=(1, 32))]
    data = hand_program(values, [s.KernelCall(op_index=0, args=[0, 1, 1])], [("aten::relu", "out")], inputs=[0],
                        outputs=[1], buffer_sizes=[0, 64])
    planned = re.escape(str(tuple(out_sizes)))
    with warnings.catch_warnings(), Program(data, kernels=kernels) as prog:
        warnings.simplefilter("ignore", UserWarning)  # torch's own "An output ... was resized"
        for _ in range(2):
            with pytest.raises(InputError, match=rf"instruction 0 \(aten::relu\.out\): result shape \(2, 3\) does "
                                                 rf"not match the planned {planned}"):
                prog(np.ones((2, 3), np.float32))


@pytest.mark.parametrize("kernels", ["torch", "numpy"])
def test_static_out_of_the_result_shape_runs(kernels: str) -> None:
    from executorch.exir import schema as s

    f = _st().FLOAT
    values = [hand_tensor(f, [2, 3], alloc=(1, 0)), hand_tensor(f, [2, 3], alloc=(1, 32))]
    data = hand_program(values, [s.KernelCall(op_index=0, args=[0, 1, 1])], [("aten::relu", "out")], inputs=[0],
                        outputs=[1], buffer_sizes=[0, 64])
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    with Program(data, kernels=kernels) as prog:
        for _ in range(2):
            np.testing.assert_array_equal(prog(x)[0], np.maximum(x, 0))
