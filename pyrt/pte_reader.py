"""Zero-copy, validated reader for ExecuTorch ``.pte`` program files.

A file is opened with one read-only mmap; the ``Program`` flatbuffer is parsed
lazily, field by field, and every offset goes through one bounds check
(:class:`pyrt.format.bounds.Span`). Delegate blobs and constant data come back as
memoryviews into the mmap: nothing large is copied on the load path.

>>> from pyrt.pte_reader import PteFile
>>> with PteFile.open("model.pte") as pte:                     # doctest: +SKIP
...     plan = pte.program.method("forward")
...     [d.id for d in plan.delegates]
['TensorRTBackend']

Layout facts: ``docs/formats.md`` (shared) section 1.
"""

from __future__ import annotations

import mmap as mmap_mod
import os
from collections.abc import Iterator, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, cast

from pyrt.errors import PteFormatError
from pyrt.format import values as _values
from pyrt.format.bounds import Span
from pyrt.format.decode import (
    buffer_device,
    data_segment,
    decode_evalue,
    decode_instruction,
    first,
    named_data,
    subsegment,
)
from pyrt.format.delegates import BackendDelegate, CompileSpec, decode_delegate
from pyrt.format.flatbuffer import Table, Vector
from pyrt.format.mapped import map_file, unmap
from pyrt.format.pte_header import byte_view, parse_headers
from pyrt.format.schema import (  # noqa: F401  (re-exported: the reader's public records)
    EVALUE_KINDS,
    INSTRUCTION_KINDS,
    AllocationInfo,
    BufferDevice,
    Chain,
    DataLocation,
    DataSegment,
    DelegateCall,
    DeviceType,
    EValue,
    ExtendedHeader,
    ExtraTensorInfo,
    FreeCall,
    Instruction,
    JumpFalseCall,
    KernelCall,
    MoveCall,
    NamedData,
    Operator,
    ShapeDynamism,
    SubsegmentOffsets,
    Tensor,
    TensorDataLocation,
)
from pyrt.renames import renamed

if TYPE_CHECKING:
    from pyrt.format.ptd_reader import ExternalData

Source = str | os.PathLike | bytes | bytearray | memoryview


# -- the file ------------------------------------------------------------------------------------


class PteFile:
    """An open ``.pte``: header, extended header and a lazily parsed Program table (:class:`PteProgram`).

    Use :meth:`open` with a path (one read-only mmap) or a bytes-like object.
    """

    def __init__(self, data: memoryview, source: str, *, _mmap: mmap_mod.mmap | None = None) -> None:
        self._mmap = _mmap
        self._data = data
        self.source = source
        self.external: ExternalData | None = None  # .ptd files searched for external tensors (attach_data)
        self.file = Span(data, source)
        self.size = data.nbytes
        self.identifier, self.extended_header = parse_headers(self.file)
        program_size = self.extended_header.program_size if self.extended_header else self.size
        self._fb = Span(data[:program_size], source)

    @classmethod
    def open(cls, source: Source, *, mmap: bool = True) -> PteFile:
        """Open a path (mmapped read-only) or wrap a bytes-like object (no copy).

        Only regular files are opened, and the check never blocks: a FIFO, a
        device, a directory or a socket is a PteFormatError naming the path.

        ``mmap=False`` reads the file into private memory instead (its size in
        RAM, checked against :func:`pyrt.format.limits.available_host_memory` first):
        views of a mapping fault with SIGBUS, which kills the process, when the
        file is truncated while they are in use; private memory cannot.
        """
        if isinstance(source, (bytes, bytearray, memoryview)):
            return cls(byte_view(source), "<bytes>")
        if not isinstance(source, (str, os.PathLike)):
            raise PteFormatError(f"cannot open {source!r}: expected a path or a bytes-like object")
        path = os.fspath(source)
        if not isinstance(path, str):  # os.PathLike returning bytes
            path = os.fsdecode(path)
        mm, view = map_file(path, ".pte file", private=not mmap)
        try:
            return cls(view, path, _mmap=mm)
        except BaseException:
            view.release()
            unmap(mm)
            raise

    # lifetime
    def close(self) -> None:
        """Release the mapping. Views handed out earlier must not be used afterwards."""
        self.__dict__.pop("program", None)
        for span in (self.file, self._fb):
            span.data = memoryview(b"")
            span.length = 0
        self._data.release()
        if self._mmap is not None:
            unmap(self._mmap)
            self._mmap = None

    def __enter__(self) -> PteFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def attach_data(self, data: ExternalData | None) -> None:
        """Resolve external tensors and named data in ``data`` (.ptd files) first, then in this file.

        The caller keeps ``data`` open while views from it are in use and closes it afterwards.
        """
        self.external = data

    # layout
    @property
    def segment_base_offset(self) -> int:
        return self.extended_header.segment_base_offset if self.extended_header else 0

    @cached_property
    def program(self) -> PteProgram:
        return PteProgram(self, Table.root(self._fb, "Program"))

    def segment_view(self, index: int) -> memoryview:
        """Zero-copy view of segment ``index`` (offsets are relative to segment_base_offset)."""
        segs = self.program.segments
        if not 0 <= index < len(segs):
            raise PteFormatError(f"{self.source}: segment index {index} out of range ({len(segs)} segments)")
        if self.extended_header is None:
            raise PteFormatError(f"{self.source}: segment {index} is referenced but the file has no extended header")
        seg = segs[index]
        return self.file.view(f"segment {index}", self.segment_base_offset + seg.offset, seg.size)


# -- the Program table ---------------------------------------------------------------------------


class PteProgram:
    """The file's root ``Program`` table; every field is decoded on first access.

    (Not :class:`pyrt.Program`, which loads a file to run it.)
    """

    def __init__(self, pte: PteFile, table: Table) -> None:
        self.pte = pte
        self._t = table

    @cached_property
    def version(self) -> int:
        return int(self._t.scalar(0, "version", "u32"))

    @cached_property
    def _plans(self) -> Vector | None:
        return self._t.vector(1, "execution_plan", "table")

    def __len__(self) -> int:
        return len(self._plans) if self._plans else 0

    @cached_property
    def execution_plan(self) -> tuple[ExecutionPlan, ...]:
        plans = self._plans
        if plans is None:
            return ()
        return tuple(ExecutionPlan(self, plans.table(i, f"execution_plan[{i}]"), i) for i in range(len(plans)))

    @cached_property
    def method_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.execution_plan)

    def method(self, name: str) -> ExecutionPlan:
        for plan in self.execution_plan:
            if plan.name == name:
                return plan
        raise PteFormatError(f"{self.pte.source}: no method {name!r}; methods are {list(self.method_names)}")

    @cached_property
    def segments(self) -> tuple[DataSegment, ...]:
        vec = self._t.vector(4, "segments", "table")
        return tuple(vec.tables(data_segment)) if vec else ()

    @cached_property
    def constant_segment(self) -> SubsegmentOffsets | None:
        t = self._t.table(5, "constant_segment")
        return subsegment(t) if t else None

    @cached_property
    def mutable_data_segments(self) -> tuple[SubsegmentOffsets, ...]:
        vec = self._t.vector(6, "mutable_data_segments", "table")
        return tuple(vec.tables(lambda t, i: subsegment(t))) if vec else ()

    @cached_property
    def named_data(self) -> tuple[NamedData, ...]:
        vec = self._t.vector(7, "named_data", "table")
        return tuple(vec.tables(named_data)) if vec else ()

    @cached_property
    def _inline_data(self) -> Vector | None:
        return self._t.vector(3, "backend_delegate_data", "table")

    @property
    def num_inline_delegate_data(self) -> int:
        return len(self._inline_data) if self._inline_data else 0

    @cached_property
    def _constant_buffer(self) -> Vector | None:
        return self._t.vector(2, "constant_buffer", "table")

    # data access (zero-copy)
    def delegate_data(self, delegate: BackendDelegate) -> memoryview:
        """The processed blob of ``delegate``: inline data or a whole segment."""
        if delegate.location == DataLocation.SEGMENT:
            return self.pte.segment_view(delegate.index)
        inline = self._inline_data
        n = len(inline) if inline else 0
        if inline is None or not 0 <= delegate.index < n:
            raise PteFormatError(
                f"{self.pte.source}: delegate {delegate.id!r} inline index {delegate.index} out of range ({n} entries)"
            )
        data = inline.table(delegate.index, f"backend_delegate_data[{delegate.index}]").vector(0, "data", "u8")
        return data.raw() if data else memoryview(b"")

    def constant_data(self, tensor: Tensor) -> memoryview:
        """Bytes of a constant tensor (constant segment, legacy constant buffer, or named data)."""
        if tensor.is_external:
            return self.external_data(tensor)
        idx = tensor.data_buffer_idx
        cs = self.constant_segment
        if cs is not None and len(cs.offsets) > 1:
            return self._subsegment_view(cs, idx, tensor, "constant_segment")
        buf = self._constant_buffer
        n = len(buf) if buf else 0
        if buf is None or not 0 < idx < n:
            raise PteFormatError(f"{self.pte.source}: constant data_buffer_idx {idx} out of range ({n} buffers)")
        storage = buf.table(idx, f"constant_buffer[{idx}]").vector(0, "storage", "u8")
        return self._sized(storage.raw() if storage else memoryview(b""), tensor, f"constant_buffer[{idx}]")

    def mutable_data(self, tensor: Tensor) -> memoryview:
        """Initial bytes of a mutable (memory-planned, pre-initialised) tensor."""
        info = tensor.extra_tensor_info
        which = info.mutable_data_segments_idx if info else 0
        segs = self.mutable_data_segments
        if not 0 <= which < len(segs):
            raise PteFormatError(
                f"{self.pte.source}: mutable_data_segments index {which} out of range ({len(segs)} entries)"
            )
        return self._subsegment_view(segs[which], tensor.data_buffer_idx, tensor, f"mutable_data_segments[{which}]")

    def named_data_view(self, key: str) -> memoryview:
        """Bytes of named data ``key``: the attached .ptd files first, then this file's own segments."""
        found = self.pte.external.find(key) if self.pte.external is not None else None
        if found is not None:
            return found[0].view(key)
        for nd in self.named_data:
            if nd.key == key:
                return self.pte.segment_view(nd.segment_index)
        raise PteFormatError(f"{self.pte.source}: named data key {key!r} not found{self._searched()}")

    def external_data(self, tensor: Tensor) -> memoryview:
        """Bytes of an external tensor, checked against the .ptd entry's layout and size (zero-copy)."""
        info = tensor.extra_tensor_info
        key = info.fully_qualified_name if info is not None else None
        what = f"{tensor.scalar_type.name}{list(tensor.sizes)}"
        if not key:
            raise PteFormatError(f"{self.pte.source}: an external tensor ({what}) has no fully_qualified_name")
        found = self.pte.external.find(key) if self.pte.external is not None else None
        if found is None:
            try:
                view = self.named_data_view(key)
            except PteFormatError:
                raise PteFormatError(f"{self.pte.source}: external tensor {key!r} ({what}) not found"
                                     f"{self._searched()}") from None
            return self._sized(view, tensor, f"named data {key!r}")
        ptd, entry = found
        layout = entry.layout
        if layout is not None and (layout.scalar_type, layout.sizes) != (tensor.scalar_type, tensor.sizes):
            raise PteFormatError(f"{ptd.source}: named data {key!r} is {layout.scalar_type.name}"
                                 f"{list(layout.sizes)}, but {self.pte.source} expects {what}")
        if layout is not None and tensor.dim_order and layout.dim_order != tensor.dim_order:
            raise PteFormatError(f"{ptd.source}: named data {key!r} has dim_order {layout.dim_order}, but "
                                 f"{self.pte.source} expects {tensor.dim_order}")
        if entry.size < tensor.nbytes:
            raise PteFormatError(f"{ptd.source}: named data {key!r} holds {entry.size} bytes, but {self.pte.source} "
                                 f"expects {what} ({tensor.nbytes} bytes)")
        return ptd.file.view(f"named data {key!r}", entry.offset, tensor.nbytes)

    def _searched(self) -> str:
        data = self.pte.external
        if data is not None and data.files:
            return f" in {', '.join(data.sources)} or in the program's own named data"
        hint = ""
        if self.pte.source.endswith(".pte") and os.path.exists(self.pte.source[:-4] + ".ptd"):
            hint = f" ({self.pte.source[:-4] + '.ptd'} exists beside it)"
        return f": no data file was given; pass the .ptd file with data=...{hint}"

    def _subsegment_view(self, sub: SubsegmentOffsets, idx: int, tensor: Tensor, what: str) -> memoryview:
        if not 0 <= idx < len(sub.offsets):
            raise PteFormatError(f"{self.pte.source}: {what} buffer index {idx} out of range ({len(sub.offsets)})")
        seg = Span(self.pte.segment_view(sub.segment_index), self.pte.source)
        return seg.view(f"{what}[{idx}] in segment {sub.segment_index}", sub.offsets[idx], tensor.nbytes)

    def _sized(self, view: memoryview, tensor: Tensor, what: str) -> memoryview:
        return Span(view, self.pte.source).view(what, 0, tensor.nbytes)


class ExecutionPlan:
    """One method. Fields decode on first access and are then cached."""

    def __init__(self, program: PteProgram, table: Table, index: int) -> None:
        self.program = program
        self._t = table
        self.index = index

    def __repr__(self) -> str:
        return f"ExecutionPlan({self.name!r})"

    @property
    def _src(self) -> str:
        return f"{self.program.pte.source}: method {self.index}"

    @cached_property
    def name(self) -> str:
        return self._t.string(0, "name") or ""

    @cached_property
    def container_meta_type(self) -> tuple[str, str]:
        t = self._t.table(1, "container_meta_type")
        return ("", "") if t is None else (t.string(0, "encoded_inp_str") or "", t.string(1, "encoded_out_str") or "")

    @cached_property
    def _values(self) -> Vector | None:
        return self._t.vector(2, "values", "table")

    @property
    def num_values(self) -> int:
        return len(self._values) if self._values else 0

    @cached_property
    def values(self) -> tuple[EValue, ...]:
        """Every value, decoded in bulk (:mod:`pyrt.format.values`); the general reader names what is malformed."""
        vec = self._values
        if vec is not None:
            try:
                return _values.decode_values(vec.span.data, vec.span.length, vec.start, vec.n)
            except _values.Fallback:
                pass
        return tuple(self.value(i) for i in range(self.num_values))

    def value(self, index: int) -> EValue:
        """Decode value ``index`` (bounds-checked)."""
        self.check_value_index(index, "value")
        values = cast(Vector, self._values)  # not None: the check found index < num_values
        return decode_evalue(values.table(index, f"values[{index}]"), self.check_value_index)

    def check_value_index(self, index: int, what: str) -> int:
        if not 0 <= index < self.num_values:
            raise PteFormatError(f"{self._src} ({self.name!r}): {what} index {index} out of range "
                                 f"({self.num_values} values)")
        return index

    def _indices(self, slot: int, field: str) -> tuple[int, ...]:
        vec = self._t.vector(slot, field, "i32")
        out = vec.scalars() if vec else ()
        for i in out:
            self.check_value_index(i, field)
        return out

    @cached_property
    def inputs(self) -> tuple[int, ...]:
        return self._indices(3, "inputs")

    @cached_property
    def outputs(self) -> tuple[int, ...]:
        return self._indices(4, "outputs")

    @cached_property
    def chains(self) -> tuple[Chain, ...]:
        vec = self._t.vector(5, "chains", "table")
        return tuple(vec.tables(self._chain)) if vec else ()

    @cached_property
    def operators(self) -> tuple[Operator, ...]:
        vec = self._t.vector(6, "operators", "table")
        if not vec:
            return ()
        try:  # in bulk; the general reader below names what is malformed
            return _values.decode_operators(vec.span.data, vec.span.length, vec.start, vec.n)
        except _values.Fallback:
            pass
        return tuple(Operator(t.string(0, "name") or "", t.string(1, "overload") or "") for t in vec.tables(first))

    @cached_property
    def delegates(self) -> tuple[BackendDelegate, ...]:
        vec = self._t.vector(7, "delegates", "table")
        return tuple(vec.tables(decode_delegate)) if vec else ()

    @cached_property
    def non_const_buffer_sizes(self) -> tuple[int, ...]:
        vec = self._t.vector(8, "non_const_buffer_sizes", "i64")
        sizes = vec.scalars() if vec else ()
        for i, s in enumerate(sizes):
            if s < 0:
                raise PteFormatError(f"{self._src}: non_const_buffer_sizes[{i}] is negative ({s})")
        return sizes

    @cached_property
    def non_const_buffer_device(self) -> tuple[BufferDevice, ...]:
        vec = self._t.vector(9, "non_const_buffer_device", "table")
        return tuple(vec.tables(buffer_device)) if vec else ()

    def buffer_device(self, buffer_idx: int) -> tuple[DeviceType, int]:
        """Device of memory arena ``buffer_idx`` (CPU unless tagged)."""
        for d in self.non_const_buffer_device:
            if d.buffer_idx == buffer_idx:
                return d.device_type, d.device_index
        return DeviceType.CPU, 0

    def _chain(self, t: Table, i: int) -> Chain:
        ins = t.vector(2, "instructions", "table")
        instructions: tuple[Instruction, ...] = ()
        if ins:
            try:  # in bulk; the general reader below names what is malformed
                span = ins.span
                instructions = _values.decode_instructions(span.data, span.length, ins.start, ins.n, self.num_values)
            except _values.Fallback:
                instructions = tuple(ins.tables(self._instruction))
        inputs = t.vector(0, "inputs", "i32")
        outputs = t.vector(1, "outputs", "i32")
        return Chain(inputs.scalars() if inputs else (), outputs.scalars() if outputs else (), instructions)

    def _instruction(self, t: Table, i: int) -> Instruction:
        return decode_instruction(t, i, self.check_value_index, self._src)


def iter_delegate_blobs(pte: PteFile) -> Iterator[tuple[ExecutionPlan, int, BackendDelegate, memoryview]]:
    """Every delegate of every method with its blob view."""
    for plan in pte.program.execution_plan:
        for i, d in enumerate(plan.delegates):
            yield plan, i, d, pte.program.delegate_data(d)


__all__: Sequence[str] = [
    "PteFile", "PteProgram", "ExecutionPlan", "EValue", "Tensor", "BackendDelegate", "CompileSpec",
    "KernelCall", "DelegateCall", "MoveCall", "JumpFalseCall", "FreeCall", "Chain", "Operator",
    "DataSegment", "SubsegmentOffsets", "NamedData", "AllocationInfo", "ExtraTensorInfo",
    "ShapeDynamism", "DeviceType", "DataLocation", "TensorDataLocation", "iter_delegate_blobs",
]

# pyrt.pte_reader.Program, the name before PteProgram, still imports (with a DeprecationWarning).
__getattr__ = renamed(__name__, {"Program": "PteProgram"}, globals(), note=" (pyrt.Program loads a file to run it)")
