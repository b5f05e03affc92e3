"""Quantized weights in a TensorRT build: INT8 / INT4 constants behind a block ``DequantizeLinear``.

TensorRT builds weight-only quantization from a strongly typed network in which each quantized
weight is an INT8 or INT4 constant (INT4 packed two to a byte in the plan) feeding an
``IDequantizeLayer`` with a block shape (one scale per block; symmetric only). Its ONNX parser makes
exactly that from ``DequantizeLinear(values, scales, axis=1, block_size=group)`` (opset 21) over
an INT8 / INT4 initializer.

torch.onnx knows neither pyrt's :func:`~pyrt.export._graph.quantize.dequantize_weight` nor INT4,
and its optimizer folds a dequantization of constants back into float weights. So the partition's
dequantizations are first :func:`lift`-ed out as graph inputs (nothing is folded into an input),
the partition goes to ONNX as usual, and :func:`attach_dequantize` then puts each one back as
stored values and scales (external data beside the model, never copied again) and a
``DequantizeLinear`` (then a ``Transpose`` for a weight a product reads as ``x @ W``) producing the
input it replaces, which it removes from the graph's inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.fx as fx

from pyrt.export._graph.quantize import dequantize_weight

OPSET = 21  # DequantizeLinear's block_size and the INT4 type
DATA_FILE = "pyrt_quantized.data"
_ALIGN = 64


@dataclass(frozen=True)
class Lifted:
    """One dequantization taken out of a partition: the input that stands for its result."""

    name: str
    values: np.ndarray  # int8 [rows, cols] or uint8 [rows, cols // 2] ("twos" packing)
    scales: torch.Tensor  # [rows, cols // group] in the weight's dtype
    bits: int
    group: int
    rows: int
    cols: int
    transposed: bool


def lift(module: fx.GraphModule, prefix: str = "pyrt_dq_") -> list[Lifted]:
    """Replace every :func:`dequantize_weight` node of ``module`` by a new last input; returns them in order."""
    graph = module.graph
    nodes = [n for n in graph.nodes if n.op == "call_function" and n.target is dequantize_weight]
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    lifted = []
    for i, dq in enumerate(nodes):
        values_node, scales_node, bits, group, shape, transposed = dq.args
        anchor = graph.inserting_after(placeholders[-1]) if placeholders else graph.inserting_before(
            next(iter(graph.nodes)))
        with anchor:
            placeholder = graph.placeholder(f"{prefix}{i}")
        placeholder.meta = dict(dq.meta)
        placeholders.append(placeholder)
        dq.replace_all_uses_with(placeholder)
        graph.erase_node(dq)
        stored = [_attr(module, n.target) for n in (values_node, scales_node)]
        for n in (values_node, scales_node):
            if not n.users:
                graph.erase_node(n)
        lifted.append(Lifted(placeholder.name, stored[0].numpy(), stored[1], int(bits), int(group), int(shape[0]),
                             int(shape[1]), bool(transposed)))
    graph.lint()
    module.recompile()
    return lifted


def attach_dequantize(path: Path, lifted: list[Lifted]) -> None:
    """Rewrite the ONNX model at ``path`` so each lifted input is computed from stored values and scales."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    names = {x.name for x in lifted}
    found = {i.name for i in graph.input} & names
    if found != names:
        raise ValueError(f"the ONNX model lacks the lifted inputs {sorted(names - found)}")
    kept = [i for i in graph.input if i.name not in names]
    del graph.input[:]
    graph.input.extend(kept)
    nodes = []
    with open(path.parent / DATA_FILE, "wb") as data:
        for x in lifted:
            kind = TensorProto.INT4 if x.bits == 4 else TensorProto.INT8
            values = _external(data, f"{x.name}_values", kind, [x.rows, x.cols], x.values.tobytes())
            scale_bytes = x.scales.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            scales = _external(data, f"{x.name}_scales", _ONNX_FLOATS[x.scales.dtype], list(x.scales.shape),
                               scale_bytes)
            graph.initializer.extend([values, scales])
            rows = f"{x.name}_rows" if x.transposed else x.name
            nodes.append(helper.make_node("DequantizeLinear", [values.name, scales.name], [rows],
                                          name=f"{x.name}_dequantize", axis=1, block_size=x.group))
            if x.transposed:
                nodes.append(helper.make_node("Transpose", [rows], [x.name], name=f"{x.name}_t", perm=[1, 0]))
    rest = list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes + rest)
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx"):
            opset.version = max(opset.version, OPSET)
    model.ir_version = max(model.ir_version, 10)  # what opset 21 needs
    onnx.save(model, str(path))


def _external(data: Any, name: str, kind: int, dims: list[int], raw: bytes) -> Any:
    """An initializer whose bytes go to ``data`` (64-aligned) as external data."""
    from onnx import TensorProto

    pad = -data.tell() % _ALIGN
    data.write(bytes(pad))
    offset = data.tell()
    data.write(raw)
    tensor = TensorProto(name=name, data_type=kind, dims=dims)
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", DATA_FILE), ("offset", str(offset)), ("length", str(len(raw)))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor


_ONNX_FLOATS = {torch.float32: 1, torch.float16: 10, torch.bfloat16: 16}  # TensorProto FLOAT, FLOAT16, BFLOAT16


def _attr(module: torch.nn.Module, target: Any) -> Any:
    value: Any = module
    for part in str(target).split("."):
        value = getattr(value, part)
    return value
