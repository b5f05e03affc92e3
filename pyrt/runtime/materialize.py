"""Phase 2's memory for a method's load plan: arenas, the initial object of every value, slots.

Memory-planned arenas are allocated once (host arenas on the host, CUDA-tagged arenas in
device memory), tensors become views into them, constants become read-only views of the
mmap, mutable buffers get their initial bytes, and each value is classified *constant*
(one object for the method's life: kernels capture it) or *slot* (rebound at run time:
read through the table).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from pyrt.errors import PteFormatError
from pyrt.format.limits import allocating
from pyrt.format.schema import Payload, ValueKind
from pyrt.format.schema import Tensor as TensorDecl
from pyrt.memory.host import NumpyHost, TorchHost
from pyrt.memory.layout import Constant
from pyrt.memory.table import CONSTANT, PLANNED, UNPLANNED, TensorInfo, ValueTable
from pyrt.memory.tensors import DeviceTensor, Value
from pyrt.pte_reader import ExecutionPlan
from pyrt.runtime.load_plan import SCALAR_KINDS, where


def allocate_arenas(plan: ExecutionPlan, host: NumpyHost | TorchHost, devices: dict[int, int],
                    cuda: Any) -> tuple[dict[int, Any], list[Any]]:
    """Host arenas (zeroed) and device arenas (through pyrt.cuda), once per method."""
    arenas: dict[int, Any] = {}
    device_allocs: list[Any] = []
    for mem, size in enumerate(plan.non_const_buffer_sizes):
        if mem == 0:
            continue
        if mem in devices:
            alloc = cuda.alloc(int(size), devices[mem])
            device_allocs.append(alloc)
            arenas[mem] = alloc
        else:
            with allocating(f"{where(plan)}: host arena {mem} ({size} bytes, non_const_buffer_sizes[{mem}])"):
                arenas[mem] = host.arena(int(size))
    return arenas, device_allocs


def materialize(plan: ExecutionPlan, host: NumpyHost | TorchHost, kinds: list[ValueKind],
                items: dict[int, tuple[int, ...]], raw: list[Payload], infos: dict[int, TensorInfo],
                arenas: dict[int, Any]) -> list[Value]:
    """Initial Python object of every value."""
    program = plan.program
    vals: list[Value] = [None] * len(kinds)
    for i, kind in enumerate(kinds):
        if kind in SCALAR_KINDS or kind == "String":
            vals[i] = cast(Value, raw[i])
        elif kind in ("DoubleList", "BoolList"):
            vals[i] = list(cast(tuple[float, ...] | tuple[bool, ...], raw[i]))
    windows: dict[int, list[TensorInfo]] = {}  # host arena -> its planned tensors, viewed in bulk below
    constants: list[TensorInfo] = []
    data: list[Constant] = []
    for i, info in infos.items():
        decl = cast(TensorDecl, raw[i])
        if info.storage == PLANNED and info.device is None and not decl.is_external and decl.data_buffer_idx <= 0:
            windows.setdefault(info.memory_id, []).append(info)
        elif info.storage == CONSTANT:
            constants.append(info)
            data.append((program.constant_data(decl), info.scalar_type, info.sizes, info.dim_order))
        elif info.storage == UNPLANNED:
            vals[i] = None  # bound per run (inputs) or allocated by the plan (see bind_unplanned)
        elif info.device is not None:
            vals[i] = dev = DeviceTensor(arenas[info.memory_id], info.offset, info.scalar_type, info.sizes,
                                         info.capacity, info.dim_order)
            if decl.data_buffer_idx > 0:  # a mutable buffer kept in device memory (a KV cache)
                _initialize_device(dev, program.mutable_data(decl))
        else:
            vals[i] = host.view(arenas[info.memory_id], info.offset, info.scalar_type, info.sizes, info.dim_order)
            if decl.is_external:  # mutable buffer whose initial value is named data (a .ptd)
                _initialize(vals[i], program.external_data(decl), host)
            elif decl.data_buffer_idx > 0:  # mutable buffer with an initial value in the file
                _initialize(vals[i], program.mutable_data(decl), host)
    with allocating(f"{where(plan)}: {len(constants)} constant tensors"):
        made = host.constants(data)
    for info, const in zip(constants, made, strict=True):
        vals[info.index] = const
    for mem, group in windows.items():
        views = host.views(arenas[mem], [(info.offset, info.scalar_type, info.sizes, info.dim_order) for info in group])
        for info, view in zip(group, views, strict=True):
            vals[info.index] = view
    for i, it in items.items():
        vals[i] = [None if j < 0 else vals[j] for j in it]
    return vals


def _initialize(view: Any, data: memoryview, host: NumpyHost | TorchHost) -> None:
    import numpy as np

    dst = host.to_numpy(view)
    src = np.frombuffer(data, dtype=np.uint8)
    if dst.flags.c_contiguous:
        dst.reshape(-1).view(np.uint8)[:] = src
    else:  # a non-default dim order: bytes are in memory order
        base = np.lib.stride_tricks.as_strided(dst, (dst.size,), (dst.itemsize,))
        base.view(np.uint8)[:] = src


def _initialize_device(tensor: DeviceTensor, data: memoryview) -> None:
    """Upload a device-resident mutable buffer's initial bytes (once, at load)."""
    import numpy as np

    src = np.frombuffer(data, dtype=np.uint8)
    if src.nbytes != tensor.nbytes:
        raise PteFormatError(f"mutable buffer of {tensor.nbytes} bytes has {src.nbytes} bytes of initial data")
    if src.nbytes:
        tensor.allocation._cuda.memcpy_htod(tensor.allocation, src, dst_offset=tensor.offset)  # its own seam


def classify(table: ValueTable, rebound: set[int], inputs: Sequence[int]) -> None:
    """Mark slot values: rebound ones, unplanned inputs, numpy-dynamic tensors, lists over slots."""
    unstable = set(rebound)
    for i, info in table.infos.items():
        if info.storage == UNPLANNED and i in inputs:
            unstable.add(i)
        elif info.dynamic and info.device is None and isinstance(table.host, NumpyHost) and info.storage != CONSTANT:
            unstable.add(i)
    for i, it in table.items.items():
        if any(j in unstable for j in it if j >= 0):
            unstable.add(i)
    table.unstable = unstable


def bind_unplanned(table: ValueTable, inputs: Sequence[int]) -> None:
    """Unplanned tensors that are not inputs (e.g. outputs when alloc_graph_output=False): own buffers."""
    for i, info in table.infos.items():
        if info.storage == UNPLANNED and i not in inputs and i not in table.unstable:
            with allocating(f"method {table.method!r}: unplanned tensor value {i} ({info.nbytes} bytes, sizes "
                            f"{list(info.sizes)}, {info.scalar_type.name})"):
                table.vals[i] = table.host.empty(info.scalar_type, info.sizes, info.dim_order)
    for i, it in table.items.items():  # constant lists now see those buffers
        if i not in table.unstable:
            table.vals[i] = [None if j < 0 else table.vals[j] for j in it]


__all__ = ["allocate_arenas", "bind_unplanned", "classify", "materialize"]
