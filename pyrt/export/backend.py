"""pyrt's ExecuTorch partitioner and backend for ``pyrt::execute_engine`` nodes.

:class:`TensorRTPartitioner` gives every engine node its own delegate whose
compile specs come from *that* node's engine: ``target_device`` (ASCII
``cuda:N``) and, when set, ``weight_streaming_budget`` (ASCII decimal).
:class:`TensorRTBackend` (backend id ``TensorRTBackend``) turns the partition
into a TR01/TR02 blob: metadata in delegate-argument order, then the engine.

Inside :func:`streaming_blobs` preprocess returns a small unique stub instead
of the blob and records where the real blob comes from (header bytes + engine
file); pyrt's writer substitutes the blobs while it streams the file, so no
engine is ever copied into memory. Outside it, preprocess returns the whole
blob, as ExecuTorch's own serializer needs.

>>> TensorRTBackend.__name__
'TensorRTBackend'
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import operator
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.compile_spec_schema import CompileSpec
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from executorch.exir.backend.utils import tag_constant_data
from torch.export import ExportedProgram

from pyrt.errors import ExportError
from pyrt.export._graph.engine_op import is_engine_call, parse_spec
from pyrt.export._graph.spec import EngineSpec
from pyrt.export.options import SPEC_BUDGET, SPEC_DEVICE, delegate_compile_specs, parse_budget_spec
from pyrt.format.trt_blob import BACKEND_ID, IOBinding, encode_header, encode_metadata

log = logging.getLogger("pyrt.export")
STUB_MAGIC = b"PYRT-STUB\x00"


@dataclass(frozen=True)
class BlobPlan:
    """A delegate blob to be assembled at write time: ``header`` then the engine file's bytes."""

    key: str
    header: bytes
    engine_path: Path
    engine_size: int
    engine_sha256: str

    @property
    def size(self) -> int:
        return len(self.header) + self.engine_size


@dataclass
class BlobSession:
    """Engine files preprocess may stub out, and the stubs it handed back."""

    engines: dict[str, tuple[Path, int, str]]  # key -> (path, size, sha256)
    stubs: dict[bytes, BlobPlan] = field(default_factory=dict)


_SESSION: contextvars.ContextVar[BlobSession | None] = contextvars.ContextVar("pyrt_blob_session", default=None)


@contextlib.contextmanager
def streaming_blobs(session: BlobSession) -> Iterator[BlobSession]:
    """While active, preprocess stubs the engines ``session`` knows instead of copying them."""
    token = _SESSION.set(session)
    try:
        yield session
    finally:
        _SESSION.reset(token)


class TensorRTPartitioner(Partitioner):
    """One delegate per ``pyrt::execute_engine`` node, compile specs from its own engine."""

    def __init__(self, extra_compile_specs: tuple[tuple[str, bytes], ...] = ()) -> None:
        super().__init__()
        self.extra = tuple(extra_compile_specs)

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        tags: dict[str, DelegationSpec] = {}
        for node in exported_program.graph.nodes:
            if node.op != "call_function" or not is_engine_call(node.target):
                continue
            spec = parse_spec(node.args[2])
            tag = f"tensorrt_{len(tags)}"
            node.meta["delegation_tag"] = tag
            for user in node.users:
                user.meta["delegation_tag"] = tag
            tags[tag] = DelegationSpec(BACKEND_ID, compile_specs_for(spec, self.extra))
        tag_constant_data(exported_program)
        return PartitionResult(tagged_exported_program=exported_program, partition_tags=tags)


def compile_specs_for(spec: EngineSpec, extra: tuple[tuple[str, bytes], ...] = ()) -> list[CompileSpec]:
    """``target_device`` from the engine's own device, then its budget, then extra raw specs."""
    return [CompileSpec(k, v) for k, v in delegate_compile_specs(spec.device, spec.budget, extra, spec.quantization,
                                                                   spec.layers, spec.weight_bytes)]


class TensorRTBackend(BackendDetails):
    """ExecuTorch backend ``TensorRTBackend``: writes the TR01/TR02 delegate blob."""

    @classmethod
    def copy_exported_program_for_preprocess(cls, edge_program: ExportedProgram,
                                             compile_specs: list[CompileSpec]) -> ExportedProgram:
        # preprocess only reads the program; a deep copy would duplicate (and page in) the engine
        return edge_program

    @staticmethod
    def preprocess(edge_program: ExportedProgram, compile_specs: list[CompileSpec]) -> PreprocessResult:
        node = _engine_node(edge_program)
        spec = parse_spec(node.args[2])  # type: ignore[arg-type]  # fx Argument union; the spec is a str
        _check_compile_specs(spec, compile_specs)
        engine = _engine_tensor(edge_program, node.args[1], spec.key)
        bindings = _delegate_bindings(edge_program, node, spec)
        header = encode_header(encode_metadata(bindings, **spec.blob_metadata()), engine.numel(),
                               aliased=bool(spec.aliased_io))
        session = _SESSION.get()
        if session is not None and spec.key in session.engines:
            path, size, sha = session.engines[spec.key]
            if size != engine.numel():
                raise ExportError(f"engine {spec.key!r}: file holds {size} bytes, the graph's tensor {engine.numel()}")
            stub = STUB_MAGIC + spec.key.encode() + b"\x00" + uuid.uuid4().bytes
            session.stubs[stub] = BlobPlan(spec.key, header, path, size, sha)
            return PreprocessResult(processed_bytes=stub)
        return PreprocessResult(processed_bytes=b"".join((header, engine.numpy().data)))  # one copy


def _engine_node(ep: ExportedProgram) -> torch.fx.Node:
    nodes = [n for n in ep.graph.nodes if n.op == "call_function" and is_engine_call(n.target)]
    if len(nodes) != 1:
        raise ExportError(f"a TensorRTBackend partition must hold exactly one engine node, found {len(nodes)}")
    return nodes[0]


def _check_compile_specs(spec: EngineSpec, compile_specs: list[CompileSpec]) -> None:
    seen: dict[str, bytes] = {}
    for cs in compile_specs:
        if cs.key in seen:
            raise ExportError(f"engine {spec.key!r}: compile spec {cs.key!r} is given twice")
        seen[cs.key] = bytes(cs.value)
    device = seen.get(SPEC_DEVICE)
    if device is not None and device.decode("ascii", "replace") != spec.device:
        raise ExportError(f"engine {spec.key!r} was built for {spec.device} but its target_device spec says {device!r}")
    if SPEC_BUDGET in seen:
        parse_budget_spec(seen[SPEC_BUDGET], f"engine {spec.key!r} compile spec {SPEC_BUDGET!r}")


def _engine_tensor(ep: ExportedProgram, arg: Any, key: str) -> torch.Tensor:
    sig = ep.graph_signature
    name = getattr(arg, "name", None)
    fqn = (sig.inputs_to_buffers.get(name) or sig.inputs_to_lifted_tensor_constants.get(name)
           or sig.inputs_to_parameters.get(name))
    value = ep.state_dict.get(fqn) if fqn in ep.state_dict else ep.constants.get(fqn)
    if not isinstance(value, torch.Tensor) or value.dtype != torch.uint8 or value.dim() != 1:
        raise ExportError(f"engine {key!r}: its engine argument {name!r} is not a 1-D uint8 constant of the partition")
    return value


def _delegate_bindings(ep: ExportedProgram, node: torch.fx.Node, spec: EngineSpec) -> list[IOBinding]:
    """Bindings in the delegate's argument order (inputs) and return order (outputs)."""
    args = list(node.args[0])  # type: ignore[arg-type]  # fx Argument union; the delegate's inputs are a list
    user_inputs = set(ep.graph_signature.user_inputs)
    placeholders = [p for p in ep.graph.nodes if p.op == "placeholder" and p.name in user_inputs]
    positions = []
    for p in placeholders:
        uses = [i for i, a in enumerate(args) if a is p]
        if len(uses) != 1:
            raise ExportError(f"engine {spec.key!r}: delegate input {p.name!r} feeds engine inputs {uses}; "
                              "each engine input needs its own delegate argument")
        positions.append(uses[0])
    if sorted(positions) != list(range(len(spec.inputs))):
        raise ExportError(f"engine {spec.key!r}: its {len(spec.inputs)} inputs are not all delegate arguments "
                          f"(got positions {positions}); an engine input must not be a constant")
    outs = list(next(n for n in ep.graph.nodes if n.op == "output").args[0])
    order = [o.args[1] if o.op == "call_function" and o.target is operator.getitem and o.args[0] is node else None
             for o in outs]
    picked = [i for i in order if i is not None]
    if sorted(picked) != list(range(len(spec.outputs))) or None in order:
        missing = sorted(set(range(len(spec.outputs))) - set(order))
        raise ExportError(
            f"engine {spec.key!r}: outputs {[spec.outputs[i].name for i in missing]} are unused, and ExecuTorch "
            "drops unused delegate outputs, which a TensorRT engine must still bind"
        )
    return [spec.inputs[i] for i in positions] + [spec.outputs[i] for i in picked]
