"""Delegate steps: one TensorRT launch per ``DelegateCall`` instruction, with its staging copies.

A delegate step checks its inputs, sets input shapes, resizes outputs to the inferred shapes
and enqueues the engine on the run's stream of its device (:mod:`pyrt.runtime.device_context`);
inputs and outputs that live elsewhere are staged through device buffers. A delegate whose
shapes are all planned is checked on its first run, then only copies and the launch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyrt.errors import EngineError, PteFormatError
from pyrt.kernels.base import Step
from pyrt.memory.host import TorchHost
from pyrt.memory.layout import numpy_dtype
from pyrt.memory.table import ValueTable
from pyrt.memory.tensors import DeviceTensor
from pyrt.pte_reader import DelegateCall
from pyrt.runtime.cuda_graphs import data_dependent_refusal, mark_capturable, refuse_capture
from pyrt.runtime.delegates import TensorRTDelegate
from pyrt.runtime.device_context import DeviceContext
from pyrt.runtime.load_plan import MethodLoadPlan


def step_factory(ctx: DeviceContext, load_plan: MethodLoadPlan,
                 table: ValueTable) -> Callable[[int, DelegateCall, int], Step]:
    """The builder of ``load_plan``'s delegate steps (its engines loaded), run on ``ctx``'s streams."""

    def make(pc: int, ins: DelegateCall, pos: int) -> Step:
        return _delegate_step(ctx, load_plan.delegates[ins.delegate_index], ins, table)

    return make


@dataclass
class _Port:
    index: int  # value index
    get: Callable[[], Any]
    dtype: str
    staging: DeviceTensor | None = None
    host: bool = False
    device: int | None = None
    dynamic: bool = False
    sizes: tuple[int, ...] = field(default_factory=tuple)


def _flat_args(table: ValueTable, args: Sequence[int]) -> list[int]:
    out: list[int] = []
    for a in args:
        if table.kinds[a] == "TensorList":
            out.extend(table.items[a])
        else:
            out.append(a)
    return out


def _ports(ctx: DeviceContext, d: TensorRTDelegate, table: ValueTable, idxs: Sequence[int],
           bindings: Sequence[Any]) -> list[_Port]:
    ports = []
    for j, b in zip(idxs, bindings, strict=True):
        info = table.infos.get(j)
        if info is None:
            raise PteFormatError(f"{d.source}: delegate argument value {j} ({table.kinds[j]}) is not a tensor")
        if info.scalar_type.dtype_name != b.dtype:
            raise PteFormatError(f"{d.source}: binding {b.name!r} is {b.dtype} but value {j} is "
                                 f"{info.scalar_type.dtype_name}")
        port = _Port(j, table.getter(j), b.dtype, dynamic=info.dynamic, sizes=info.sizes, device=info.device)
        if info.device != d.device:
            port.staging = ctx.staging(d.device, info)
            port.host = info.device is None
        ports.append(port)
    return ports


def _delegate_step(ctx: DeviceContext, d: TensorRTDelegate, ins: DelegateCall, table: ValueTable) -> Step:
    engine = d.engine
    flat = _flat_args(table, ins.args)
    n_in, n_out = len(engine.input_names), len(engine.output_names)
    if len(flat) != n_in + n_out:
        raise PteFormatError(f"{d.source}: the call passes {len(flat)} tensors, the engine has {n_in} inputs "
                             f"and {n_out} outputs")
    written = [j for j in flat[n_in:] if j in table.read_only]
    if written:
        raise PteFormatError(f"{d.source}: the call writes value {written[0]}, which holds constant data from the "
                             f"file (read-only)")
    bindings = [b for b in d.blob.io_bindings if b.is_input]
    out_bindings = {b.name: b for b in d.blob.io_bindings if not b.is_input}
    ins_ = _ports(ctx, d, table, flat[:n_in], bindings)
    outs = _ports(ctx, d, table, flat[n_in:], [out_bindings[n] for n in engine.output_names])
    torch_host = isinstance(table.host, TorchHost)
    dynamic = any(p.dynamic for p in ins_)
    device = d.device
    static_shapes: list[tuple[int, ...]] = []
    if not dynamic and not any(p.dynamic for p in outs):
        return _static_delegate_step(ctx, engine, ins_, outs, device, table, torch_host)

    def step() -> None:  # dynamic shapes, or outputs whose shape only the run decides (pyrt.device.output_allocator)
        stream = ctx.stream(device)
        shapes = [_stage_in(ctx, p, device, stream, torch_host) for p in ins_]
        engine.check_inputs([(s, p.dtype) for s, p in zip(shapes, ins_, strict=True)])
        engine.use_profile(stream.handle)
        if dynamic or not static_shapes:
            out_shapes = engine.infer_output_shapes(shapes)
            if not dynamic:
                static_shapes[:] = out_shapes
        else:
            out_shapes = static_shapes
        targets = [_out_target(p, s, table) for p, s in zip(outs, out_shapes, strict=True)]
        in_ptrs = [(p.staging if p.staging is not None else p.get()).ptr for p in ins_]
        engine.execute(in_ptrs, [t.ptr for t in targets], stream.handle, [t.nbytes for t in targets])
        for k, name in enumerate(engine.output_names):  # data-dependent: the shape TensorRT reported, before
            if name in engine.data_dependent:           # any later step (or the copy below) reads the output
                targets[k] = _out_target(outs[k], engine.reported_shape(name), table)
        for p, t in zip(outs, targets, strict=True):
            if p.staging is not None:
                _stage_out(ctx, p, t, device, stream, table, torch_host)

    refuse_capture(step, data_dependent_refusal(d.name, d.blob.io_bindings))
    return step


def _static_delegate_step(ctx: DeviceContext, engine: Any, ins_: list[_Port], outs: list[_Port], device: int,
                          table: ValueTable, torch_host: bool) -> Step:
    """A delegate whose shapes are all planned: checked on the first run, then only copies and the launch.

    Addresses are those of memory-planned arenas and staging buffers, fixed for the
    program's life, so the first run's checks (input shapes against the engine's profile,
    output shapes against the plan) hold for every later run.
    """
    ptrs: list[int] = []
    staged_in = [p for p in ins_ if p.staging is not None]
    staged_out = [p for p in outs if p.staging is not None]

    def first() -> list[int]:
        shapes = [tuple(p.get().shape) if p.staging is None else p.sizes for p in ins_]
        engine.check_inputs([(s, p.dtype) for s, p in zip(shapes, ins_, strict=True)])
        out_shapes = engine.infer_output_shapes(shapes)
        targets = [_out_target(p, s, table) for p, s in zip(outs, out_shapes, strict=True)]
        return [int((p.staging if p.staging is not None else p.get()).ptr) for p in ins_] + \
            [int(t.ptr) for t in targets]

    def step() -> None:
        stream = ctx.stream(device)
        for p in staged_in:
            _stage_in(ctx, p, device, stream, torch_host)
        if not ptrs:
            ptrs.extend(first())
        engine.enqueue(ptrs, stream.handle)
        for p in staged_out:
            _stage_out(ctx, p, p.staging, device, stream, table, torch_host)  # type: ignore[arg-type]

    if not staged_in and not staged_out:  # device memory of its own device only: one launch, capturable
        mark_capturable(step, device)
    return step


def _stage_in(ctx: DeviceContext, p: _Port, device: int, stream: Any, torch_host: bool) -> tuple[int, ...]:
    src = p.get()
    if p.staging is None:
        return tuple(src.shape)
    shape = tuple(int(s) for s in src.shape)
    p.staging.resize(shape, f"delegate input value {p.index}")
    if p.host:
        arr = src.numpy() if torch_host else src
        if arr.nbytes:
            ctx.copy_to_device(p.staging.allocation, arr, stream)
    elif src.nbytes:
        ctx.order(src.device, device)
        ctx.cuda.memcpy_peer(p.staging.allocation, src.allocation, src.nbytes, src_offset=src.offset, stream=stream)
    return shape


def _out_target(p: _Port, shape: tuple[int, ...], table: ValueTable) -> DeviceTensor:
    if min(shape, default=0) < 0:  # data-dependent: the planned buffer at its bound until TensorRT reports the shape
        shape = p.sizes
    if not p.dynamic and shape != p.sizes:
        raise EngineError(f"engine output for value {p.index} has shape {shape}, the program planned {p.sizes}")
    if p.staging is not None:
        p.staging.resize(shape, f"delegate output value {p.index}")
        return p.staging
    t = p.get()
    if p.dynamic and tuple(t.shape) != shape:
        t = table.resize(p.index, shape)
    return t


def _stage_out(ctx: DeviceContext, p: _Port, staged: DeviceTensor, device: int, stream: Any, table: ValueTable,
               torch_host: bool) -> None:
    shape = staged.shape
    dst = p.get()
    if p.dynamic and tuple(dst.shape) != shape:
        dst = table.resize(p.index, shape)
    if p.host:
        arr = dst.numpy() if torch_host else dst
        if arr.dtype != numpy_dtype(staged.scalar_type) or not arr.flags.c_contiguous:
            raise EngineError(f"delegate output value {p.index} needs a contiguous {staged.dtype} host tensor")
        if staged.nbytes:
            ctx.cuda.memcpy_dtoh(arr, staged.allocation, stream=stream)
            stream.synchronize()  # host kernels read it next
        return
    if staged.nbytes:
        ctx.order(device, dst.device)
        ctx.cuda.memcpy_peer(dst.allocation, staged.allocation, staged.nbytes, dst_offset=dst.offset,
                             stream=ctx.stream(dst.device))
