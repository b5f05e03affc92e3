"""TensorRT delegates of a method, loaded: blobs -> engines on their devices, budgets applied.

:func:`tensorrt_delegates` parses each ``TensorRTBackend`` blob zero-copy, picks its device
from the ``target_device`` compile spec (else the blob's ``device_id``) remapped through
``device_map``; :func:`load_engines` deserializes the engines there; :func:`apply_budgets`
applies a weight-streaming budget (:mod:`pyrt.streaming`), creating their execution contexts.
The streams a method runs on are :mod:`pyrt.runtime.device_context`'s; the steps that
launch the engines, :mod:`pyrt.runtime.delegate_steps`'.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyrt.cuda as cuda_seam
from pyrt.device.names import parse_device, remap_device
from pyrt.engine import TensorRTEngine
from pyrt.errors import PteFormatError, UnsupportedOperatorError
from pyrt.format.trt_blob import BACKEND_ID, TensorRTBlob, parse_blob
from pyrt.format.weight_quant import SPEC_KEY as QUANT_SPEC
from pyrt.format.weight_quant import parse_spec
from pyrt.pte_reader import BackendDelegate, ExecutionPlan
from pyrt.runtime.memory_plan import close_engines, share_scratch
from pyrt.streaming import EngineStreamingInfo, LoadBudget, ResolvedBudget, find_baked_budget, resolve_budgets

TARGET_DEVICE = "target_device"


@dataclass
class TensorRTDelegate:
    """One TensorRT delegate before and after its engine is loaded."""

    method: str
    index: int
    delegate: BackendDelegate
    blob: TensorRTBlob
    device: int
    baked: int | None
    source: str
    engine: Any = None
    resolved: ResolvedBudget | None = None
    global_index: int = -1

    @property
    def name(self) -> str:
        return f"{self.method}/delegate{self.index}"


def tensorrt_delegates(xplan: ExecutionPlan, device_map: Any) -> list[TensorRTDelegate]:
    """Parse every delegate blob of a method and decide its device (imports no TensorRT)."""
    program = xplan.program
    out = []
    for i, d in enumerate(xplan.delegates):
        where = f"{program.pte.source}: method {xplan.name!r} delegate {i}"
        if d.id != BACKEND_ID:
            raise UnsupportedOperatorError(f"{where} uses backend {d.id!r}; pyrt runs only {BACKEND_ID} delegates")
        blob = parse_blob(program.delegate_data(d), source=where)
        spec = d.spec(TARGET_DEVICE)
        if spec is not None:
            try:
                text = spec.decode("ascii")
            except UnicodeDecodeError:
                raise PteFormatError(f"{where}: compile spec {TARGET_DEVICE} {spec!r} is not ASCII") from None
            device = parse_device(text, f"{where} compile spec {TARGET_DEVICE}")
        else:
            device = blob.device_id
        baked = find_baked_budget([(c.key, c.value) for c in d.compile_specs], source=where)
        quantized = [c.value for c in d.compile_specs if c.key == QUANT_SPEC]
        if len(quantized) > 1:
            raise PteFormatError(f"{where}: compile spec {QUANT_SPEC} appears {len(quantized)} times")
        if quantized:  # a scheme pyrt does not know may mean weights it would misread: refuse the file
            parse_spec(quantized[0], where)
        out.append(TensorRTDelegate(xplan.name, i, d, blob, remap_device(device, device_map), baked, where))
    return out


def load_engines(delegates: Sequence[TensorRTDelegate], *, trt: Any, cuda: Any, share_activations: bool = True) -> None:
    """Deserialize every engine (engine index = position in ``delegates``); no execution context exists yet.

    ``share_activations``: engines of one method on one device share one activation scratch
    (:mod:`pyrt.device.scratch`); they run one after another on the method's stream under its lock.
    Nothing to load (no delegates) touches no device.
    """
    try:
        for i, d in enumerate(delegates):
            d.global_index = i
            d.engine = TensorRTEngine.load(d.blob.engine, device=d.device, io_bindings=d.blob.io_bindings,
                                           trt=trt, cuda=cuda, name=d.name)
        if share_activations and delegates:
            share_scratch(delegates, cuda_seam.resolve(cuda))
    except BaseException:
        close_engines(delegates)
        raise


def apply_budgets(delegates: Sequence[TensorRTDelegate], budget: LoadBudget, *, source: str,
                  planned: Mapping[int, int] | None = None) -> None:
    """Resolve every engine's budget from ``budget`` (read once: :func:`pyrt.streaming.parse_load_budget`),
    then configure each engine, which (re)creates its execution context.

    ``planned``: the memory plan's split (engine index -> bytes), which ``"fit"`` applies.
    """
    infos = [EngineStreamingInfo(d.global_index, d.engine.streamable_weights_size, d.baked) for d in delegates]
    for d, r in zip(delegates, resolve_budgets(infos, budget, source=source, planned=planned), strict=True):
        d.engine.configure(r.budget, r.source)
        d.resolved = r
