"""Weight-only quantization for ``decoder_to_pte(builder="portable", quantize=...)``: ExecuTorch's own ops.

ExecuTorch 1.5.1's runtime runs group-wise quantized weights through its quantized kernel library:
``quantized_decomposed::embedding_byte`` (int8) and ``embedding_4bit`` (two values a byte) dequantize
the rows they are given (``mixed_linear`` multiplies int8 weights only; no other kernel takes packed
int4). So each linear layer becomes :class:`QuantizedLinear`: ``embedding_4bit.dtype(values, scales,
None, -8, 7, arange(out_features), dtype=x.dtype)`` gives the dequantized weight, then ``linear``.
The scheme is :mod:`pyrt.format.weight_quant`'s; scales are in the model's dtype, which ExecuTorch's
kernels take as float32 or float16 only. ``nn.Linear`` and transformers' ``Conv1D`` (GPT-2, weight
stored ``[in, out]``) are quantized; embeddings (and a tied LM head's embedding) keep the model's
dtype.

>>> import torch
>>> model = torch.nn.Sequential(torch.nn.Linear(32, 8))
>>> quantize_linears(model, Scheme("int8", 16)).layers[0].group       # doctest: +SKIP
16
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from pyrt.errors import ExportError
from pyrt.export._graph.quantize import quantize_rows
from pyrt.export.summary import QuantizedLayer, QuantSummary
from pyrt.format.weight_quant import Scheme

DTYPES = (torch.float32, torch.float16)  # what ExecuTorch's quantized kernels take


class QuantizedLinear(torch.nn.Module):
    """A linear layer whose weight ExecuTorch's ``embedding_byte`` / ``embedding_4bit`` dequantize each call."""

    def __init__(self, values: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None, bits: int) -> None:
        super().__init__()
        self.bits, self.rows = bits, int(values.shape[0])
        self.register_buffer("values", values)
        self.register_buffer("scales", scales)
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = torch.arange(self.rows, device=x.device)
        ops = torch.ops.quantized_decomposed
        if self.bits == 4:
            weight = ops.embedding_4bit.dtype(self.values, self.scales, None, -8, 7, rows, dtype=x.dtype)
        else:
            weight = ops.embedding_byte.dtype(self.values, self.scales, None, -127, 127, rows, dtype=x.dtype)
        return torch.nn.functional.linear(x, weight, self.bias)


def quantize_linears(model: torch.nn.Module, scheme: Scheme) -> QuantSummary:
    """Replace ``model``'s linear layers in place (pass a copy); returns what was done."""
    import executorch.exir  # noqa: F401  (defines the quantized_decomposed ops in torch)

    summary = QuantSummary(scheme.name, scheme.group_size)
    for name, parent, child_name, child in list(_linears(model)):
        weight = child.weight.detach()
        if weight.dtype not in DTYPES:
            raise ExportError(f"quantize={scheme.name!r} with builder='portable': {name} is {weight.dtype}; "
                              "ExecuTorch's quantized kernels take float32 or float16 (pass dtype=)")
        rows_first = weight.t() if _is_conv1d(child) else weight
        layer = _quantized(name, rows_first, child.bias, scheme)
        if isinstance(layer, str):
            summary.skipped.append((name, layer))
            continue
        module, info = layer
        setattr(parent, child_name, module)
        summary.layers.append(info)
    stored = {id(t) for m in model.modules() if isinstance(m, QuantizedLinear) for t in (m.values, m.scales)}
    summary.other_bytes = sum(t.nbytes for t in _tensors(model) if id(t) not in stored)
    return summary


def _quantized(name: str, weight: torch.Tensor, bias: Any, scheme: Scheme
               ) -> tuple[QuantizedLinear, QuantizedLayer] | str:
    rows, cols = weight.shape
    quantized = quantize_rows(weight, scheme, name, int4_layout="offset8")  # ExecuTorch's embedding_4bit layout
    if isinstance(quantized, str):
        return quantized
    stored, scales, group = quantized
    values = torch.from_numpy(np.ascontiguousarray(stored))
    scale_tensor = torch.from_numpy(scales).to(weight.dtype)
    module = QuantizedLinear(values, scale_tensor, bias, scheme.bits)
    return module, QuantizedLayer(f"{name}.weight", rows, cols, group, values.nbytes, scale_tensor.nbytes)


def _linears(model: torch.nn.Module) -> Any:
    """(qualified name, parent, attribute, module) of every linear layer, parents first."""
    for parent_name, parent in model.named_modules():
        for child_name, child in parent.named_children():
            if isinstance(child, torch.nn.Linear) or _is_conv1d(child):
                yield f"{parent_name}.{child_name}".lstrip("."), parent, child_name, child


def _is_conv1d(module: torch.nn.Module) -> bool:
    """transformers' ``Conv1D``: a linear layer whose weight is stored ``[in_features, out_features]``."""
    weight = getattr(module, "weight", None)
    return (type(module).__name__ == "Conv1D" and isinstance(weight, torch.Tensor) and weight.dim() == 2
            and getattr(module, "nf", None) == weight.shape[1])


def _tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """Every parameter and buffer once (tied weights counted once)."""
    seen: dict[int, torch.Tensor] = {}
    for t in [*model.parameters(), *model.buffers()]:
        seen.setdefault(id(t), t)
    return list(seen.values())
