"""Stage 2: re-export the engine graph, lower it with ExecuTorch, write the .pte.

The graph from stage 1 holds ``pyrt::execute_engine`` nodes whose engines are
uint8 tensor attributes; ``torch.export`` lifts them as constants (they never
appear in FX source). ExecuTorch then delegates each engine node to
``TensorRTBackend`` and serializes with ``extract_delegate_segments=True``.

Device placement: every delegate carries ``target_device``, so ExecuTorch
1.5's ``PropagateDevicePass`` (on by default through
``ExecutorchBackendConfig.enable_non_cpu_memory_planning``) inserts
``et_copy::_h2d_copy.out`` / ``_d2h_copy.out`` around delegates and plans
their I/O in CUDA arenas; a runtime must implement both copies.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

from pyrt.errors import ExportError
from pyrt.export._files.atomic import atomic_write_all
from pyrt.export._files.engine_store import EngineRecord, EngineStore
from pyrt.export._graph.engine_op import is_engine_call
from pyrt.export._graph.fx import dynamic_shapes_of
from pyrt.export._graph.passes import live_nodes
from pyrt.export._write import direct
from pyrt.export._write.external_weights import ExternalWeights, weights_by_reference
from pyrt.export._write.state import StateOnDevice
from pyrt.export.options import ExportOptions
from pyrt.export.summary import EngineSummary

log = logging.getLogger("pyrt.export")
DATA_DEPENDENT_ALIGNMENT = 256  # bytes; cudaMalloc's guarantee, the most an output allocator is asked for
DIRECT = True  # internal switch: False sends every program through ExecuTorch's lowering (tests compare both)


@dataclass
class Lowered:
    file_size: int
    fallback_ops: Counter[str]
    data_path: str | None = None
    data_size: int = 0


def reexport(gm: fx.GraphModule, example: tuple[Any, Any], original: Any, dynamic_shapes: Any
             ) -> torch.export.ExportedProgram:
    """torch.export the engine graph, reproducing the original program's dynamic dims."""
    args, kwargs = example
    shapes = dynamic_shapes_of(original) if original is not None else dynamic_shapes
    try:
        return torch.export.export(gm, tuple(args), dict(kwargs or {}), dynamic_shapes=shapes, strict=False)
    except Exception as exc:  # torch.export raises many error types
        raise ExportError(f"re-exporting the engine graph failed: {type(exc).__name__}: {exc}") from exc


def lower(program: torch.export.ExportedProgram, engines: list[EngineSummary], store: EngineStore, target: Path,
          options: ExportOptions, constant_methods: dict[str, Any] | None = None) -> Lowered:
    """ExecuTorch lowering and the atomic write, with pyrt's streaming writer or ExecuTorch's.

    A program that is one engine call between its inputs and outputs is written directly
    (:mod:`pyrt.export._write.direct`, the same file without importing ExecuTorch's lowering) unless
    ``DIRECT`` is off or ``options.writer`` asks for ExecuTorch's serializer.
    With ``options.external_weights`` the weights ExecuTorch runs go to ``target.with_suffix(".ptd")``.
    ``constant_methods``: ExecuTorch constant methods (name -> value) written beside ``forward``
    (``decoder_to_pte``'s LLM metadata).
    """
    use_direct = DIRECT and options.writer == "pyrt" and not constant_methods
    delegated = direct.describe(program) if use_direct else None
    if delegated is not None and delegated.spec.key in store.records:  # the engine streams from its spill file
        return _write_direct(delegated, store.records[delegated.spec.key], target, options)
    with options.progress.task("importing ExecuTorch", stage="write"):
        from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge_transform_and_lower

        from pyrt.export.backend import BlobSession, TensorRTPartitioner, streaming_blobs  # extra: export (executorch)

    used = {e.key for e in engines}
    session = BlobSession({r.key: (r.path, r.size, r.sha256) for k, r in store.records.items() if k in used})
    external = options.external_weights
    defaults = ExecutorchBackendConfig()
    config = ExecutorchBackendConfig(extract_delegate_segments=True, external_constants=external,
                                     to_out_var_pass=StateOnDevice(defaults.to_out_var_pass))
    if any(getattr(e, "bounded_outputs", ()) for e in engines):
        # TensorRT's output allocator may ask for cudaMalloc's alignment: plan every tensor on it, so the
        # planned buffer of a data-dependent output can be handed over as it is (pyrt.device.output_allocator)
        from executorch.exir.passes import MemoryPlanningPass  # extra: export (executorch)

        config.memory_planning_pass = MemoryPlanningPass(alignment=DATA_DEPENDENT_ALIGNMENT)
    streaming = options.writer == "pyrt"
    weights = ExternalWeights()
    with options.progress.task("lowering with ExecuTorch", stage="write"), _prefer_pyrt_backend(), \
            (streaming_blobs(session) if streaming else contextlib.nullcontext()):
        # IR validation stays off: with it, ExecuTorch 1.5.1's edge verifier specialises a dynamic
        # program around engine nodes (it equated s0 + s1 with the example's 7); the fallback ops are
        # core ATen or ops torch.onnx translates whole (to_edge decomposes those to core ATen), and
        # ToOutVarPass still refuses any without kernels.
        edge = to_edge_transform_and_lower(
            program, partitioner=[TensorRTPartitioner(options.extra_specs)],
            compile_config=EdgeCompileConfig(_check_ir_validity=False), constant_methods=constant_methods)
        fallback = fallback_ops(edge.exported_program().graph_module)
        _check_all_delegated(edge.exported_program().graph_module)
        with (weights_by_reference(weights) if external and streaming else contextlib.nullcontext()):
            manager = _to_executorch(edge, config)
    del edge, program
    return _write(manager, session, config, target, options, weights if external else None, fallback)


def _to_executorch(edge: Any, config: Any) -> Any:
    """``edge.to_executorch``; a size ExecuTorch cannot bound (a data-dependent op outside any
    engine, such as ``repeat_interleave``) is an ExportError instead of its bare RuntimeError."""
    try:
        return edge.to_executorch(config)
    except RuntimeError as exc:
        if "finite upper bound" not in str(exc):
            raise
        raise ExportError(f"ExecuTorch cannot plan memory for a size with no upper bound ({exc}); give "
                          "Dim(max=...) or torch._check(size <= N) after the op that makes it") from exc


def _write_direct(delegated: direct.Delegated, record: EngineRecord, target: Path, options: ExportOptions) -> Lowered:
    if record.size != delegated.engine_size:
        raise ExportError(f"engine {delegated.spec.key!r}: file holds {record.size} bytes, "
                          f"the graph's tensor {delegated.engine_size}")
    with options.progress.task("emitting the program (one engine, fully delegated)", stage="write"):
        total, write = direct.writer(delegated, options.extra_specs, record.path)
    with options.progress.task(f"writing {target.name}", total=total, unit="B", stage="write") as task:
        (size,) = atomic_write_all([(target, lambda f: write(f, task.update))])
    if options.external_weights:
        log.info("external_weights: no weights run outside the engines, so no .ptd was written")
    return Lowered(size, Counter())


def _write(manager: Any, session: Any, config: Any, target: Path, options: ExportOptions,
           weights: ExternalWeights | None, fallback: Counter[str]) -> Lowered:
    from pyrt.export._write.executorch_serializer import (  # extra: export (executorch)
        streaming_program_cord,
        write_cord,
    )

    ptd = _ptd_cord(manager, weights) if weights is not None else None
    data_path = target.with_suffix(".ptd") if ptd is not None else None
    if options.writer == "pyrt":
        cord = streaming_program_cord(manager, session, config)
        total = len(cord) + (len(ptd) if ptd is not None else 0)
        with options.progress.task(f"writing {target.name}", total=total, unit="B", stage="write") as task:
            outputs: list[tuple[Any, Any]] = [(target, lambda f: write_cord(cord, f, task.update))]
            if ptd is not None:
                outputs.insert(0, (data_path, lambda f: write_cord(ptd, f, task.update)))
            sizes = atomic_write_all(outputs)
    else:
        with options.progress.task(f"writing {target.name} (ExecuTorch serializer)", stage="write"):
            outputs = [(target, manager.write_to_file)]
            if ptd is not None:
                outputs.insert(0, (data_path, ptd.write_to_file))
            sizes = atomic_write_all(outputs)
    if weights is not None and ptd is None:
        log.info("external_weights: no weights run outside the engines, so no .ptd was written")
    return Lowered(sizes[-1], fallback, str(data_path) if data_path else None, sizes[0] if ptd is not None else 0)


def _ptd_cord(manager: Any, weights: ExternalWeights) -> Any:
    """The .ptd: from the weights the emitter recorded, else the one ExecuTorch built (None: no weights)."""
    if weights.entries:
        return weights.cord()
    files = getattr(manager, "_tensor_data", None) or {}
    if len(files) > 1:
        raise ExportError(f"ExecuTorch split the external weights into {len(files)} data files "
                          f"({', '.join(files)}); pyrt writes one .ptd")
    return next(iter(files.values()), None)


def fallback_ops(gm: fx.GraphModule) -> Counter[str]:
    """Operator calls left outside delegates (edge dialect names, ``aten::relu`` style)."""
    from executorch.exir.delegate import executorch_call_delegate

    out: Counter[str] = Counter()
    live = live_nodes(gm)  # an assertion (and the sizes only it reads) is removed by to_executorch
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is executorch_call_delegate or node not in live:
            continue
        schema = getattr(node.target, "_schema", None)
        if schema is not None:
            out[schema.name] += 1
    return out


def _check_all_delegated(gm: fx.GraphModule) -> None:
    left = [n.name for n in gm.graph.nodes if n.op == "call_function" and is_engine_call(n.target)]
    if left:
        raise ExportError(f"engine nodes {left} were not delegated to TensorRTBackend")


@contextlib.contextmanager
def _prefer_pyrt_backend() -> Iterator[None]:
    """ExecuTorch finds a backend by class name among BackendDetails subclasses; make it find pyrt's.

    Another class named ``TensorRTBackend`` (Torch-TensorRT's, a test's) is hidden while lowering.
    """
    from executorch.exir.backend.backend_details import BackendDetails

    from pyrt.export.backend import TensorRTBackend  # extra: export (executorch)

    others = [c for c in type.__subclasses__(BackendDetails)
              if c.__name__ == TensorRTBackend.__name__ and c is not TensorRTBackend]
    if not others:
        yield
        return
    log.debug("hiding other TensorRTBackend classes while lowering: %s", [c.__module__ for c in others])
    previous = BackendDetails.__dict__.get("__subclasses__")
    BackendDetails.__subclasses__ = staticmethod(
        lambda: [c for c in type.__subclasses__(BackendDetails) if c not in others])
    try:
        yield
    finally:
        if previous is None:
            del BackendDetails.__subclasses__
        else:
            BackendDetails.__subclasses__ = previous
