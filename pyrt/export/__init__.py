"""Export PyTorch models to .pte programs with TensorRT delegates.

>>> import torch, pyrt.export
>>> summary = pyrt.export.to_pte(torch.nn.Linear(4, 2), "lin.pte", (torch.randn(3, 4),),
...                              builder="reference")                     # doctest: +SKIP
>>> print(summary)                                                         # doctest: +SKIP

Importing this package imports neither torch nor executorch; the names below
load them on first use.

May import: every layer below (format, device, memory, kernels, runtime; testing for the
reference engines); torch, executorch, onnx and TensorRT only inside the functions that
need them. Nothing below imports this package.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "to_pte", "decoder_to_pte", "ExportSummary", "EngineSummary", "PartitionInfo", "BUILDERS",
    "TensorRTBackend", "TensorRTPartitioner",
]

_LAZY = {
    "to_pte": ("pyrt.export.api", "to_pte"),
    "decoder_to_pte": ("pyrt.export.decoder", "decoder_to_pte"),
    "ExportSummary": ("pyrt.export._summary", "ExportSummary"),
    "EngineSummary": ("pyrt.export._summary", "EngineSummary"),
    "PartitionInfo": ("pyrt.export._options", "PartitionInfo"),
    "BUILDERS": ("pyrt.export._options", "BUILDERS"),
    "TensorRTBackend": ("pyrt.export.backend", "TensorRTBackend"),
    "TensorRTPartitioner": ("pyrt.export.backend", "TensorRTPartitioner"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'pyrt.export' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
