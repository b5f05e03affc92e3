"""pyrt: run TensorRT-accelerated ExecuTorch programs from Python.

>>> import pyrt
>>> info = pyrt.inspect("model.pte")                  # doctest: +SKIP
>>> with pyrt.Program("model.pte", budget="2GiB") as prog:   # doctest: +SKIP
...     out = prog(x)

Importing pyrt imports neither torch nor executorch. With ``PYRT_SIMULATED_GPUS=n`` in the
environment, the process runs on n simulated GPUs (:func:`pyrt.sim.install_from_environment`).
"""

from __future__ import annotations

import os as _os
from typing import Any

from pyrt._version import __version__
from pyrt.errors import (
    BackendError,
    BlobFormatError,
    BudgetError,
    BusyError,
    CheckpointError,
    DeviceError,
    EngineError,
    ExecutionError,
    ExportError,
    InputError,
    ProgramClosedError,
    PteFormatError,
    PyrtError,
    QueueFullError,
    ResourceError,
    UnsupportedOperatorError,
)

__all__ = [
    "Program", "generate", "inspect", "__version__",
    "PyrtError", "PteFormatError", "BlobFormatError", "BudgetError", "InputError",
    "UnsupportedOperatorError", "BackendError", "DeviceError", "EngineError", "ExecutionError", "ExportError",
    "ProgramClosedError", "ResourceError", "BusyError", "QueueFullError", "CheckpointError",
]


def __getattr__(name: str) -> Any:
    # Lazy: the runtime pulls in numpy and the CUDA seam only when used; and nothing below the root is
    # imported while this file runs, so no lower module reaches back into a half-made root.
    if name == "inspect":  # pyrt.tools.report.inspect (the reader, the reference engines' weights)
        from pyrt.tools.report import inspect

        return inspect
    if name == "Program":
        from pyrt.runtime.program import Program

        return Program
    if name == "generate":  # pyrt.llm.generate (imports numpy and the runtime)
        from pyrt.llm.loop import generate

        return generate
    raise AttributeError(f"module 'pyrt' has no attribute {name!r}")


if _os.environ.get("PYRT_SIMULATED_GPUS", "").strip().isdigit():  # the CLI, the server and scripts alike
    from pyrt.sim import install_from_environment as _install

    _install()  # a value that is no count: the command line's error, or a DeviceError's hint, says so
