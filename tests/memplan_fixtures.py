"""Hand-made programs for the memory-plan tests (issue 23): chains of reference engines with declared
activation memory, optimization profiles and streamable weights, one chain per method."""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pyrt.format.trt_blob import IOBinding, encode_blob
from pyrt.testing.refengine import Ref, RefEngine, RefNode, RefProfile, RefTensor
from tests.ptefixtures import serialize_program

MiB = 1 << 20


def add_engine(value: float, *, activation: int = 0, weight_bytes: int = 0, streaming: bool = False,
               shape: tuple[int, ...] = (2, 3), profiles: Sequence[RefProfile] = (),
               bounds: tuple[tuple[int, ...], tuple[int, ...]] | None = None) -> RefEngine:
    """y = x + value (+ 0 * sum of a weight of ``weight_bytes`` zeros when given)."""
    lo, hi = bounds or (None, None)
    w = np.full(shape if -1 not in shape else (1,) * len(shape), value, np.float32)
    weights = {"w": w}
    nodes = [RefNode("aten::add.Tensor", [Ref("x"), Ref("w")], {}, ["y"])]
    if weight_bytes:  # in 8 pieces: the fake's streaming scratch is the largest weight
        for k in range(8):
            weights[f"big{k}"] = np.zeros(weight_bytes // 32, np.float32)
        nodes = [RefNode("aten::sum", [Ref("big0")], {}, ["s"]),
                 RefNode("aten::add.Tensor", [Ref("x"), Ref("w")], {}, ["t"]),
                 RefNode("aten::add.Tensor", [Ref("t"), Ref("s")], {}, ["y"])]
    return RefEngine([RefTensor("x", "float32", shape, lo, hi)], [RefTensor("y", "float32", shape)],
                     weights=weights, nodes=nodes, weight_streaming=streaming, profiles=list(profiles),
                     device_memory=0 if profiles else activation)


def chain_program(methods: Mapping[str, Sequence[RefEngine]], *, sizes: Sequence[int] = (2, 3),
                  dynamic: bool = False, arena_on_device: bool = False, arena_bytes: int = 0) -> bytes:
    """A program whose methods each run their engines one after another (value i -> value i+1 on cuda:0).

    Values are float32 ``sizes`` (the upper bound when ``dynamic``) in one arena per method, on the
    host or (``arena_on_device``) on cuda:0, of at least ``arena_bytes``.
    """
    from executorch.exir import schema as s
    from executorch.exir.scalar_type import ScalarType

    nbytes = math.prod(sizes) * 4
    dyn = s.TensorShapeDynamism.DYNAMIC_BOUND if dynamic else s.TensorShapeDynamism.STATIC
    blobs: list[Any] = []
    plans = []
    for name, engines in methods.items():
        values = [s.EValue(s.Tensor(scalar_type=ScalarType.FLOAT, storage_offset=0, sizes=list(sizes),
                                    dim_order=list(range(len(sizes))), requires_grad=False, layout=0,
                                    data_buffer_idx=0, shape_dynamism=dyn,
                                    allocation_info=s.AllocationDetails(memory_id=1, memory_offset_low=k * nbytes,
                                                                        memory_offset_high=0)))
                  for k in range(len(engines) + 1)]
        delegates, instructions = [], []
        for i, eng in enumerate(engines):
            shape = tuple(eng.inputs[0].shape)
            bindings = [IOBinding("x", "float32", shape, True), IOBinding("y", "float32", shape, False)]
            blobs.append(s.BackendDelegateInlineData(data=encode_blob(eng.to_bytes(), bindings, device_id=0)))
            ref = s.BackendDelegateDataReference(location=s.DataLocation.INLINE, index=len(blobs) - 1)
            delegates.append(s.BackendDelegate(id="TensorRTBackend", processed=ref,
                                               compile_specs=[s.CompileSpec("target_device", b"cuda:0")]))
            instructions.append(s.Instruction(s.DelegateCall(delegate_index=i, args=[i, i + 1])))
        last = len(engines)
        plans.append(s.ExecutionPlan(
            name=name, container_meta_type=s.ContainerMetadata("", ""), values=values, inputs=[0], outputs=[last],
            chains=[s.Chain(inputs=[0], outputs=[last], stacktrace=None, instructions=instructions)],
            operators=[], delegates=delegates, non_const_buffer_sizes=[0, max(arena_bytes, nbytes * (last + 1))],
            non_const_buffer_device=[s.NonConstBufferDevice(buffer_idx=1, device_type=s.DeviceType.CUDA,
                                                            device_index=0)] if arena_on_device else None))
    program = s.Program(version=0, execution_plan=plans, constant_buffer=[], backend_delegate_data=blobs,
                        segments=[], constant_segment=s.SubsegmentOffsets(segment_index=0, offsets=[]))
    buf = io.BytesIO()
    serialize_program(program).write_to_file(buf)
    return buf.getvalue()
