"""Real ``.pte`` files written by ExecuTorch 1.5.1, for tests and benchmarks.

Everything here calls ExecuTorch's own exporter and serializer; pyrt is used
only to build TR01 blobs (``pyrt.format.trt_blob.encode_blob``). torch and executorch
are imported lazily, so importing this module is cheap.

Fixtures (``build(name, directory) -> Path``; see :data:`BUILDERS`):

- ``portable``: two methods (``forward``: constants, an initialised mutable
  buffer, a second mutable buffer, tensor lists, optional tensor lists, strings,
  doubles, int lists; ``dyn``: dynamic batch dimension). No delegates.
- ``portable_external``: ``forward`` of ``portable`` with
  ``external_constants=True``: constants are EXTERNAL (named data in the .ptd
  ExecuTorch writes, kept beside the .pte as ``portable_external.ptd``).
- ``delegated_segments`` / ``delegated_inline``: ``TensorRTBackend`` delegates
  (this module's test-only backend) in segments / inline, with
  ``target_device`` (so ExecuTorch inserts ``et_copy`` ops and CUDA arenas),
  a baked ``weight_streaming_budget``, a TR02 blob (aliased I/O), named data
  stored by the backend, a portable op with a constant, and a second method
  whose blob is identical to one in ``forward`` (ExecuTorch deduplicates it).
- ``synthetic``: a Program dataclass built by hand and serialized by
  ExecuTorch: every EValue kind (BoolList and DoubleList included), every
  instruction kind, legacy constants, a CUDA arena on device index 1.
- ``no_segments``: a tiny program with no segment data (no extended header).

>>> from tests import ptefixtures                                # doctest: +SKIP
>>> path = ptefixtures.build("portable", tmp_path)              # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from pyrt.format.trt_blob import AliasedIO, IOBinding, encode_blob, encode_header, encode_metadata, parse_blob

BACKEND_ID = "TensorRTBackend"
WEIGHT_STREAMING_BUDGET = b"1048576"
ENGINE_HEAD = b"<<ENGINE-HEAD:"
ENGINE_TAIL = b":ENGINE-TAIL>>"


# -- engine bytes ----------------------------------------------------------------------------------


def engine_bytes(tag: str, size: int = 96) -> bytes:
    """Recognisable engine bytes: head + tag, a tag-specific fill byte, tail."""
    head = ENGINE_HEAD + tag.encode() + b"|"
    fill = bytes([0xA0 + (sum(tag.encode()) % 0x50)])
    body = max(size - len(head) - len(ENGINE_TAIL), 0)
    return head + fill * body + ENGINE_TAIL


def expected_engine(tag: str) -> bytes:
    """The engine bytes the test backend writes for partition ``tag``."""
    return engine_bytes(tag)


# -- the test-only TensorRT backend + partitioner -------------------------------------------------


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _binding(node: Any, is_input: bool) -> IOBinding:
    val = node.meta["val"]
    shape = tuple(int(d) if isinstance(d, int) else -1 for d in val.shape)
    return IOBinding(node.name, _dtype_name(val.dtype), shape, is_input)


@functools.cache
def _backend_classes() -> tuple[type, type]:
    """(backend, partitioner) classes; defined lazily so importing this module needs no torch."""
    import torch
    from executorch.exir._serialize._named_data_store import NamedDataStore
    from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
    from executorch.exir.backend.canonical_partitioners.pattern_op_partitioner import generate_pattern_op_partitions
    from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
    from executorch.exir.dialects._ops import ops as exir_ops
    from torch.fx.passes.operator_support import OperatorSupportBase

    class PyrtTestTensorRTBackend(BackendDetails):
        """Writes a real TR01/TR02 blob whose engine is :func:`engine_bytes` of the partition tag.

        Named "TensorRTBackend" only inside :func:`_only_our_backend`, so it never shadows pyrt's real one.
        """

        @staticmethod
        def preprocess(edge_program: Any, compile_specs: list) -> Any:
            specs = {s.key: s.value for s in compile_specs}
            tag = specs["engine_tag"].decode()
            graph = edge_program.graph_module.graph
            user_inputs = set(edge_program.graph_signature.user_inputs)
            inputs = [_binding(n, True) for n in graph.nodes if n.op == "placeholder" and n.name in user_inputs]
            out_node = next(n for n in graph.nodes if n.op == "output")
            outs = out_node.args[0]
            outputs = [_binding(n, False) for n in ([outs] if isinstance(outs, torch.fx.Node) else outs)]
            aliased = ()
            if "alias" in specs:
                aliased = (AliasedIO(outputs[0].name, inputs[0].name, "user"),)
            blob = encode_blob(expected_engine(tag), inputs + outputs, aliased_io=aliased, device_id=0,
                               serialized_metadata=f"test-{tag}", target_platform="linux_x86_64")
            store = None
            if "named" in specs:
                nds = NamedDataStore()
                nds.add_named_data(f"weights_{tag}", b"W" * 40 + tag.encode(), alignment=16)
                store = nds.get_named_data_store_output()
            return PreprocessResult(processed_bytes=blob, data_store_output=store)

    class _Support(OperatorSupportBase):
        def is_node_supported(self, submodules: Any, node: Any) -> bool:
            return node.op == "call_function" and node.target in (
                exir_ops.edge.aten.add.Tensor, exir_ops.edge.aten.mul.Tensor)

    class TestTensorRTPartitioner(Partitioner):
        """Delegates add/mul islands; partition i gets ``specs_for(i)`` as compile specs."""

        def __init__(self, specs_for: Callable[[int], list]) -> None:
            super().__init__()
            self.specs_for = specs_for

        def partition(self, exported_program: Any) -> Any:
            tags = {}
            parts = generate_pattern_op_partitions(exported_program.graph_module, op_support=_Support())
            for i, part in enumerate(sorted(parts, key=lambda p: min(n.name for n in p.nodes))):
                tag = f"tag{i}"
                for node in part.nodes:
                    node.meta["delegation_tag"] = tag
                tags[tag] = DelegationSpec(BACKEND_ID, self.specs_for(i))
            return PartitionResult(tagged_exported_program=exported_program, partition_tags=tags)

    return PyrtTestTensorRTBackend, TestTensorRTPartitioner


@contextlib.contextmanager
def _only_our_backend() -> Iterator[None]:
    """Make ExecuTorch's backend lookup for "TensorRTBackend" find this module's test backend.

    ExecuTorch finds a backend by scanning ``BackendDetails.__subclasses__()`` for a class
    whose ``__name__`` is the backend id. pyrt's real exporter also defines a
    ``TensorRTBackend``; meanwhile it is hidden and the test backend carries the name.
    """
    from executorch.exir.backend.backend_details import BackendDetails

    ours = _backend_classes()[0]
    others = [c for c in type.__subclasses__(BackendDetails) if c.__name__ != BACKEND_ID and c is not ours]
    BackendDetails.__subclasses__ = staticmethod(lambda: [ours, *others])  # type: ignore[method-assign]
    ours.__name__ = BACKEND_ID
    try:
        yield
    finally:
        ours.__name__ = "PyrtTestTensorRTBackend"
        del BackendDetails.__subclasses__


# -- models ----------------------------------------------------------------------------------------


def _portable_programs() -> dict[str, Any]:
    import torch
    from torch import nn
    from torch.export import Dim, export

    class Main(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 3)
            self.register_buffer("state", torch.arange(3, dtype=torch.float32) + 0.5)
            self.register_buffer("counter", torch.zeros(1, dtype=torch.int64))

        def forward(self, x: Any, idx: Any) -> Any:
            y = torch.clamp(self.lin(x), min=-1.5, max=2.25)
            y = torch.nn.functional.gelu(y, approximate="tanh")
            z = torch.cat([y, y + 1], dim=0)
            s = z.sum(dim=[0], keepdim=True)
            self.state.add_(s.reshape(3))
            self.counter.add_(1)
            g = z[idx]
            u = torch.nn.functional.interpolate(g.reshape(1, 1, -1, 3), scale_factor=2.0, mode="nearest")
            return g + self.state, s, u

    class Dyn(nn.Module):
        def forward(self, x: Any) -> Any:
            return x * 2 + 1

    torch.manual_seed(0)
    with torch.no_grad():
        main = export(Main().eval(), (torch.randn(2, 4), torch.tensor([0, 3])))
    dyn = export(Dyn(), (torch.randn(4, 3),), dynamic_shapes={"x": {0: Dim("batch", min=1, max=16)}})
    return {"forward": main, "dyn": dyn}


def _delegated_programs() -> dict[str, Any]:
    import torch
    from torch import nn
    from torch.export import export

    class Two(nn.Module):
        """add | sin | add*mul | cos*w: two TensorRT islands around portable ops."""

        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.linspace(-1.0, 1.0, 12).reshape(3, 4))

        def forward(self, x: Any, y: Any) -> Any:
            a = x + y
            b = torch.sin(a)
            c = (b + y) * y
            return torch.cos(c) - self.w

    class One(nn.Module):
        def forward(self, x: Any, y: Any) -> Any:
            return torch.sin(x + y)

    torch.manual_seed(0)
    with torch.no_grad():
        two = export(Two().eval(), (torch.randn(3, 4), torch.randn(3, 4)))
    one = export(One(), (torch.randn(3, 4), torch.randn(3, 4)))
    return {"forward": two, "other": one}


def _delegate_specs(i: int) -> list:
    from executorch.exir.backend.compile_spec_schema import CompileSpec

    specs = [CompileSpec("engine_tag", f"p{i}".encode()), CompileSpec("target_device", b"cuda:0")]
    if i == 0:
        specs += [CompileSpec("weight_streaming_budget", WEIGHT_STREAMING_BUDGET), CompileSpec("named", b"1")]
    else:
        specs += [CompileSpec("alias", b"1"), CompileSpec("raw", b"\x00\xff\x10")]
    return specs


# -- builders --------------------------------------------------------------------------------------


def _write(path: Path, data: Any) -> Path:
    tmp = path.with_suffix(".pte.tmp")
    with open(tmp, "wb") as fh:
        if hasattr(data, "write_to_file"):
            data.write_to_file(fh)
        else:
            fh.write(bytes(data))
    os.replace(tmp, path)
    return path


@functools.cache
def _portable_edge() -> Any:
    from executorch.exir import to_edge

    return to_edge(_portable_programs())


def _build_portable(path: Path) -> Path:
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass

    config = ExecutorchBackendConfig(passes=[InitializedMutableBufferPass(["state"])], emit_mutable_buffer_names=True)
    return _write(path, copy.deepcopy(_portable_edge()).to_executorch(config).buffer)


def _build_portable_external(path: Path) -> Path:
    """The .pte, and beside it the .ptd ExecuTorch writes (``write_tensor_data_to_file``) as ``<name>.ptd``."""
    from executorch.exir import ExecutorchBackendConfig, to_edge

    et = to_edge({"forward": _portable_programs()["forward"]}).to_executorch(
        ExecutorchBackendConfig(external_constants=True, emit_mutable_buffer_names=True))
    write_ptd(et, path.with_suffix(".ptd"))
    return _write(path, et.buffer)


def write_ptd(manager: Any, target: Path) -> Path:
    """Write the single .ptd of an ExecutorchProgramManager to ``target`` with ExecuTorch's own writer."""
    import tempfile

    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        manager.write_tensor_data_to_file(tmp)
        (written,) = Path(tmp).glob("*.ptd")
        os.replace(written, target)
    return target


@functools.cache
def _delegated_edge() -> Any:
    from executorch.exir import to_edge

    _, partitioner = _backend_classes()
    with _only_our_backend():
        return to_edge(_delegated_programs()).to_backend(partitioner(_delegate_specs))


def _build_delegated(path: Path, *, segments: bool) -> Path:
    from executorch.exir import ExecutorchBackendConfig

    edge = copy.deepcopy(_delegated_edge())
    et = edge.to_executorch(ExecutorchBackendConfig(extract_delegate_segments=segments))
    return _write(path, et.buffer)


def serialize_program(program: Any, **extra: Any) -> Any:
    from executorch.exir._serialize._program import PTEFile, serialize_pte_binary

    return serialize_pte_binary(PTEFile(program=program, **extra), extract_delegate_segments=True)


def synthetic_program() -> Any:
    """Every EValue and instruction kind, built by hand and serialized by ExecuTorch."""
    from executorch.exir import schema as s
    from executorch.exir.scalar_type import ScalarType as ST

    def tensor(st: Any, sizes: list, idx: int = 0, alloc: Any = None, **kw: Any) -> Any:
        return s.EValue(s.Tensor(scalar_type=st, storage_offset=0, sizes=sizes, dim_order=list(range(len(sizes))),
                                  requires_grad=False, layout=0, data_buffer_idx=idx, allocation_info=alloc,
                                  shape_dynamism=kw.pop("dyn", s.TensorShapeDynamism.STATIC), **kw))

    big = s.AllocationDetails(memory_id=2, memory_offset_low=16, memory_offset_high=1)
    values = [
        s.EValue(s.Null()),
        s.EValue(s.Int(-(2**40))),
        s.EValue(s.Bool(True)),
        s.EValue(s.Double(-0.375)),
        s.EValue(s.String("héllo")),
        s.EValue(s.IntList([1, 2])),
        s.EValue(s.DoubleList([1.5, -2.0, 1e300])),
        s.EValue(s.BoolList([True, False, True])),
        tensor(ST.FLOAT, [2, 3], idx=1),                                   # 8: constant
        tensor(ST.HALF, [4], alloc=s.AllocationDetails(1, 0, 0)),         # 9: planned, CPU arena
        tensor(ST.LONG, [3, 1], alloc=big, dyn=s.TensorShapeDynamism.DYNAMIC_BOUND,
               extra_tensor_info=s.ExtraTensorInfo(device_type=s.DeviceType.CUDA, device_index=1)),  # 10
        s.EValue(s.TensorList([8, 9])),
        s.EValue(s.OptionalTensorList([8, -1, 9])),
        tensor(ST.BOOL, [], idx=2),                                         # 13: scalar constant
        s.EValue(s.Double(float("inf"))),
        tensor(ST.BFLOAT16, [2, 2], dyn=s.TensorShapeDynamism.DYNAMIC_UNBOUND),  # 15: input
    ]
    instructions = [
        s.Instruction(s.KernelCall(op_index=0, args=[8, 9, 9])),
        s.Instruction(s.JumpFalseCall(cond_value_index=2, destination_instruction=4)),
        s.Instruction(s.MoveCall(move_from=9, move_to=10)),
        s.Instruction(s.FreeCall(value_index=10)),
        s.Instruction(s.DelegateCall(delegate_index=0, args=[15, 9])),
        s.Instruction(s.KernelCall(op_index=1, args=[])),
    ]
    delegate = s.BackendDelegate(
        id=BACKEND_ID,
        processed=s.BackendDelegateDataReference(location=s.DataLocation.INLINE, index=0),
        compile_specs=[s.CompileSpec("target_device", b"cuda:1"), s.CompileSpec("bin", b"\x00\x01")])
    plan = s.ExecutionPlan(
        name="synthetic", container_meta_type=s.ContainerMetadata("in-spec", "out-spec"), values=values,
        inputs=[15], outputs=[9, 10], chains=[s.Chain(inputs=[15], outputs=[9], instructions=instructions,
                                                      stacktrace=None)],
        operators=[s.Operator("aten::add", "out"), s.Operator("pyrt_test::noop", "")], delegates=[delegate],
        non_const_buffer_sizes=[0, 64, (1 << 32) + 64],
        non_const_buffer_device=[s.NonConstBufferDevice(buffer_idx=2, device_type=s.DeviceType.CUDA, device_index=1)])
    blob = encode_blob(engine_bytes("syn"), [IOBinding("in", "bfloat16", (-1, 2), True),
                                             IOBinding("out", "float16", (4,), False)], target_platform="unknown")
    second = replace(plan, name="empty", values=[], inputs=[], outputs=[], chains=[], operators=[], delegates=[],
                     non_const_buffer_sizes=[0], non_const_buffer_device=None,
                     container_meta_type=s.ContainerMetadata("", ""))
    consts = [s.Buffer(storage=b""), s.Buffer(storage=bytes(range(24))), s.Buffer(storage=b"\x01")]
    return s.Program(version=0, execution_plan=[plan, second], constant_buffer=consts,
                     backend_delegate_data=[s.BackendDelegateInlineData(data=blob)], segments=[],
                     constant_segment=s.SubsegmentOffsets(segment_index=0, offsets=[]))


def _build_synthetic(path: Path) -> Path:
    return _write(path, serialize_program(synthetic_program()))


def _build_no_segments(path: Path) -> Path:
    from executorch.exir import schema as s
    from executorch.exir._serialize._program import PTEFile, serialize_pte_binary

    plan = s.ExecutionPlan(name="tiny", container_meta_type=s.ContainerMetadata("", ""),
                           values=[s.EValue(s.Int(7))], inputs=[], outputs=[0], chains=[], operators=[],
                           delegates=[], non_const_buffer_sizes=[0])
    program = s.Program(version=0, execution_plan=[plan], constant_buffer=[], backend_delegate_data=[],
                        segments=[], constant_segment=s.SubsegmentOffsets(segment_index=0, offsets=[]))
    return _write(path, serialize_pte_binary(PTEFile(program=program)))


BUILDERS: dict[str, Callable[[Path], Path]] = {
    "portable": _build_portable,
    "portable_external": _build_portable_external,
    "delegated_segments": functools.partial(_build_delegated, segments=True),
    "delegated_inline": functools.partial(_build_delegated, segments=False),
    "synthetic": _build_synthetic,
    "no_segments": _build_no_segments,
}
ALL = tuple(BUILDERS)
DELEGATED = ("delegated_segments", "delegated_inline", "synthetic")


def build(name: str, directory: Path) -> Path:
    """Write fixture ``name`` into ``directory`` (once; later calls reuse the file)."""
    path = Path(directory) / f"{name}.pte"
    if not path.exists():
        BUILDERS[name](path)
    return path


# -- rewriting segment layouts (sparse > 4 GiB files, benchmark files) -----------------------------


def raw_program(data: bytes) -> tuple[Any, Any]:
    """(extended header, Program dataclass with segments as stored) via ExecuTorch's deserializer."""
    from executorch.exir._serialize._flatbuffer_program import _flatbuffer_to_program
    from executorch.exir._serialize._program import _get_extended_header

    eh = _get_extended_header(data)
    size = eh.program_size if eh is not None and eh.is_valid() else len(data)
    return eh, _flatbuffer_to_program(bytes(data[:size]))


@functools.cache
def et_raw(path: Path) -> tuple[Any, Any]:
    """(extended header, Program as stored) of the file at ``path``, by ExecuTorch (cached)."""
    return raw_program(Path(path).read_bytes())


@functools.cache
def et_restored(path: Path) -> Any:
    """ExecuTorch's ``deserialize_pte_binary``: a PTEFile with segments restored into bytes (cached)."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    return deserialize_pte_binary(Path(path).read_bytes())


SegmentWriter = Callable[[Any], None]  # writes a segment's bytes at the file's current position


def write_relocated(path: Path, program: Any, placements: Sequence[tuple[int, int, SegmentWriter]],
                    *, segment_alignment: int = 128) -> Path:
    """Write ``program`` with segment i at (relative offset, size) given by ``placements[i]``.

    The flatbuffer and extended header come from ExecuTorch's serializer; each
    segment's bytes come from its writer, called after a seek (holes stay sparse).
    """
    from executorch.exir._serialize._flatbuffer_program import _program_to_flatbuffer
    from executorch.exir._serialize._program import _ExtendedHeader, _insert_flatbuffer_header
    from executorch.exir._serialize.padding import aligned_size, pad_to
    from executorch.exir.schema import DataSegment

    program.segments = [DataSegment(offset=off, size=size) for off, size, _ in placements]
    result = _program_to_flatbuffer(program)
    header_len = aligned_size(_ExtendedHeader.EXPECTED_LENGTH, result.max_alignment)
    program_size = header_len + len(result.data)
    base = aligned_size(program_size, segment_alignment)
    data_size = max((off + size for off, size, _ in placements), default=0)
    header = pad_to(_ExtendedHeader(program_size=program_size, segment_base_offset=base,
                                    segment_data_size=data_size).to_bytes(), header_len)
    flat = _insert_flatbuffer_header(result.data, r"ET[0-9a-zA-Z]{2}", header)
    tmp = path.with_suffix(".pte.tmp")
    with open(tmp, "wb") as fh:
        fh.write(flat)
        for off, _, writer in placements:
            fh.seek(base + off)
            writer(fh)
        fh.truncate(base + data_size)
    os.replace(tmp, path)
    return path


def bytes_writer(data: bytes) -> SegmentWriter:
    return lambda fh: fh.write(data)


def big_blob_writer(source_blob: bytes, engine_size: int, tag: str, chunk: int = 1 << 24) -> tuple[int, SegmentWriter]:
    """(blob size, writer) for a TR01/TR02 blob like ``source_blob`` but with an engine of ``engine_size`` bytes.

    The engine is ``engine_bytes(tag)``-style: recognisable head, fill, tail; written in chunks.
    """
    parsed = parse_blob(source_blob)
    meta = encode_metadata(parsed.io_bindings, aliased_io=parsed.aliased_io, device_id=parsed.device_id,
                           hardware_compatible=parsed.hardware_compatible,
                           serialized_metadata=parsed.serialized_metadata, target_platform=parsed.target_platform)
    head = encode_header(meta, engine_size, aliased=bool(parsed.aliased_io))
    small = engine_bytes(tag, 64)
    lead, fill, tail = small[:small.index(b"|") + 1], small[-len(ENGINE_TAIL) - 1:-len(ENGINE_TAIL)], ENGINE_TAIL

    def write(fh: Any) -> None:
        fh.write(head + lead)
        left = engine_size - len(lead) - len(tail)
        block = fill * chunk
        while left > 0:
            n = min(left, chunk)
            fh.write(block[:n])
            left -= n
        fh.write(tail)

    return len(head) + engine_size, write


# -- reading everything ------------------------------------------------------------------------------


def walk(pte: Any) -> int:
    """Touch everything pyrt can decode from an open PteFile; returns bytes of data touched.

    Every plan, value, chain, operator, delegate (blob parsed when it is a
    TensorRT one), segment, constant, mutable and named data entry, plus
    ``pyrt.inspect`` and its text report. Hostile input may raise only a PyrtError.
    """
    from pyrt.format.trt_blob import BACKEND_ID as TRT_ID
    from pyrt.tools.report import format_report, inspect

    touched = 0

    def touch(view: memoryview) -> None:
        nonlocal touched
        if view.nbytes:
            view[0], view[-1]  # noqa: B018
        touched += view.nbytes

    program = pte.program
    _ = (program.version, program.constant_segment, program.mutable_data_segments)  # decoded, values unused
    for i in range(len(program.segments)):
        touch(pte.segment_view(i))
    for nd in program.named_data:
        touch(program.named_data_view(nd.key))
    for plan in program.execution_plan:
        _ = (plan.name, plan.container_meta_type, plan.inputs, plan.outputs, plan.chains, plan.operators,
             plan.non_const_buffer_sizes)
        for d in plan.non_const_buffer_device:
            plan.buffer_device(d.buffer_idx)
        for v in plan.values:
            if v.kind != "Tensor":
                continue
            t = v.value
            _ = t.nbytes
            if t.is_constant:
                info = t.extra_tensor_info
                if info is None or info.location != 1 or any(n.key == info.fully_qualified_name
                                                             for n in program.named_data):
                    touch(program.constant_data(t))
            elif t.data_buffer_idx > 0 and t.allocation_info is not None:
                touch(program.mutable_data(t))
        for d in plan.delegates:
            blob = program.delegate_data(d)
            touch(blob)
            for spec in d.compile_specs:
                d.spec(spec.key)
                spec.text()
            if d.id == TRT_ID:
                touch(parse_blob(blob).engine)
    format_report(inspect(pte))
    return touched


def handmade_two_engines(path: Path, w: Any, *, out_on_device: bool = False, in_on_device: bool = False,
                         engine_devices: tuple[int, int] = (0, 1)) -> Path:
    """relu(x)**2 on a cuda:0 engine, then + w on a cuda:1 engine; arenas on the host or the devices.

    The middle value always lives in a cuda:0 arena; ``engine_devices`` moves the engines
    (``(1, 0)``: the first engine's output crosses to cuda:0 by a peer copy).
    """
    from executorch.exir import schema as s
    from executorch.exir.scalar_type import ScalarType as ST

    from pyrt.testing.refengine import Ref, RefEngine, RefNode, RefTensor

    def tensor(mem: int, off: int) -> Any:
        return s.EValue(s.Tensor(scalar_type=ST.FLOAT, storage_offset=0, sizes=[2, 3], dim_order=[0, 1],
                                 requires_grad=False, layout=0, data_buffer_idx=0,
                                 allocation_info=s.AllocationDetails(memory_id=mem, memory_offset_low=off,
                                                                     memory_offset_high=0),
                                 shape_dynamism=s.TensorShapeDynamism.STATIC))

    relu = RefEngine([RefTensor("x", "float32", (2, 3))], [RefTensor("y", "float32", (2, 3))],
                     nodes=[RefNode("aten::relu", [Ref("x")], {}, ["r"]),
                            RefNode("aten::mul.Tensor", [Ref("r"), Ref("r")], {}, ["y"])])
    add = RefEngine([RefTensor("a", "float32", (2, 3))], [RefTensor("b", "float32", (2, 3))], weights={"w": w},
                    nodes=[RefNode("aten::add.Tensor", [Ref("a"), Ref("w")], {}, ["b"])])
    blobs, delegates = [], []
    for i, (eng, names) in enumerate([(relu, ("x", "y")), (add, ("a", "b"))]):
        bindings = [IOBinding(names[0], "float32", (2, 3), True), IOBinding(names[1], "float32", (2, 3), False)]
        device = engine_devices[i]
        blobs.append(s.BackendDelegateInlineData(data=encode_blob(eng.to_bytes(), bindings, device_id=device)))
        ref = s.BackendDelegateDataReference(location=s.DataLocation.INLINE, index=i)
        delegates.append(s.BackendDelegate(id="TensorRTBackend", processed=ref, compile_specs=[
            s.CompileSpec("target_device", f"cuda:{device}".encode())]))
    plan = s.ExecutionPlan(
        name="forward", container_meta_type=s.ContainerMetadata("", ""),
        values=[tensor(2, 32) if in_on_device else tensor(1, 0), tensor(2, 0),
                tensor(3, 0) if out_on_device else tensor(1, 32)], inputs=[0], outputs=[2],
        chains=[s.Chain(inputs=[0], outputs=[2], stacktrace=None, instructions=[
            s.Instruction(s.DelegateCall(delegate_index=0, args=[0, 1])),   # host arena in -> cuda:0 arena out
            s.Instruction(s.DelegateCall(delegate_index=1, args=[1, 2])),   # cuda:0 arena -> engine on cuda:1 -> host
        ])],
        operators=[], delegates=delegates, non_const_buffer_sizes=[0, 64, 64, 32],
        non_const_buffer_device=[s.NonConstBufferDevice(buffer_idx=2, device_type=s.DeviceType.CUDA, device_index=0),
                                 s.NonConstBufferDevice(buffer_idx=3, device_type=s.DeviceType.CUDA, device_index=1)])
    program = s.Program(version=0, execution_plan=[plan], constant_buffer=[], backend_delegate_data=blobs,
                        segments=[], constant_segment=s.SubsegmentOffsets(segment_index=0, offsets=[]))
    import io

    buf = io.BytesIO()
    serialize_program(program).write_to_file(buf)
    path.write_bytes(buf.getvalue())
    return path
# -- hand-made programs ------------------------------------------------------------------------------


def hand_tensor(st: Any, sizes: Sequence[int], *, alloc: tuple[int, int] | None = None, dynamic: bool = False,
                data_buffer_idx: int = 0) -> Any:
    """An ExecuTorch ``EValue(Tensor)``: ``alloc=(memory_id, offset)`` plans it, else it is unplanned."""
    from executorch.exir import schema as s

    info = None if alloc is None else s.AllocationDetails(memory_id=alloc[0], memory_offset_low=alloc[1] & 0xFFFFFFFF,
                                                          memory_offset_high=alloc[1] >> 32)
    dyn = s.TensorShapeDynamism.DYNAMIC_BOUND if dynamic else s.TensorShapeDynamism.STATIC
    return s.EValue(s.Tensor(scalar_type=st, storage_offset=0, sizes=list(sizes), dim_order=list(range(len(sizes))),
                             requires_grad=False, layout=0, data_buffer_idx=data_buffer_idx, allocation_info=info,
                             shape_dynamism=dyn))


def hand_program(values: Sequence[Any], instructions: Sequence[Any], operators: Sequence[tuple[str, str]], *,
                 inputs: Sequence[int] = (), outputs: Sequence[int] = (), buffer_sizes: Sequence[int] = (0,),
                 container: tuple[str, str] = ("", ""), name: str = "forward") -> bytes:
    """The bytes of a one-method program built by hand (ExecuTorch's serializer lays it out).

    ``instructions`` are ExecuTorch ``schema`` instruction bodies (``KernelCall(...)``, ...);
    ``operators`` are ``(name, overload)`` pairs.
    """
    import io

    from executorch.exir import schema as s

    plan = s.ExecutionPlan(
        name=name, container_meta_type=s.ContainerMetadata(*container), values=list(values),
        inputs=list(inputs), outputs=list(outputs),
        chains=[s.Chain(inputs=list(inputs), outputs=list(outputs),
                        instructions=[s.Instruction(i) for i in instructions], stacktrace=None)],
        operators=[s.Operator(n, o) for n, o in operators], delegates=[], non_const_buffer_sizes=list(buffer_sizes))
    program = s.Program(version=0, execution_plan=[plan], constant_buffer=[], backend_delegate_data=[], segments=[],
                        constant_segment=s.SubsegmentOffsets(segment_index=0, offsets=[]))
    buf = io.BytesIO()
    serialize_program(program).write_to_file(buf)
    return buf.getvalue()


def relu_program(*, planned_input: bool = True, arena: int = 48, container: tuple[str, str] = ("", ""),
                 out_sizes: tuple[int, ...] = (2, 3), unplanned_out: bool = False) -> bytes:
    """``y = aten::relu.out(x)`` on a float (2, 3) input; y planned at arena 1 offset 24 unless ``unplanned_out``."""
    from executorch.exir import schema as s
    from executorch.exir.scalar_type import ScalarType

    f = ScalarType.FLOAT
    values = [hand_tensor(f, [2, 3], alloc=(1, 0) if planned_input else None),
              hand_tensor(f, out_sizes, alloc=None if unplanned_out else (1, 24))]
    return hand_program(values, [s.KernelCall(op_index=0, args=[0, 1, 1])], [("aten::relu", "out")],
                        inputs=[0], outputs=[1], buffer_sizes=[0, arena], container=container)
