"""Write a fully delegated program's .pte directly, as ExecuTorch's lowering would, without importing it.

Most models become one engine: graph inputs -> one ``pyrt::execute_engine``
call -> its outputs, nothing else. For that shape ExecuTorch's lowering
(``to_edge_transform_and_lower`` + ``to_executorch``, seconds of imports) has
a fixed result, which this module writes itself:

- values: the CPU inputs, their CUDA copies, the delegate's outputs (CUDA),
  their CPU copies; sizes at their upper bounds (``DYNAMIC_BOUND`` when any
  dimension is symbolic), contiguous dim order;
- instructions: ``et_copy::_h2d_copy.out`` per input, one ``DelegateCall``,
  ``et_copy::_d2h_copy.out`` per output;
- memory: ExecuTorch's greedy planner (:func:`greedy`, its order and tie
  breaking) per device, buffer 1 on the CPU, buffer 2 on the engine's GPU;
- the delegate: ``TensorRTBackend``, the partitioner's compile specs, the
  TR01/TR02 blob (header, then the engine file) in segment 1 after the empty
  constant segment; the layout of ``serialize_pte_binary``
  (:mod:`pyrt.export._write.flatbuffer` writes the flatbuffer byte for byte).

Anything else (fallback ops, several engines, state, constants outside the
engine, reordered or repeated inputs and outputs, unbounded dims) returns
None from :func:`describe` and takes the full lowering. The tests export the
same models both ways and compare the files byte for byte.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import sympy
import torch
from executorch.extension.pytree import tree_flatten  # the emitter's own; imports no executorch.exir
from torch.export.graph_signature import InputKind, OutputKind
from torch.utils._pytree import TreeSpec
from torch.utils._sympy.value_ranges import bound_sympy

from pyrt.errors import ExportError, PyrtError
from pyrt.export._graph.engine_op import is_engine_call, parse_spec
from pyrt.export._graph.spec import EngineSpec
from pyrt.export._write.flatbuffer import Table, finish
from pyrt.export.options import delegate_compile_specs
from pyrt.format.dtypes import ScalarType, scalar_type_from_name
from pyrt.format.trt_blob import BACKEND_ID, encode_header, encode_metadata

ALIGNMENT = 16  # ExecuTorch's tensor alignment (memory planning, force_align in the schema)
SEGMENT_ALIGNMENT = 128  # ExecutorchBackendConfig.segment_alignment
EXTENDED_HEADER = 32  # "eh00", u32 length, u64 program size, u64 segment base, u64 segment data size
CPU, CUDA = 0, 1
H2D, D2H = ("et_copy::_h2d_copy", "out"), ("et_copy::_d2h_copy", "out")
_CHUNK = 8 << 20


@dataclass(frozen=True)
class TensorInfo:
    dtype: ScalarType
    sizes: tuple[int, ...]  # upper bounds
    dynamic: bool

    @property
    def allocated(self) -> int:
        """Planned bytes: the upper-bound size rounded up to :data:`ALIGNMENT`."""
        n = self.dtype.itemsize
        for s in self.sizes:
            n *= s
        return -(-n // ALIGNMENT) * ALIGNMENT


@dataclass(frozen=True)
class Delegated:
    """A program that is one engine call between its inputs and outputs."""

    spec: EngineSpec
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    in_spec: TreeSpec  # the call's pytree specs
    out_spec: TreeSpec
    engine_size: int


class _NotPlain(Exception):
    """The program is not plainly fully delegated: the full lowering handles it."""


def describe(program: torch.export.ExportedProgram) -> Delegated | None:
    """The program as one engine call, or None when it is anything more."""
    try:
        return _describe(program)
    except _NotPlain:
        return None


def _describe(program: torch.export.ExportedProgram) -> Delegated:
    nodes = list(program.graph.nodes)
    engines = [n for n in nodes if n.op == "call_function" and is_engine_call(n.target)]
    _require(len(engines) == 1)
    node = engines[0]
    sig = program.graph_signature
    _require(all(s.kind == OutputKind.USER_OUTPUT for s in sig.output_specs))
    user = [getattr(s.arg, "name", None) for s in sig.input_specs if s.kind == InputKind.USER_INPUT]
    placeholders = {n.name: n for n in nodes if n.op == "placeholder"}
    engine_arg = node.args[1]
    _require(isinstance(engine_arg, torch.fx.Node) and list(engine_arg.users) == [node])
    for s in sig.input_specs:  # besides user inputs, the engine's own bytes and nothing else
        _require(s.kind == InputKind.USER_INPUT or getattr(s.arg, "name", None) == engine_arg.name)
    _require(all(name in placeholders for name in user))
    inputs = [placeholders[str(name)] for name in user]
    _require(list(node.args[0]) == inputs and all(list(p.users) == [node] for p in inputs))
    spec = parse_spec(node.args[2])
    outs = list(next(n for n in nodes if n.op == "output").args[0])
    _require(len(outs) == len(spec.outputs) == len(node.users) and len(inputs) == len(spec.inputs) > 0)
    for i, o in enumerate(outs):
        _require(o.op == "call_function" and o.target is operator.getitem and o.args == (node, i)
                 and len(o.users) == 1)
    _require(len(nodes) == len(placeholders) + 1 + len(outs) + 1)
    call = program.call_spec
    _require(call.in_spec is not None and call.in_spec.num_leaves == len(inputs))
    _require(call.out_spec is not None and call.out_spec.num_leaves == len(outs))
    fqn = sig.inputs_to_buffers.get(engine_arg.name) or sig.inputs_to_lifted_tensor_constants.get(engine_arg.name)
    engine = program.state_dict[fqn] if fqn in program.state_dict else program.constants.get(fqn)
    _require(isinstance(engine, torch.Tensor) and engine.dtype == torch.uint8 and engine.dim() == 1)
    return Delegated(spec, tuple(_tensor(p.meta.get("val")) for p in inputs),
                     tuple(_tensor(o.meta.get("val")) for o in outs), call.in_spec, call.out_spec, engine.numel())


def _require(condition: bool) -> None:
    if not condition:
        raise _NotPlain


def _tensor(value: Any) -> TensorInfo:
    _require(isinstance(value, torch.Tensor) and value.layout == torch.strided)
    try:
        _require(bool(value.is_contiguous()))  # ExecuTorch keeps another dim order: left to it
    except RuntimeError:  # a data-dependent (unbacked) size
        raise _NotPlain from None
    try:
        dtype = scalar_type_from_name(str(value.dtype))
    except PyrtError:
        raise _NotPlain from None
    sizes = tuple(_upper_bound(s) for s in value.shape)
    return TensorInfo(dtype, sizes, not all(isinstance(s, int) for s in value.shape))


def _upper_bound(size: Any) -> int:
    """ExecuTorch's ``eval_upper_bound``; an unbounded dimension is left to the full lowering."""
    if isinstance(size, int):
        return size
    _require(isinstance(size, torch.SymInt))
    node = size.node
    bound = bound_sympy(node.expr, node.shape_env.var_to_range).upper
    _require(isinstance(bound, sympy.Integer))
    return int(bound)


# -- memory planning ---------------------------------------------------------------------------


def greedy(sizes: list[int], groups: list[int]) -> tuple[list[int], int]:
    """ExecuTorch's ``greedy`` memory planner for tensors of ``sizes`` (bytes, in ExecuTorch's collection order).

    Tensors overlap in lifetime exactly when their ``groups`` are equal. Returns each tensor's
    offset and the buffer size. Largest first (ties: the later tensor first); a tensor goes to
    the first shared object holding no overlapping tensor (at offset 0), else the first with room
    after its overlapping tensors, else a new object; objects are then laid out in creation order.
    """
    order = sorted(range(len(sizes)), key=lambda i: sizes[i])
    order.reverse()
    objects: list[tuple[int, list[tuple[int, int]]]] = []  # (size, [(offset in object, tensor)])
    for i in order:
        target = next((o for o in objects if all(groups[j] != groups[i] for _, j in o[1])), None)
        offset = 0
        if target is None:
            for o in objects:
                end = max((off + sizes[j] for off, j in o[1] if groups[j] == groups[i]), default=0)
                if end > 0 and end + sizes[i] <= o[0]:
                    target, offset = o, end
                    break
        if target is None:
            target = (sizes[i], [])
            objects.append(target)
        target[1].append((offset, i))
    offsets = [0] * len(sizes)
    base = 0
    for size, allocations in objects:
        for off, i in allocations:
            offsets[i] = base + off
        base += size
    return offsets, base


# -- the program -------------------------------------------------------------------------------


def program_table(d: Delegated, segments: list[tuple[int, int]], extra: tuple[tuple[str, bytes], ...]) -> Table:
    """The ``Program`` table ExecuTorch emits for ``d`` (delegate blob in segment 1)."""
    n, m = len(d.inputs), len(d.outputs)
    device = int(d.spec.device.partition(":")[2])
    cpu_offsets, cpu_size = greedy([t.allocated for t in d.inputs + d.outputs], [0] * n + [1] * m)
    gpu_offsets, gpu_size = greedy([t.allocated for t in d.inputs + d.outputs], [0] * (n + m))
    values = ([_tensor_value(t, 1, cpu_offsets[i], None) for i, t in enumerate(d.inputs)]
              + [_tensor_value(t, 2, gpu_offsets[i], device) for i, t in enumerate(d.inputs)]
              + [_tensor_value(t, 2, gpu_offsets[n + j], device) for j, t in enumerate(d.outputs)]
              + [_tensor_value(t, 1, cpu_offsets[n + j], None) for j, t in enumerate(d.outputs)])
    calls = ([_instruction(1, 0, [i, n + i, n + i]) for i in range(n)]
             + [_instruction(2, 0, list(range(n, 2 * n + m)))]
             + [_instruction(1, 1, [2 * n + j, 2 * n + m + j, 2 * n + m + j]) for j in range(m)])

    def container(spec: TreeSpec) -> str:
        return str(tree_flatten(torch.utils._pytree.tree_unflatten([0] * spec.num_leaves, spec))[1].to_str())

    specs = delegate_compile_specs(d.spec.device, d.spec.budget, extra, d.spec.quantization, d.spec.layers,
                                   d.spec.weight_bytes)
    delegate = Table(3, [(0, "str", BACKEND_ID), (1, "table", Table(2, [(0, "i8", 1), (1, "u32", 1)])),
                         (2, "tables", [Table(2, [(0, "str", k), (1, "[u8]", v)]) for k, v in specs])])
    plan = Table(10, [
        (0, "str", "forward"),
        (1, "table", Table(2, [(0, "str", container(d.in_spec)), (1, "str", container(d.out_spec))])),
        (2, "tables", values), (3, "[i32]", list(range(n))), (4, "[i32]", list(range(2 * n + m, 2 * n + 2 * m))),
        (5, "tables", [Table(4, [(0, "[i32]", []), (1, "[i32]", []), (2, "tables", calls)])]),
        (6, "tables", [Table(2, [(0, "str", name), (1, "str", overload)]) for name, overload in (H2D, D2H)]),
        (7, "tables", [delegate]), (8, "[i64]", [0, cpu_size, gpu_size]),
        (9, "tables", [Table(3, [(0, "i32", 2), (1, "i8", CUDA), (2, "i8", device)])]),
    ])
    return Table(8, [
        (0, "u32", 0), (1, "tables", [plan]), (2, "tables", []), (3, "tables", []),
        (4, "tables", [Table(2, [(0, "u64", off), (1, "u64", size)]) for off, size in segments]),
        (5, "table", Table(2, [(0, "u32", 0), (1, "[u64]", [0])])),
    ])


def _tensor_value(t: TensorInfo, memory_id: int, offset: int, device: int | None) -> Table:
    extra = None if device is None else Table(5, [(2, "i8", 0), (3, "i8", CUDA), (4, "i8", device)])
    tensor = Table(10, [
        (0, "i8", int(t.dtype)), (1, "i32", 0), (2, "[i32]", list(t.sizes)), (3, "[u8]", list(range(len(t.sizes)))),
        (4, "bool", False), (5, "u32", 0),
        (6, "table", Table(3, [(0, "u32", memory_id), (1, "u32", offset & 0xFFFFFFFF), (2, "u32", offset >> 32)])),
        (7, "i8", 0), (8, "i8", 1 if t.dynamic else 0), (9, "table", extra),
    ])
    return Table(2, [(0, "u8", 5), (1, "table", tensor)])  # KernelTypes.Tensor


def _instruction(kind: int, index: int, args: list[int]) -> Table:
    """KernelCall (kind 1: op ``index``) or DelegateCall (kind 2: delegate ``index``)."""
    return Table(2, [(0, "u8", kind), (1, "table", Table(2, [(0, "i32", index), (1, "[i32]", args)]))])


# -- the file ----------------------------------------------------------------------------------


def blob_header(d: Delegated) -> bytes:
    """The TR01/TR02 header that precedes the engine in the delegate blob (bindings in argument order)."""
    bindings = list(d.spec.inputs) + list(d.spec.outputs)
    return encode_header(encode_metadata(bindings, **d.spec.blob_metadata()), d.engine_size,
                         aliased=bool(d.spec.aliased_io))


def pte_head(d: Delegated, extra: tuple[tuple[str, bytes], ...], blob_size: int) -> bytes:
    """Everything before the delegate blob: flatbuffer with the extended header, padded to the segments."""
    segments = [(0, 0), (0, blob_size)]  # the empty constant segment, then the blob (both at offset 0)
    data = finish(program_table(d, segments, extra), b"ET12")
    program_size = EXTENDED_HEADER + len(data)
    base = _aligned(program_size, SEGMENT_ALIGNMENT)
    header = (b"eh00" + EXTENDED_HEADER.to_bytes(4, "little") + program_size.to_bytes(8, "little")
              + base.to_bytes(8, "little") + blob_size.to_bytes(8, "little"))
    root = int.from_bytes(data[:4], "little") + EXTENDED_HEADER
    head = root.to_bytes(4, "little") + data[4:8] + header + data[8:]
    return head + b"\x00" * (base - len(head))


def _aligned(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def writer(d: Delegated, extra: tuple[tuple[str, bytes], ...], engine_path: Path
           ) -> tuple[int, Callable[[BinaryIO, Callable[[int], Any]], None]]:
    """The file's size and a function writing it (``write(f, progress)``), the engine streamed from its file."""
    header = blob_header(d)
    head = pte_head(d, extra, len(header) + d.engine_size)

    def write(f: BinaryIO, progress: Callable[[int], Any]) -> None:
        f.write(head)
        f.write(header)
        progress(len(head) + len(header))
        written = 0
        with open(engine_path, "rb") as engine:
            while chunk := engine.read(_CHUNK):
                f.write(chunk)
                written += len(chunk)
                progress(len(chunk))
        if written != d.engine_size:
            raise ExportError(f"engine file {engine_path} changed size while writing "
                              f"({written} bytes, expected {d.engine_size})")

    return len(head) + len(header) + d.engine_size, write
