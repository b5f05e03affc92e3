"""Programs for tests/test_gpu_programs.py: exported once with ExecuTorch, or read prebuilt.

Where ExecuTorch is installed they are written into a temporary directory; a
GPU machine without it (the device machine: docs/hardware.md) reads the same
files, made here by ``scripts/gpu_check.py prepare``, from ``$PYRT_PREBUILT_PTE``.
Each ``NAME.pte`` has ``NAME.npz`` beside it holding inputs and eager outputs.

>>> sorted(NAMES)
['device_in', 'device_out', 'engines_swapped', 'graph_break', 'host_kernels', 'trt_only', 'two_engines']
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import numpy as np

NAMES = ("graph_break", "trt_only", "two_engines", "device_in", "device_out", "engines_swapped", "host_kernels")
BATCHES = (3, 1, 8)  # graph_break has a dynamic batch dimension (1..8)
HANDMADE_W = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)


def programs_for(tmp_path_factory: Any) -> dict[str, Path]:
    """The programs for a test module: prebuilt ones if ``$PYRT_PREBUILT_PTE`` names them, else built now
    (skipping the module where torch or ExecuTorch is missing)."""
    import pytest

    prebuilt = prebuilt_dir()
    if prebuilt is not None:
        return load(prebuilt)
    pytest.importorskip("torch")
    pytest.importorskip("executorch")
    return build_all(tmp_path_factory.mktemp("programs"))


def prebuilt_dir() -> Path | None:
    value = os.environ.get("PYRT_PREBUILT_PTE")
    return Path(value) if value else None


def build_all(directory: Path) -> dict[str, Path]:
    """Export every program into ``directory`` (needs torch and ExecuTorch); returns name -> path."""
    import torch

    from pyrt.export import to_pte
    from tests.ptefixtures import handmade_two_engines

    class GraphBreak(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.l1, self.l2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

        def forward(self, x: Any) -> Any:
            return self.l2(torch.sin(torch.relu(self.l1(x)))) * 2  # sin stays in ExecuTorch

    class HostKernels(torch.nn.Module):
        """An engine, host kernels, another engine: host arenas are reused while copies may be queued."""

        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 3)
            self.table = torch.nn.Parameter(torch.randn(10, 3), requires_grad=False)
            self.scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, 3), requires_grad=False)

        def forward(self, x: Any, idx: Any) -> Any:
            return torch.sigmoid(self.lin(x)) + self.table[idx] * self.scale

    class EngineOnly(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.l1 = torch.nn.Linear(4, 3)

        def forward(self, x: Any) -> Any:
            return torch.relu(self.l1(x))

    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    graph_break, only = GraphBreak().eval(), EngineOnly().eval()
    paths = {name: directory / f"{name}.pte" for name in NAMES}
    to_pte(graph_break, paths["graph_break"], (torch.randn(3, 8),), builder="reference",
           torch_executed_ops=["aten.sin.default"], dynamic_shapes={"x": {0: torch.export.Dim("b", min=1, max=8)}},
           device={0: "cuda:0", 1: "cuda:1"}, weight_streaming=True, weight_streaming_budget={1: 256, "*": None},
           progress=False)
    to_pte(only, paths["trt_only"], (torch.randn(2, 4),), builder="reference", weight_streaming=True,
           progress=False)
    host_kernels = HostKernels().eval()
    idx = torch.tensor([1, 7])
    to_pte(host_kernels, paths["host_kernels"], (torch.randn(2, 4), idx), builder="reference", progress=False,
           torch_executed_ops=["aten.sigmoid.default", "aten.index.Tensor", "aten.mul.Tensor"])
    handmade_two_engines(paths["two_engines"], HANDMADE_W)
    handmade_two_engines(paths["device_in"], HANDMADE_W, in_on_device=True)
    handmade_two_engines(paths["device_out"], HANDMADE_W, out_on_device=True)
    handmade_two_engines(paths["engines_swapped"], HANDMADE_W, engine_devices=(1, 0))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        xs = {f"x{b}": torch.randn(b, 8, generator=gen) for b in BATCHES}
        np.savez(paths["graph_break"].with_suffix(".npz"), **{k: v.numpy() for k, v in xs.items()},
                 **{f"y{k[1:]}": graph_break(v).numpy() for k, v in xs.items()})
        x = torch.randn(2, 4, generator=gen)
        np.savez(paths["trt_only"].with_suffix(".npz"), x=x.numpy(), y=only(x).numpy())
        xs = [torch.randn(2, 4, generator=gen) for _ in range(3)]
        np.savez(paths["host_kernels"].with_suffix(".npz"), idx=idx.numpy(),
                 **{f"x{i}": v.numpy() for i, v in enumerate(xs)},
                 **{f"y{i}": host_kernels(v, idx).numpy() for i, v in enumerate(xs)})
    for name in ("two_engines", "device_in", "device_out", "engines_swapped"):
        x = np.random.default_rng(2).standard_normal((2, 3)).astype(np.float32)
        np.savez(paths[name].with_suffix(".npz"), x=x, y=np.maximum(x, 0) ** 2 + HANDMADE_W)
    return paths


def load(directory: Path) -> dict[str, Path]:
    """name -> path of prebuilt programs in ``directory`` (each with its .npz)."""
    paths = {name: directory / f"{name}.pte" for name in NAMES}
    missing = [str(p) for p in paths.values() if not p.is_file() or not p.with_suffix(".npz").is_file()]
    if missing:
        raise FileNotFoundError(f"prebuilt programs missing: {missing}")
    return paths


def chain_program(path: Path, n: int, *, device_io: bool = False) -> Path:
    """N engines on cuda:0, each ``y = relu(x) * 2``; the values between them live in a cuda:0 arena,
    the input and output on the host. The middle engines touch device memory only (CUDA-graph material).
    ``device_io``: the input and output live in the cuda:0 arena too (the whole method is one graph)."""
    from executorch.exir import schema as s
    from executorch.exir.scalar_type import ScalarType as ST

    from pyrt.format.trt_blob import IOBinding, encode_blob
    from pyrt.testing.refengine import Ref, RefEngine, RefNode, RefTensor
    from tests.ptefixtures import serialize_program

    def tensor(mem: int, off: int) -> Any:
        return s.EValue(s.Tensor(scalar_type=ST.FLOAT, storage_offset=0, sizes=[4], dim_order=[0],
                                 requires_grad=False, layout=0, data_buffer_idx=0,
                                 allocation_info=s.AllocationDetails(memory_id=mem, memory_offset_low=off,
                                                                     memory_offset_high=0),
                                 shape_dynamism=s.TensorShapeDynamism.STATIC))

    relu = RefEngine([RefTensor("x", "float32", (4,))], [RefTensor("y", "float32", (4,))],
                     nodes=[RefNode("aten::relu", [Ref("x")], {}, ["r"]),
                            RefNode("aten::add.Tensor", [Ref("r"), Ref("r")], {}, ["y"])]).to_bytes()
    bindings = [IOBinding("x", "float32", (4,), True), IOBinding("y", "float32", (4,), False)]
    blob = encode_blob(relu, bindings, device_id=0)
    if device_io:
        values = [tensor(2, 16 * (k % 2)) for k in range(n + 1)]
    else:
        values = [tensor(1, 0)] + [tensor(2, 16 * (k % 2)) for k in range(n - 1)] + [tensor(1, 16)]
    delegates = [s.BackendDelegate(id="TensorRTBackend",
                                   processed=s.BackendDelegateDataReference(location=s.DataLocation.INLINE, index=0),
                                   compile_specs=[s.CompileSpec("target_device", b"cuda:0")]) for _ in range(n)]
    plan = s.ExecutionPlan(
        name="forward", container_meta_type=s.ContainerMetadata("", ""), values=values, inputs=[0], outputs=[n],
        chains=[s.Chain(inputs=[0], outputs=[n], stacktrace=None, instructions=[
            s.Instruction(s.DelegateCall(delegate_index=k, args=[k, k + 1])) for k in range(n)])],
        operators=[], delegates=delegates, non_const_buffer_sizes=[0, 32, 32],
        non_const_buffer_device=[s.NonConstBufferDevice(buffer_idx=2, device_type=s.DeviceType.CUDA,
                                                        device_index=0)])
    program = s.Program(version=0, execution_plan=[plan], constant_buffer=[],
                        backend_delegate_data=[s.BackendDelegateInlineData(data=blob)], segments=[],
                        constant_segment=s.SubsegmentOffsets(segment_index=0, offsets=[]))
    buf = io.BytesIO()
    serialize_program(program).write_to_file(buf)
    path.write_bytes(buf.getvalue())
    return path


def chain_expected(x: np.ndarray, n: int) -> np.ndarray:
    """What :func:`chain_program` of ``n`` engines computes from ``x``: relu, then doubled ``n`` times."""
    return np.maximum(x, 0) * 2 ** n


def chain_inputs(runs: int) -> list[np.ndarray]:
    """``runs`` seeded random float32 inputs of the chain programs' shape (4,)."""
    rng = np.random.default_rng(0)
    return [rng.standard_normal(4).astype(np.float32) for _ in range(runs)]

