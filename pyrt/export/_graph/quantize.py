"""Weight-only quantization of an engine partition's linear layers (``to_pte(quantize=...)``).

Every 2-D floating weight a matrix product reads as its weight operand (``aten.linear``'s weight;
``addmm`` / ``mm`` / ``matmul``'s right operand, as GPT-2's ``Conv1D`` stores it, transposed) is
replaced by a :func:`dequantize_weight` node over two new weights, the stored values and the scales
(:mod:`pyrt.format.weight_quant`'s scheme, scales in the weight's dtype). Other uses of the same
tensor (a tied embedding) keep the float weight. Each builder then writes the node its own way:
reference engines as ``pyrt::dequantize_weight`` (:mod:`pyrt.sim.refengine.quant`), TensorRT as an
INT8 / INT4 constant and a block ``DequantizeLinear`` (:mod:`pyrt.export._engines.onnx_quant`).

>>> import torch
>>> gm = torch.fx.symbolic_trace(torch.nn.Linear(32, 4))          # doctest: +SKIP
>>> quantize_partition(gm, Scheme("int4", 16)).layers[0].group     # doctest: +SKIP
16
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import torch
import torch.fx as fx

from pyrt.errors import ExportError
from pyrt.export.summary import QuantizedLayer, QuantSummary
from pyrt.format import weight_quant as wq
from pyrt.format.weight_quant import Scheme
from pyrt.kernels.quantized import torch_dequantize

# op -> the argument position that is a weight, and whether the op reads it as [in, out] (transposed)
_WEIGHT_USES: dict[Any, tuple[int, bool]] = {
    torch.ops.aten.linear.default: (1, False),
    torch.ops.aten.addmm.default: (2, True),
    torch.ops.aten.mm.default: (1, True),
    torch.ops.aten.matmul.default: (1, True),
}
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
# weights are quantized this many elements at a time: the float32 temporaries are a few MiB, not about 13 bytes
# per weight of the whole layer (a 70B model's LM head alone would need about 3 GiB of them)
BLOCK_ELEMENTS = 1 << 20


def dequantize_weight(values: torch.Tensor, scales: torch.Tensor, bits: int, group_size: int, shape: list[int],
                      transposed: bool) -> torch.Tensor:
    """The float weight ``values`` and ``scales`` stand for (the FX target the builders translate)."""
    rows, cols = shape
    out = torch_dequantize(values, scales, bits=bits, cols=cols, layout="twos", dtype=scales.dtype)
    return out.t() if transposed else out


def quantize_partition(module: fx.GraphModule, scheme: Scheme) -> QuantSummary:
    """Quantize ``module``'s linear weights in place (see the module docstring); returns what was done."""
    summary = QuantSummary(scheme.name, scheme.group_size)
    graph = module.graph
    for node in [n for n in graph.nodes if n.op == "get_attr"]:
        uses = _weight_uses(module, node)
        if not uses:
            continue
        source = str(node.meta.get("pyrt_source", node.target))
        for transposed in sorted({t for _, _, t in uses}):
            picked = [(user, pos) for user, pos, t in uses if t == transposed]
            layer = _replace(module, node, picked, transposed, scheme, source)
            if isinstance(layer, str):
                summary.skipped.append((source, layer))
            else:
                summary.layers.append(layer)
        if not node.users:
            graph.erase_node(node)
    graph.lint()
    module.recompile()
    summary.other_bytes = sum(_attr(module, n.target).nbytes for n in graph.nodes
                              if n.op == "get_attr" and n.target not in summary.stored_names())
    return summary


def _weight_uses(module: fx.GraphModule, node: fx.Node) -> list[tuple[fx.Node, int, bool]]:
    value = _attr(module, node.target)
    if not isinstance(value, torch.Tensor) or value.dim() != 2 or value.dtype not in _FLOATS:
        return []
    uses = []
    for user in node.users:
        pos, transposed = _WEIGHT_USES.get(user.target, (-1, False))
        if 0 <= pos < len(user.args) and user.args[pos] is node:
            uses.append((user, pos, transposed))
    return uses


def quantize_rows(rows_first: torch.Tensor, scheme: Scheme, name: str, int4_layout: str = "twos"
                  ) -> tuple[np.ndarray, np.ndarray, int] | str:
    """A weight ``[out_features, in_features]`` quantized: (stored values, scales in the weight's dtype, group);
    int4 packed two to a byte in ``int4_layout`` (``wq.pack_int4``'s). A reason string where it stays float;
    ExportError naming ``name`` where the values cannot be quantized. Quantized :data:`BLOCK_ELEMENTS` at a time,
    so what it holds beyond its result is a block's temporaries, whatever the weight's size."""
    rows, cols = rows_first.shape
    if scheme.bits == 4 and cols % 2:
        return f"int4 needs an even input size, this layer has {cols}"
    group = scheme.group_for(cols)
    dtype = str(rows_first.dtype).removeprefix("torch.")
    stored = np.empty(wq.stored_shape(scheme.bits, rows, cols), dtype=wq.stored_dtype(scheme.bits))
    scales = np.empty((rows, cols // group), dtype=np.float32)
    step = max(1, BLOCK_ELEMENTS // cols)  # rows are quantized independently: a block's temporaries, not the weight's
    for first in range(0, rows, step):
        block = slice(first, first + step)
        try:
            q, scales[block] = wq.quantize(rows_first[block].float().numpy(), bits=scheme.bits, group=group,
                                           scale_dtype=dtype)
        except ValueError as exc:
            raise ExportError(f"cannot quantize {name!r}: {exc}") from None
        stored[block] = wq.pack_int4(q, int4_layout) if scheme.bits == 4 else q
    return stored, scales, group


def _replace(module: fx.GraphModule, node: fx.Node, uses: list[tuple[fx.Node, int]], transposed: bool,
             scheme: Scheme, source: str) -> QuantizedLayer | str:
    """Swap ``uses`` of weight ``node`` for a dequantization; a reason string where it stays float."""
    weight = _attr(module, node.target).detach()
    rows_first = weight.t() if transposed else weight  # [out_features, in_features]
    rows, cols = rows_first.shape
    quantized = quantize_rows(rows_first, scheme, source)
    if isinstance(quantized, str):
        return quantized
    stored, scales, group = quantized
    base = _attr_name(module, source)  # the model's name for the weight: errors and reports name it
    module.register_buffer(f"{base}_values", torch.from_numpy(np.ascontiguousarray(stored)), persistent=False)
    module.register_buffer(f"{base}_scales", torch.from_numpy(scales).to(weight.dtype), persistent=False)
    first = min((u for u, _ in uses), key=_position(module.graph))
    with module.graph.inserting_before(first):
        values_node = module.graph.get_attr(f"{base}_values")
        scales_node = module.graph.get_attr(f"{base}_scales")
        dq = module.graph.call_function(dequantize_weight, (values_node, scales_node, scheme.bits, group,
                                                            [rows, cols], transposed))
    values_node.meta["val"] = torch.empty(stored.shape, dtype=torch.int8 if scheme.bits == 8 else torch.uint8,
                                          device="meta")
    scales_node.meta["val"] = torch.empty(scales.shape, dtype=weight.dtype, device="meta")
    dq.meta = {k: v for k, v in node.meta.items() if k != "pyrt_source"}
    for user, pos in uses:
        user.update_arg(pos, dq)
    return QuantizedLayer(source, rows, cols, group, int(stored.nbytes), int(scales.size * weight.element_size()),
                          f"{base}_values", f"{base}_scales", transposed)


def _attr_name(module: fx.GraphModule, wanted: str) -> str:
    """A free attribute name (letters, digits, underscores) starting from ``wanted``."""
    base = re.sub(r"\W", "_", wanted)
    name, k = base, 1
    while hasattr(module, f"{name}_values"):
        name, k = f"{base}{k}", k + 1
    return name


def _position(graph: fx.Graph) -> Any:
    order = {n: i for i, n in enumerate(graph.nodes)}
    return order.__getitem__


def _attr(module: torch.nn.Module, target: Any) -> Any:
    value: Any = module
    for part in str(target).split("."):
        value = getattr(value, part)
    return value
