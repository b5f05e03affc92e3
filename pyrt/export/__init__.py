"""Export PyTorch models to .pte programs with TensorRT delegates.

>>> import torch, pyrt.export
>>> summary = pyrt.export.to_pte(torch.nn.Linear(4, 2), "lin.pte", (torch.randn(3, 4),),
...                              builder="reference")                     # doctest: +SKIP
>>> print(summary)                                                         # doctest: +SKIP

Importing this package imports neither torch nor executorch: ``to_pte``,
``decoder_to_pte`` and the ExecuTorch backend load them on first use (``__getattr__``).

May import: every layer below (format, device, memory, kernels, runtime; sim for the
reference engines); torch, executorch, onnx and TensorRT only inside the functions that
need them. Nothing below imports this package.
"""

from __future__ import annotations

from typing import Any

from pyrt.export.options import BUILDERS, PartitionInfo
from pyrt.export.summary import EngineSummary, ExportSummary

__all__ = [
    "to_pte", "decoder_to_pte", "ExportSummary", "EngineSummary", "PartitionInfo", "BUILDERS",
    "TensorRTBackend", "TensorRTPartitioner",
]


def __getattr__(name: str) -> Any:
    """The names that load torch (and ExecuTorch) are imported on first use."""
    if name == "to_pte":
        from pyrt.export.api import to_pte  # extra: export (torch)

        return to_pte
    if name == "decoder_to_pte":
        from pyrt.export.decoder import decoder_to_pte  # extra: export (torch)

        return decoder_to_pte
    if name in ("TensorRTBackend", "TensorRTPartitioner"):
        from pyrt.export.backend import TensorRTBackend, TensorRTPartitioner  # extra: export (executorch)

        return TensorRTBackend if name == "TensorRTBackend" else TensorRTPartitioner
    raise AttributeError(f"module 'pyrt.export' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
