"""The torch side of :func:`pyrt.export.trt_builder.build_engine`: checking the module, its
example inputs and names, and exporting it to ONNX (``torch.onnx.export(dynamo=True)``) with
the initializers whose bytes are already in memory. torch is imported only inside functions.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyrt.errors import ExportError

if TYPE_CHECKING:
    import torch

log = logging.getLogger("pyrt.export")


def check_examples(example_inputs: Any) -> tuple[torch.Tensor, ...]:
    import torch

    if not isinstance(example_inputs, (tuple, list)):
        raise ExportError(f"example_inputs must be a tuple of tensors, got {type(example_inputs).__name__}")
    for i, x in enumerate(example_inputs):
        if not isinstance(x, torch.Tensor):
            raise ExportError(f"example_inputs[{i}] is a {type(x).__name__}, not a torch.Tensor")
    return tuple(example_inputs)


def as_module(gm: Any) -> torch.nn.Module:
    import torch

    if isinstance(gm, torch.export.ExportedProgram):
        return gm.module()
    if not isinstance(gm, torch.nn.Module):
        raise ExportError(f"build_engine needs a torch.nn.Module or fx.GraphModule, got {type(gm).__name__}")
    return gm


def check_names(names: Sequence[str] | None, count: int | None, what: str) -> list[str] | None:
    if names is None:
        return None
    if isinstance(names, str) or not all(isinstance(n, str) and n for n in names):
        raise ExportError(f"{what} must be a list of non-empty strings, got {names!r}")
    if len(set(names)) != len(names):
        raise ExportError(f"{what} {list(names)!r} repeats a name")
    if count is not None and len(names) != count:
        raise ExportError(f"{what} has {len(names)} names for {count} example inputs")
    return list(names)


def default_names(module: torch.nn.Module, count: int) -> list[str]:
    """forward()'s positional parameter names: what dynamic_shapes may call the inputs."""
    try:
        params = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):
        return [f"input_{i}" for i in range(count)]
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return names[:count] if len(names) >= count else [f"input_{i}" for i in range(count)]


def to_half(module: torch.nn.Module, examples: tuple[torch.Tensor, ...]) -> tuple[Any, tuple[Any, ...]]:
    """A float16 copy of the module and its floating example inputs (the original is untouched)."""
    import copy

    import torch

    half = copy.deepcopy(module).to(torch.float16)
    return half, tuple(x.to(torch.float16) if x.is_floating_point() else x for x in examples)


def export_onnx(module: torch.nn.Module, examples: tuple[torch.Tensor, ...], directory: Path,
                 input_names: Sequence[str] | None, output_names: Sequence[str] | None,
                 dims: list[list[int]]) -> tuple[Path, dict[str, Any]]:
    """torch.onnx.export (dynamo) with weights as external data, so models over 2 GiB export.

    Returns the model's path and the initializers whose bytes are already in memory (the
    module's own tensors, small folded constants), which the parser can use in place.
    """
    import torch

    path = directory / "model.onnx"
    dynamic = tuple({d: torch.export.Dim.DYNAMIC for d in ds} or None for ds in dims) if any(dims) else None
    chatter = io.StringIO()
    try:
        with contextlib.redirect_stdout(chatter):
            program = torch.onnx.export(module, examples, dynamo=True, optimize=False, input_names=input_names,
                                        output_names=output_names, dynamic_shapes=dynamic)
            if program is None:
                raise ExportError(f"torch.onnx.export returned no program for {type(module).__name__}")
            optimize_keeping_weights(program)
            program.save(str(path), external_data=True)
    except Exception as exc:  # torch.export / onnx conversion errors come in many types
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))  # torch colours its export errors
        raise ExportError(f"torch.onnx.export failed for {type(module).__name__}: "
                          f"{type(exc).__name__}: {text}") from exc
    finally:
        if chatter.getvalue().strip():
            log.debug("torch.onnx.export: %s", chatter.getvalue().strip())
    if not path.is_file():
        raise ExportError(f"torch.onnx.export wrote no model at {path}")
    return path, module_initializers(program)


FOLD_LIMIT = 1 << 20  # bytes: constants above this are left for TensorRT to fold


def optimize_keeping_weights(program: Any) -> None:
    """torch.onnx's optimization (onnxscript's), less what a TensorRT build does not need.

    * No weight is transposed in memory: onnxscript always folds a Transpose of a constant,
      whatever its size; for a decomposed ``linear`` that is a transposed copy of every weight,
      held until the build ends (and read by the parser from the external data file instead of
      the module's own tensor). TensorRT folds such a transpose itself while building, so a
      Transpose of a module weight (a torch tensor), or of any constant over :data:`FOLD_LIMIT`,
      stays in the graph.
    * No pattern rewrites: onnxscript's rewrite rules (no-op removal, fusions for ONNX Runtime)
      matched every rule at every node, 164 of a 24-layer Llama's 211 s of ONNX work and worse
      than linear in the layers; TensorRT fuses and removes no-ops in its own optimizer.
      Constant folding, unused-node removal, initializer deduplication and common
      subexpressions are kept, as onnxscript runs them.
    """
    import onnx_ir.passes.common as common
    import torch
    from onnxscript import optimizer

    def weight(v: Any) -> bool:
        value = None if v is None else v.const_value
        return value is not None and (isinstance(getattr(value, "raw", None), torch.Tensor)
                                      or value.nbytes > FOLD_LIMIT)

    def keep_weight_transposes(node: Any) -> bool | None:
        if node.op_type == "Transpose" and any(weight(v) for v in node.inputs):
            return False
        return None  # onnxscript's own rules

    model = program.model
    try:
        optimizer.inline(model)
        optimizer.fold_constants_ir(model, onnx_shape_inference=True, should_fold=keep_weight_transposes)
        passes = [common.RemoveUnusedNodesPass(), common.RemoveUnusedFunctionsPass(), common.RemoveUnusedOpsetsPass(),
                  common.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
                  common.LiftSubgraphInitializersToMainGraphPass(), common.DeduplicateInitializersPass(),
                  common.CommonSubexpressionEliminationPass(), common.OutputFixPass(), common.NameFixPass()]
    except (AttributeError, TypeError):  # another onnxscript / onnx_ir: its whole optimizer, weights kept
        optimizer.optimize_ir(model, should_fold=keep_weight_transposes)
        return
    for step in passes:
        step(model)


def save_referencing(program: Any, path: Path, weights: dict[str, Weight]) -> None:
    """Save the ONNX model to ``path`` with each of ``weights`` as a reference to external data that is never
    written: the parser gets those bytes from memory (``load_initializer``), so writing them would only put
    another copy of the model on disk (in memory, where the temporary folder is a tmpfs). The other
    initializers (shape constants, small folded values) go into the model itself; its own values are
    restored afterwards."""
    import onnx_ir as ir

    model, location, offset, swapped = program.model, f"{path.name}.in-memory", 0, {}
    try:
        for name, value in model.graph.initializers.items():
            if name in weights and value.const_value is not None:
                tensor = value.const_value
                swapped[name] = tensor
                value.const_value = ir.ExternalTensor(location, offset, tensor.nbytes, tensor.dtype, shape=tensor.shape,
                                                      name=name, base_dir=str(path.parent))
                offset += tensor.nbytes
        ir.save(model, str(path))
    finally:
        for name, tensor in swapped.items():
            model.graph.initializers[name].const_value = tensor


class Weight:
    """An initializer's bytes in memory the exporter already holds: address, size, dtype."""

    def __init__(self, owner: Any, ptr: int, nbytes: int, dtype: Any) -> None:
        self.owner, self.ptr, self.nbytes, self.dtype = owner, ptr, nbytes, dtype  # owner keeps the bytes alive

    def data_ptr(self) -> int:
        return self.ptr


def module_initializers(program: Any) -> dict[str, Weight]:
    """ONNX initializers whose bytes are in memory already: the module's own tensors
    (``TorchTensor.raw``) and arrays the exporter folded, which the parser can read in place."""
    import numpy as np
    import torch

    out: dict[str, Weight] = {}
    try:
        initializers = program.model.graph.initializers.items()
    except AttributeError:  # another ONNXProgram layout: the parser reads the external data file
        return out
    for name, value in initializers:
        raw = getattr(value.const_value, "raw", None)
        size = getattr(value.const_value, "nbytes", -1)
        if isinstance(raw, torch.Tensor) and raw.device.type == "cpu" and raw.is_contiguous() and raw.nbytes == size:
            out[name] = Weight(raw, raw.data_ptr(), size, raw.dtype)
        elif isinstance(raw, np.ndarray) and raw.flags.c_contiguous and raw.nbytes == size:
            out[name] = Weight(raw, raw.ctypes.data, size, raw.dtype)
    return {k: w for k, w in out.items() if w.nbytes > 0}
