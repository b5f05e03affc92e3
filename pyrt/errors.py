"""pyrt's typed errors: one root, so callers can ``except pyrt.PyrtError``.

User mistakes (bad files, bad budgets, bad inputs) and environment problems
(no GPU, no TensorRT) each get their own class; every message names the
offending value and where it came from.

>>> from pyrt.errors import PteFormatError, PyrtError
>>> issubclass(PteFormatError, PyrtError)
True
"""

from __future__ import annotations


class PyrtError(Exception):
    """Root of every error pyrt raises on purpose."""


class PteFormatError(PyrtError, ValueError):
    """A .pte file (or bytes claiming to be one) is malformed."""


class BlobFormatError(PyrtError, ValueError):
    """A TensorRT delegate blob (TR01/TR02) is malformed."""


class BudgetError(PyrtError, ValueError):
    """A weight-streaming budget value is invalid."""


class InputError(PyrtError, ValueError):
    """Inputs given to a method do not match what it expects."""


class ExecutionError(PyrtError, RuntimeError):
    """A kernel failed while a method ran; names the method, instruction and operator."""


class UnsupportedOperatorError(PyrtError):
    """A program uses an operator that no available kernel library implements."""


class BackendError(PyrtError):
    """A required backend (TensorRT flavour, CUDA driver) is missing or failed."""


class DeviceError(BackendError):
    """A CUDA device is missing, or a CUDA call failed."""


class EngineError(BackendError):
    """TensorRT refused an engine, a budget, a context or a launch."""


class ExportError(PyrtError):
    """Export could not produce a .pte from the given model."""


class ResourceError(PyrtError, MemoryError):
    """A file declares more memory than pyrt's documented limits or the machine can give; names the value."""


class BusyError(PyrtError, RuntimeError):
    """A shared resource is taken (a program's KV-cache slots, a full queue); names what holds it."""


class ProgramClosedError(PyrtError):
    """A Program was used after ``close()``."""
