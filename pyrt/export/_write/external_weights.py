"""External weights (``to_pte(..., external_weights=True)``): weights ExecuTorch runs go to a ``.ptd``.

``ExecutorchBackendConfig(external_constants=True)`` tags every constant of the
lowered program EXTERNAL, keyed by its fully qualified name. ExecuTorch 1.5's
emitter then copies each such weight into a ``bytes`` object (and hashes it) to
build the .ptd in memory, which is what fails for weights larger than memory.
While pyrt's writer lowers, :func:`weights_by_reference` makes the emitter
record each external constant's storage instead (the same EValue it would
emit), and :meth:`ExternalWeights.cord` lays out the .ptd with ExecuTorch's own
serializer over :class:`~pyrt.export._write.executorch_serializer.TensorBytes` views of those
storages, written in pieces when the file is.

Engines keep their weights: a TensorRT engine is one opaque blob in the .pte.
Keys that share a storage (tied weights) share one .ptd segment; ExecuTorch also
shares equal bytes held in different storages (it hashes every weight), pyrt
stores those twice rather than read every weight once more.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from executorch.exir.tensor_layout import TensorLayout

    from pyrt.export._write.executorch_serializer import TensorBytes

log = logging.getLogger("pyrt.export")


class ExternalWeights:
    """The external constants the emitter met: key -> (bytes view, layout), one view per storage."""

    def __init__(self) -> None:
        self.entries: dict[str, tuple[TensorBytes, TensorLayout]] = {}
        self._by_storage: dict[tuple[int, int], tuple[int, TensorBytes]] = {}  # (address, nbytes) -> (index, bytes)

    def add(self, key: str, spec: Any) -> int | None:
        """Record ``spec``'s storage under ``key``; its index among distinct storages (None: cannot)."""
        import torch
        from executorch.exir.tensor import TensorSpec, scalar_type_enum
        from executorch.exir.tensor_layout import TensorLayout

        from pyrt.export._write.executorch_serializer import TensorBytes  # extra: export (executorch: full lowering)

        storage = getattr(spec, "storage", None)
        if not isinstance(spec, TensorSpec) or not isinstance(storage, torch.UntypedStorage):
            return None
        nbytes = storage.nbytes() if spec.allocated_memory != 0 else 0
        if nbytes != spec.nbytes() or storage.device.type != "cpu":
            return None  # ExecuTorch's own path reports (or handles) a storage that is not exactly the tensor
        ident = (storage.data_ptr(), nbytes)
        if ident not in self._by_storage:
            flat = torch.empty(0, dtype=torch.uint8)
            if nbytes:
                flat.set_(storage)  # a uint8 tensor over the storage: no copy
            view = memoryview(flat.numpy().data)
            self._by_storage[ident] = (len(self._by_storage), TensorBytes(view, owner=flat))
        index, data = self._by_storage[ident]
        layout = TensorLayout(scalar_type_enum(spec.scalar_type), list(spec.shape), list(spec.dim_order))
        self.entries.setdefault(key, (data, layout))
        return index

    @property
    def nbytes(self) -> int:
        return sum(len(data) for _, data in self._by_storage.values())

    def cord(self) -> Any:
        from pyrt.export._write.executorch_serializer import external_data_cord  # extra: export (executorch, as above)

        return external_data_cord(self.entries)


@contextlib.contextmanager
def weights_by_reference(sink: ExternalWeights) -> Iterator[bool]:
    """Make ExecuTorch's emitter record external constants in ``sink`` instead of copying them.

    Yields whether the emitter could be patched (False: an ExecuTorch whose emitter differs;
    it then copies the weights itself, as without pyrt).
    """
    try:
        from executorch.exir.emit._emitter import _Emitter
        from executorch.exir.schema import EValue, TensorDataLocation
        from executorch.exir.tensor import make_tensor_value
    except ImportError:
        yield False
        return
    original = _Emitter.__dict__.get("_tensor_spec_to_evalue")
    if original is None:
        yield False
        return

    def by_reference(self: Any, spec: Any, constant_tag: Any = None, *args: Any, **kwargs: Any) -> Any:
        info = getattr(spec, "extra_tensor_info", None)
        planned = spec.mem_id is not None and spec.mem_offset is not None  # mutable: ExecuTorch's own path
        if (spec.const and not planned and constant_tag is not None and info is not None
                and info.fully_qualified_name and info.location == TensorDataLocation.EXTERNAL):
            index = sink.add(info.fully_qualified_name, spec)
            if index is not None:
                return EValue(make_tensor_value(index, None, spec))
        return original(self, spec, constant_tag, *args, **kwargs)

    _Emitter._tensor_spec_to_evalue = by_reference
    try:
        yield True
    finally:
        _Emitter._tensor_spec_to_evalue = original
