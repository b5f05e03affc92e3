"""ExecuTorch's weight-only quantized operators in pyrt's numpy and torch kernels (pyrt/kernels/quantized.py).

Against ExecuTorch's own Python definitions of ``embedding_byte`` / ``embedding_4bit`` and against
ExecuTorch's runtime on the same hand-built file; hostile files (zero / NaN scales, scales of the wrong
shape, packed values of the wrong size or dtype) are typed errors when the method loads.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("executorch")

import pyrt  # noqa: E402
from pyrt.errors import InputError, PteFormatError  # noqa: E402
from pyrt.format.weight_quant import pack_int4  # noqa: E402
from pyrt.kernels.quantized import embedding, torch_embedding  # noqa: E402
from tests.fixtures.pte import hand_tensor, serialize_program  # noqa: E402

RNG = np.random.default_rng(0)


def _theirs(bits: int, weight: np.ndarray, scales: np.ndarray, zp: np.ndarray | None, idx: np.ndarray,
            dtype: Any) -> np.ndarray:
    import executorch.exir  # noqa: F401  (ExecuTorch's Python definitions of the quantized ops)

    op = torch.ops.quantized_decomposed.embedding_4bit if bits == 4 else torch.ops.quantized_decomposed.embedding_byte
    lo, hi = (-8, 7) if bits == 4 else (-128, 127)
    zero = None if zp is None else torch.from_numpy(zp)
    return op.dtype(torch.from_numpy(weight), torch.from_numpy(scales), zero, lo, hi, torch.from_numpy(idx),
                    dtype=dtype).float().numpy()


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("groups", [1, 2, 4])
@pytest.mark.parametrize("zero_points", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_kernels_compute_what_executorch_defines(bits: int, groups: int, zero_points: bool, dtype: str) -> None:
    q = RNG.integers(-8 if bits == 4 else -127, 8 if bits == 4 else 128, (6, 16)).astype(np.int8)
    weight = pack_int4(q, "offset8") if bits == 4 else q
    scales = (RNG.random((6, groups)) * 0.1 + 0.01).astype(dtype)
    zp = RNG.integers(-2, 3, (6, groups)).astype(dtype) if zero_points else None
    idx = np.array([[5, 0, 3], [1, 1, 2]])
    want = _theirs(bits, weight, scales, zp, idx, getattr(torch, dtype))
    got = embedding(weight, scales, zp, idx, bits=bits).astype(dtype).astype(np.float32)
    got_t = torch_embedding(*(None if a is None else torch.from_numpy(a) for a in (weight, scales, zp, idx)),
                            bits=bits, dtype=getattr(torch, dtype)).float().numpy()
    assert got.shape == (2, 3, 16)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got_t, want)


def test_an_index_outside_the_rows_is_an_input_error() -> None:
    weight, scales = np.zeros((4, 8), np.uint8), np.ones((4, 1), np.float32)
    with pytest.raises(InputError, match=r"index 4 is outside \[0, 4\)"):
        embedding(weight, scales, None, np.array([0, 4]), bits=4)
    with pytest.raises(InputError, match=r"index -1 is outside"):
        torch_embedding(torch.from_numpy(weight), torch.from_numpy(scales), None, torch.tensor([-1]), bits=4,
                        dtype=torch.float32)


# -- a hand-built file: embedding_4bit.out(weight, scales, None, -8, 7, indices) -> [3, 16] ----------------------


def _program(weight: np.ndarray, scales: np.ndarray, *, out_cols: int = 16, op: str = "embedding_4bit") -> bytes:
    from executorch.exir import schema as s
    from executorch.exir.scalar_type import ScalarType as ST

    kinds = {np.dtype(np.uint8): ST.BYTE, np.dtype(np.int8): ST.CHAR, np.dtype(np.float32): ST.FLOAT,
             np.dtype(np.float16): ST.HALF}
    values = [hand_tensor(kinds[weight.dtype], list(weight.shape), data_buffer_idx=1),
              hand_tensor(kinds[scales.dtype], list(scales.shape), data_buffer_idx=2), s.EValue(s.Null()),
              s.EValue(s.Int(-8)), s.EValue(s.Int(7)), hand_tensor(ST.LONG, [3], alloc=(1, 0)),
              hand_tensor(ST.FLOAT, [3, out_cols], alloc=(1, 32))]
    plan = s.ExecutionPlan(
        name="forward", container_meta_type=s.ContainerMetadata("", ""), values=values, inputs=[5], outputs=[6],
        chains=[s.Chain(inputs=[5], outputs=[6], stacktrace=None,  # the out twice: argument and return, as ET emits
                        instructions=[s.Instruction(s.KernelCall(0, [0, 1, 2, 3, 4, 5, 6, 6]))])],
        operators=[s.Operator(f"quantized_decomposed::{op}", "out")], delegates=[],
        non_const_buffer_sizes=[0, 32 + 4 * 3 * out_cols])
    prog = s.Program(version=0, execution_plan=[plan], backend_delegate_data=[], segments=[],
                     constant_buffer=[s.Buffer(storage=b""), s.Buffer(storage=weight.tobytes()),
                                      s.Buffer(storage=scales.tobytes())],
                     constant_segment=s.SubsegmentOffsets(segment_index=0, offsets=[]))
    out = io.BytesIO()
    serialize_program(prog).write_to_file(out)
    return out.getvalue()


WEIGHT = pack_int4(RNG.integers(-7, 8, (5, 16)).astype(np.int8), "offset8")
SCALES = (RNG.random((5, 2)) * 0.1 + 0.01).astype(np.float32)
INDICES = np.array([4, 0, 2], np.int64)


@pytest.mark.parametrize("kernels", ["numpy", "torch"])
def test_a_file_runs_as_in_executorchs_runtime(kernels: str) -> None:
    import executorch.kernels.quantized  # noqa: F401  (the quantized kernels in ExecuTorch's runtime)
    from executorch.runtime import Runtime

    data = _program(WEIGHT, SCALES)
    theirs = Runtime.get().load_program(data).load_method("forward").execute([torch.from_numpy(INDICES)])[0]
    with pyrt.Program(data, kernels=kernels) as prog:
        (ours,) = prog(INDICES)  # a file without a container spec: a tuple of outputs
        with pytest.raises(InputError, match="index 5 is outside"):
            prog(np.array([0, 5, 1], np.int64))
    np.testing.assert_array_equal(ours, theirs.numpy())
    np.testing.assert_array_equal(ours, embedding(WEIGHT, SCALES, None, INDICES, bits=4))


def _with(a: np.ndarray, pos: tuple[int, int], value: float) -> np.ndarray:
    out = a.copy()
    out[pos] = value
    return out


HOSTILE = {
    "zero scale": (dict(weight=WEIGHT, scales=_with(SCALES, (3, 1), 0.0)), r"scale \[3, 1\] is 0.0"),
    "NaN scale": (dict(weight=WEIGHT, scales=_with(SCALES, (0, 0), np.nan)), r"scale \[0, 0\] is nan"),
    "scales of another row count": (dict(weight=WEIGHT, scales=SCALES[:4]), r"scales \(value 1\) are float32\[4, 2\]"),
    "groups that do not divide a row": (dict(weight=WEIGHT, scales=np.ones((5, 3), np.float32)),
                                        "hold 3 groups per row, which do not divide 16"),
    "packed values of the wrong size": (dict(weight=WEIGHT[:, :7], scales=SCALES), r"holds rows of 14 values"),
    "values of the wrong dtype": (dict(weight=WEIGHT.view(np.int8), scales=SCALES), r"int4 values need .* uint8"),
    "scales of an integer dtype": (dict(weight=WEIGHT, scales=np.ones((5, 2), np.int8)), r"are int8\[5, 2\]"),
}


@pytest.mark.parametrize("kernels", ["numpy", "torch"])
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_quantized_constants_are_refused_at_load(case: str, kernels: str) -> None:
    kwargs, match = HOSTILE[case]
    with pytest.raises(PteFormatError, match=match):
        pyrt.Program(_program(**kwargs), kernels=kernels)
