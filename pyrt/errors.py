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
    """Inputs given to a method do not match what it expects.

    ``field``: the argument or request field the message starts with, where there is one; an API
    that calls it something else names it its own way with :meth:`renamed`.

    >>> err = InputError("max_new_tokens=0 must be an int >= 1", field="max_new_tokens")
    >>> str(err.renamed("max_tokens")), err.renamed("max_tokens").field
    ('max_tokens=0 must be an int >= 1', 'max_tokens')
    """

    def __init__(self, message: str = "", *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field

    def renamed(self, name: str) -> InputError:
        """This error with its field called ``name``, as the caller that sent the value spells it."""
        message = str(self)
        if self.field is None or not message.startswith(self.field):
            return self
        return InputError(name + message[len(self.field):], field=name)


class TreeUnsupportedError(InputError):
    """``draft_tree=True`` asked of a file that cannot verify a tree of guesses (``source``: the file)."""

    def __init__(self, source: str) -> None:
        super().__init__(f"draft_tree=True: {source} cannot verify a tree of guesses (it takes no cache row and "
                         "visible rows per token: a one-sequence file, or a slot file written before trees); export "
                         "it again with max_batch_size > 1 (pyrt's slot layout), or guess a chain (draft_tree=False)",
                         field="draft_tree")
        self.source = source


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


class CheckpointError(ExportError, ValueError):
    """A model on disk (a Hugging Face checkpoint directory, a ``torch.export`` .pt2) is malformed or
    unsupported; ``path`` names the file (or directory) at fault."""

    def __init__(self, path: object, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = str(path)


class ResourceError(PyrtError, MemoryError):
    """A file declares more memory than pyrt's documented limits or the machine can give; names the value."""


class BusyError(PyrtError, RuntimeError):
    """A shared resource is taken (a program's KV-cache slots, a full queue); names what holds it."""


class QueueFullError(BusyError):
    """A queue's bound refused a submission: ``waiting`` already wait for one of ``slots``; the bound, ``limit``, is
    named ``name`` as the caller set it (:meth:`renamed` names it as another API spells it).

    >>> err = QueueFullError("m.pte", waiting=2, slots=4, limit=2, name="max_queued")
    >>> str(err), str(err.renamed("max_queued_requests", source="model 'm'"))
    ('m.pte: 2 generations already wait for one of 4 KV-cache slots (max_queued=2)', "model 'm': 2 generations \
already wait for one of 4 KV-cache slots (max_queued_requests=2)")
    """

    def __init__(self, source: str, *, waiting: int, slots: int, limit: int, name: str) -> None:
        super().__init__(f"{source}: {waiting} generations already wait for one of {slots} KV-cache slots "
                         f"({name}={limit})")
        self.source, self.waiting, self.slots, self.limit, self.name = source, waiting, slots, limit, name

    def renamed(self, name: str, *, source: str | None = None) -> QueueFullError:
        """The same refusal, its bound called ``name`` (and its queue ``source``) as the caller's API spells them."""
        return QueueFullError(self.source if source is None else source, waiting=self.waiting, slots=self.slots,
                              limit=self.limit, name=name)


class ProgramClosedError(PyrtError):
    """A Program was used after ``close()``."""
