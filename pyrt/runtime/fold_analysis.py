"""Fold's analysis of one method's chain: what may be folded, kept per key, or made a view.

:class:`ChainAnalysis` works out once, in one pass over the chain and one over the
tensors, who writes and reads each value (list items included), the arena bytes of
planned tensors and the instructions writing them, the aliases over them, what is pinned
and what is constant; then answers the questions :class:`pyrt.runtime.fold.Folder` asks per
kernel call (may this value be written here, do these bytes outlive that read, may this
value be a strided view). It computes views only to compare layouts, and binds nothing: the
rewriting is :mod:`pyrt.runtime.fold`'s.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Iterable
from typing import Any, NamedTuple

from pyrt.format.schema import DelegateCall, JumpFalseCall, KernelCall, MoveCall
from pyrt.kernels.base import DATA_DEPENDENT_OPS, Kernel
from pyrt.memory.host import TorchHost
from pyrt.pte_reader import ExecutionPlan

CONST_SCALARS = ("Null", "Int", "Double", "Bool", "String", "DoubleList", "BoolList")
LISTS = ("IntList", "TensorList", "OptionalTensorList")
INF = float("inf")
_CONST_SCALARS = frozenset(CONST_SCALARS)


class _Scan(NamedTuple):
    """One pass over the chain (see :meth:`ChainAnalysis._scan_chain`)."""

    read_items: dict[int, list[int]]  # pc -> what the instruction reads, list items included
    read_vals: list[int]  # every read of a kernel call, in chain order, with its pc
    read_pcs: list[int]
    write_vals: list[int]  # every write of a kernel call, in chain order, with its pc
    write_pcs: list[int]
    others: list[tuple[int, list[int]]]  # (pc, values) a move or a delegate writes


class ChainAnalysis:
    """The facts of one method's chain that folding decides by (built once; see the module)."""

    def __init__(self, xplan: ExecutionPlan, table: Any, kernels: list[Kernel], raw: list[Any]) -> None:
        self.table = table
        self.enabled = len(xplan.chains) == 1 and not any(
            isinstance(ins, JumpFalseCall) for ins in xplan.chains[0].instructions)
        self.base: dict[int, int] = {}  # value turned into a view -> the value whose bytes it views
        self.private: set[int] = set()  # tensors moved to private memory (folded or per-key)
        self.relocate: set[int] = set()
        self.keyed = False
        if not self.enabled:  # every call runs as the file says: nothing to work out
            return
        instrs = xplan.chains[0].instructions
        self._index_lists(table.items)
        pinned: set[int] = set(xplan.inputs)  # values folding must never touch
        scan = self._scan_chain(instrs, kernels, pinned)
        self._index_readers(scan.read_items, instrs, kernels, xplan.outputs)
        write_pc = self._order(xplan, scan, len(instrs))
        bounds, aliases, constants = self._scan_tensors(raw, write_pc, pinned)
        # tensor -> the aliases that read exactly its bytes while it holds them (rebound with it, see Folder._follow)
        self.alias_of: dict[int, list[int]] = {}
        self.alias_src: dict[int, int] = {}  # alias -> the tensor whose bytes it reads
        if aliases:
            self._pair_aliases(xplan, scan, write_pc, bounds, aliases, pinned)
        self.pinned = pinned
        self._index_spans(scan.others, bounds)
        self.keyed = self._is_keyed(xplan, kernels, instrs, scan.others)
        writers = self.writers
        self.const: set[int] = {i for i, k in enumerate(table.kinds)
                                if k in _CONST_SCALARS and i not in writers and i not in pinned}
        self.const.update(i for i in constants if i not in pinned and i not in writers)
        self.key_const = set(self.const)  # data that follows from the run's input shapes (keyed methods)
        self.write_pc = write_pc  # value -> its first writer's pc (inputs: -1)

    def _index_lists(self, items: dict[int, Any]) -> None:
        """``lists``: list -> itself and its items; ``holders``: value -> the lists holding it."""
        self.lists = {i: (i, *[j for j in it if j >= 0]) for i, it in items.items()}  # list -> it and its items
        self.holders: dict[int, list[int]] = {}  # value -> the lists holding it
        for i, it in items.items():
            for j in it:
                self.holders.setdefault(j, []).append(i)

    def _scan_chain(self, instrs: Any, kernels: list[Kernel], pinned: set[int]) -> _Scan:
        """One pass over the chain; per kernel call, worked out once: what it writes or
        rebinds (``outs``), those with list items, each once (``written``), the arguments
        it only reads (``reads``); per instruction, what it reads, list items included
        (``read_items``). Moves and delegates pin what they touch."""
        lists = self.lists
        self.outs = outs = dict[int, list[int]]()
        self.written = all_written = dict[int, list[int]]()
        self.reads = all_reads = dict[int, list[int]]()
        scan = _Scan({}, [], [], [], [], [])
        read_items, others = scan.read_items, scan.others
        positions: dict[tuple[int, int], tuple[int, ...]] = {}  # (operator, arity) -> what its calls write
        for pc, ins in enumerate(instrs):
            if isinstance(ins, KernelCall):
                args = ins.args
                key = (ins.op_index, len(args))
                if (at := positions.get(key)) is None:  # once per operator and arity
                    at = positions[key] = tuple(_outputs(kernels[ins.op_index], tuple(range(len(args)))))
                out = [args[k] for k in at]
                if len(out) > 1:
                    out = list(dict.fromkeys(out))
                outs[pc] = out
                reads = all_reads[pc] = [a for a in args if a not in out]
                if lists and not lists.keys().isdisjoint(args):
                    written = list(dict.fromkeys(expand(out, lists)))  # each value once per call
                    reads = expand(reads, lists)
                else:
                    written = out
                all_written[pc] = written
                read_items[pc] = reads
                scan.write_vals.extend(written)
                scan.write_pcs.extend([pc] * len(written))
                scan.read_vals.extend(reads)
                scan.read_pcs.extend([pc] * len(reads))
            elif isinstance(ins, MoveCall):
                pinned.update(expand((ins.move_from, ins.move_to), lists))
                others.append((pc, [ins.move_to]))
                read_items[pc] = expand((ins.move_from,), lists)
            elif isinstance(ins, DelegateCall):
                delegated = expand(ins.args, lists)
                pinned.update(delegated)
                others.append((pc, delegated))
                read_items[pc] = delegated
        return scan

    def _index_readers(self, read_items: dict[int, list[int]], instrs: Any, kernels: list[Kernel],
                       outputs: Any) -> None:
        """``readers`` of each value, ``et_view_of`` each et_view result, the ``strided_pcs``, the ``outputs``."""
        self.readers: dict[int, list[int]] = {}  # value -> the instructions reading it (list items included)
        for pc, values in read_items.items():
            for j in values:
                self.readers.setdefault(j, []).append(pc)
        self.et_view_of = {ins.args[2]: ins.args[0] for ins in instrs  # et_view result -> the tensor it views
                           if isinstance(ins, KernelCall) and len(ins.args) == 3
                           and kernels[ins.op_index].name == "executorch_prim::et_view.default"}
        self.strided_pcs = {pc for pc, ins in enumerate(instrs)
                            if isinstance(ins, KernelCall) and kernels[ins.op_index].strided}
        self.outputs = set(expand(outputs, self.lists))

    def _order(self, xplan: ExecutionPlan, scan: _Scan, end: int) -> dict[int, int]:
        """``writers`` (value -> how many kernel calls write it), ``first_read`` and ``last_read`` (outputs:
        read at ``end``, by the copy-out after the chain); returns value -> its first writer's pc."""
        write_vals, write_pcs, read_vals, read_pcs = scan.write_vals, scan.write_pcs, scan.read_vals, scan.read_pcs
        self.writers = dict(Counter(write_vals))  # value -> how many kernel calls write it
        write_pc = dict(zip(reversed(write_vals), reversed(write_pcs), strict=True))  # value -> its first writer's pc
        write_pc.update(dict.fromkeys(xplan.inputs, -1))  # inputs: written before pc 0
        self.first_read = dict(zip(reversed(read_vals), reversed(read_pcs), strict=True))
        self.last_read = last_read = dict(zip(read_vals, read_pcs, strict=True))
        last_read.update(dict.fromkeys(expand(xplan.outputs, self.lists), end))  # read by the copy-out after the chain
        return write_pc

    def _scan_tensors(self, raw: list[Any], write_pc: dict[int, int],
                      pinned: set[int]) -> tuple[dict[int, tuple[int, int, int]], set[int], list[int]]:
        """One pass over the tensors: dynamic ones (``dynamic``), pinned ones (buffers, device tensors,
        added to ``pinned``); returns (planned tensor -> (arena, lo, hi), aliases, constants)."""
        infos = self.table.infos
        self.dynamic: set[int] = set()
        bounds: dict[int, tuple[int, int, int]] = {}  # planned tensor -> (arena, lo, hi)
        aliases: set[int] = set()  # host planned tensors no kernel call writes (see _aliased)
        constants: list[int] = []
        for i, info in infos.items():
            if info.dynamic:
                self.dynamic.add(i)
            storage = info.storage
            if storage == "constant":
                constants.append(i)
            elif raw[i].data_buffer_idx > 0 or raw[i].is_external:  # mutable buffer
                pinned.add(i)
            if info.device is not None:
                pinned.add(i)
            if storage == "planned":
                lo = info.offset
                bounds[i] = (info.memory_id, lo, lo + math.prod(info.sizes) * info.scalar_type.itemsize)
                if info.device is None and i not in write_pc:
                    aliases.add(i)
        return bounds, aliases, constants

    def _pair_aliases(self, xplan: ExecutionPlan, scan: _Scan, write_pc: dict[int, int],
                      bounds: dict[int, tuple[int, int, int]], aliases: set[int], pinned: set[int]) -> None:
        """The tensors ``aliases`` read (:func:`_aliased`): kept in place (``pinned``), or, for an alias
        over exactly one tensor's bytes that may follow it (:meth:`_rebindable`), ``alias_of``/``alias_src``."""
        infos, lists, writers = self.table.infos, self.lists, self.writers
        end = len(xplan.chains[0].instructions)
        writes = {i: at for i, at in write_pc.items() if i in bounds and infos[i].device is None}
        for pc, values in scan.others:  # moves and delegates write arena bytes too (their values are pinned)
            for j in values:
                if j in bounds and infos[j].device is None:
                    writes.setdefault(j, pc)
        held, exact = _aliased(aliases, bounds, scan.read_items, end, expand(xplan.outputs, lists), writes)
        pinned.update(held)
        for a, t in exact.items():
            if self._rebindable(a, t, pinned, writers, xplan.outputs):
                self.alias_of.setdefault(t, []).append(a)
                self.alias_src[a] = t
            else:
                pinned.add(t)

    def _index_spans(self, others: list[tuple[int, list[int]]], bounds: dict[int, tuple[int, int, int]]) -> None:
        """``spans``: arena -> (pc, lo, hi) of every write to it, by pc."""
        self.spans: dict[int, list[tuple[int, int, int]]] = {}  # arena -> (pc, lo, hi) of writes, by pc
        for pc, values in sorted([*self.written.items(), *others]):
            for j in values:
                if (b := bounds.get(j)) is not None:
                    self.spans.setdefault(b[0], []).append((pc, b[1], b[2]))

    def _is_keyed(self, xplan: ExecutionPlan, kernels: list[Kernel], instrs: Any,
                  others: list[tuple[int, list[int]]]) -> bool:
        """Per-key calls apply: torch host, a dynamic input, no move or delegate, no data-dependent op."""
        table, infos = self.table, self.table.infos
        return (isinstance(table.host, TorchHost)
                and any(infos[i].dynamic for i in xplan.inputs if i in infos)
                and not others
                and not {kernels[ins.op_index].name.partition(".")[0] for ins in instrs
                         if isinstance(ins, KernelCall)} & DATA_DEPENDENT_OPS)


    def unread(self, pc: int) -> frozenset[int]:
        """Tensors the kernel call at ``pc`` writes that nothing reads: no instruction, no output,
        no alias over their bytes, no input, buffer or device tensor (empty when folding is off)."""
        if not self.enabled or pc not in self.written:
            return frozenset()
        infos = self.table.infos
        return frozenset(j for j in self.written[pc]
                         if j in infos and infos[j].storage == "planned" and infos[j].device is None
                         and j not in self.readers and j not in self.outputs and j not in self.pinned
                         and j not in self.alias_of and j not in self.alias_src)

    def _shape_view_results(self, pc: int, dtype: Any) -> list[int] | None:
        """The tensors the ``*_copy`` call at ``pc`` writes, if :meth:`Folder.shape_view` may make them views of
        a ``dtype`` tensor: each written only there and unread before, a dynamic tensor of that dtype
        (never a static one: load-time views of it would see old bytes), one object every run, read
        only by kernels taking strided tensors, no alias over its bytes; else None."""
        table = self.table
        written = expand(self.outs[pc], self.lists)
        tensors = list(dict.fromkeys(j for j in written if j in table.infos))
        if not tensors or not all(self._free(j, pc, dynamic=True) for j in written):
            return None
        if not all(table.infos[j].dynamic and table.infos[j].scalar_type is dtype and table.is_const(j)
                   and self._strided_ok(j) and not self.alias_of.get(j) for j in tensors):
            return None
        return tensors

    def _fixed_root(self, x: int) -> int | None:
        """The tensor whose bytes ``x`` shows at the same place in every run with the same shapes: ``x``
        itself when its slot always holds one object over planned, constant or private memory, else
        through ``et_view`` results (reshapes of such a tensor, the view's only writer); None otherwise."""
        table = self.table
        for _ in range(len(table.kinds)):
            info = table.infos.get(x)
            if info is None or info.device is not None:
                return None
            if table.is_const(x):
                return x if info.storage in ("planned", "constant") or x in self.private else None
            viewed = self.et_view_of.get(x)
            if viewed is None or self.writers.get(x) != 1:
                return None
            x = viewed
        return None

    def _viewed(self, x: int) -> int:
        """The tensor a view-able call's first argument names: itself, or the one item of a list
        nothing rebinds (``cat`` of one tensor)."""
        items = self.table.items.get(x)
        if items is not None and len(items) == 1 and items[0] >= 0 and x not in self.writers and x not in self.pinned:
            return items[0]
        return x

    def _first_read(self, t: int) -> int:
        """The first instruction reading ``t``, directly or through its aliases (-1: none)."""
        return min((self.first_read[v] for v in (t, *self.alias_of.get(t, ())) if v in self.first_read), default=-1)

    def _layouts_fit(self, views: list[Any], tensors: list[int]) -> bool:
        """May ``views`` stand for the planned ``tensors``: same dtype and shape, and the same
        strides (or both contiguous) unless every reader takes strided tensors (:meth:`_strided_ok`)."""
        vals = self.table.vals
        return len(views) == len(tensors) and all(
            same_layout(v, vals[j]) or (_same_values(v, vals[j]) and self._strided_ok(j))
            for v, j in zip(views, tensors, strict=True))

    def _strided_ok(self, j: int) -> bool:
        """Can value ``j`` be a strided view: read only by kernel calls that read values whatever
        the strides (``Kernel.strided``; never a delegate, a move, ``et_view`` or an output, which
        must stay planned contiguous tensors), itself and every list holding it."""
        for v in (j, *self.holders.get(j, ())):
            if v in self.outputs or v in self.pinned:
                return False
            if not all(pc in self.strided_pcs for pc in self.readers.get(v, ())):
                return False
        return True

    def _rebindable(self, a: int, t: int, pinned: set[int], writers: dict[int, int], outputs: Any) -> bool:
        """Can alias ``a`` (a static ``view_copy`` over exactly ``t``'s bytes) follow ``t`` into private
        memory or a view: torch host, both static contiguous host tensors of one dtype, ``t`` written
        by one kernel call, ``a`` no input, output, buffer or delegate/move argument."""
        infos = self.table.infos
        ia, it = infos[a], infos[t]
        return (isinstance(self.table.host, TorchHost) and a not in pinned and t not in pinned
                and writers.get(t) == 1 and a not in outputs and t not in outputs
                and not ia.dynamic and not it.dynamic and ia.scalar_type == it.scalar_type
                and ia.dim_order == tuple(range(len(ia.sizes))) and it.dim_order == tuple(range(len(it.sizes))))


    def _outlives(self, base: int, pc: int, until: int) -> bool:
        """Do ``base``'s bytes stay unwritten after ``pc`` up to ``until`` (inclusive)?"""
        if base in self.const or base in self.private:
            return True  # never written again
        info = self.table.infos[base]
        if info.storage != "planned":
            return False
        mem, lo, hi = info.memory_id, info.offset, info.offset + info.nbytes
        spans = self.spans.get(mem, [])
        for k in range(bisect.bisect_right(spans, (pc, INF, INF)), len(spans)):  # writes are listed in pc order
            at, a, b = spans[k]
            if at > until:
                break
            if a < hi and b > lo:
                return False
        return True

    def _all(self, values: list[int] | tuple[int, ...], known: set[int]) -> bool:
        """Are all ``values`` in ``known`` (a list by its items, when nothing rebinds the list)?"""
        items = self.table.items
        for i in values:
            if i in known:
                continue
            if i in items and i not in self.writers and i not in self.pinned:
                if all(j in known for j in items[i] if j >= 0):
                    continue
            return False
        return True


    def _static_host(self, j: int) -> bool:
        """Is ``j`` a host tensor whose shape never changes (nothing resizes it)?"""
        info = self.table.infos.get(j)
        return info is not None and not info.dynamic and info.device is None and j not in self.pinned

    def _free(self, j: int, pc: int, dynamic: bool = False) -> bool:
        """May folding write value ``j`` at ``pc``: its only writer, unread before, no input or buffer."""
        if (j in self.dynamic and not dynamic) or j in self.pinned:
            return False
        if self.writers.get(j, 0) != 1 or self.first_read.get(j, pc + 1) <= pc:
            return False
        info = self.table.infos.get(j)
        kind = self.table.kinds[j]
        if info is None:  # a rebound scalar result, or a list whose items are checked one by one
            return kind in ("Int", "Double", "Bool", *LISTS)
        return kind == "Tensor" and info.storage != "constant"



def _aliased(aliases: set[int], bounds: dict[int, tuple[int, int, int]], reads: dict[int, list[int]],
             end: int, outputs: list[int], writes: dict[int, int]) -> tuple[set[int], dict[int, int]]:
    """Planned tensors whose bytes an alias reads: a tensor value no instruction writes.

    A static ``view_copy`` becomes such an alias (a second tensor value over the same
    bytes, no instruction). Moving the tensor it views to private memory would leave
    the alias reading stale arena bytes, so each tensor written before a read of an
    alias and overlapping it is kept, back to the last write that covers the alias.
    Returns (tensors kept, alias -> tensor) where an alias reads, every time, the bytes
    of one tensor with exactly its bounds: those are left to the caller, who may move the
    alias along with the tensor instead (:meth:`pyrt.runtime.fold.Folder._follow`).
    ``aliases``: host planned tensors no kernel call writes; ``bounds``: planned tensor ->
    (arena, lo, hi); ``reads``: pc -> the values the instruction reads (list items
    included); ``outputs``: the method's outputs, read at ``end``; ``writes``: host planned
    tensor -> pc of its (first) writer, inputs count as written before pc 0.
    """
    found: list[tuple[int, int]] = []  # (alias, pc of a read)
    for pc, read in reads.items():
        if not aliases.isdisjoint(read):
            found.extend((j, pc) for j in read if j in aliases)
    found.extend((j, end) for j in outputs if j in aliases)
    by_arena: dict[int, list[tuple[int, int, int, int]]] = {}  # arena -> (write pc, lo, hi, value), by pc
    for i, at in writes.items():
        mem, lo, hi = bounds[i]
        by_arena.setdefault(mem, []).append((at, lo, hi, i))
    for spans in by_arena.values():
        spans.sort()
    out: set[int] = set()
    sources: dict[int, set[int]] = {}  # alias -> the tensors its reads see
    mixed: set[int] = set()  # aliases some read of which sees more than one tensor, or part of one
    for a, pc in dict.fromkeys(found):
        mem, lo, hi = bounds[a]
        spans = by_arena.get(mem, [])
        seen = sources.setdefault(a, set())
        for k in range(bisect.bisect_left(spans, (pc, -1, -1, -1)) - 1, -1, -1):  # latest write first
            _, t_lo, t_hi, t = spans[k]
            if t_lo < hi and t_hi > lo:
                seen.add(t)
                if (t_lo, t_hi) != (lo, hi):
                    mixed.add(a)
                if t_lo <= lo and t_hi >= hi:
                    break  # this write covers every byte the alias reads
        else:
            mixed.add(a)  # bytes nothing wrote before the read
    exact: dict[int, int] = {}
    for a, seen in sources.items():
        if a in mixed or len(seen) != 1:
            out.update(seen)
        else:
            exact[a] = next(iter(seen))
    return out, exact


def same_layout(view: Any, planned: Any) -> bool:
    """Would kernels see ``view`` laid out as the planned tensor (shape, dtype, strides)?"""
    if view.dtype != planned.dtype or view.shape != planned.shape:
        return False
    return view.stride() == planned.stride() or (view.is_contiguous() and planned.is_contiguous())


def _same_values(view: Any, planned: Any) -> bool:
    """Do ``view`` and the planned tensor hold values of the same dtype and shape (strides aside)?"""
    return view.dtype == planned.dtype and view.shape == planned.shape



def _outputs(kernel: Kernel, args: tuple[int, ...]) -> list[int]:
    """Values a call writes or rebinds (None writes: every argument)."""
    written = args if kernel.writes is None else kernel.writes(args)
    return list(dict.fromkeys([*written, *kernel.rebinds(args)]))


def expand(values: Iterable[int], lists: dict[int, tuple[int, ...]]) -> list[int]:
    """Values plus the items of the lists among them (``lists``: list -> itself and its items, see ``lists``)."""
    out: list[int] = []
    for v in values:
        found = lists.get(v)
        if found is None:
            out.append(v)
        else:
            out.extend(found)
    return out



__all__ = ["CONST_SCALARS", "LISTS", "ChainAnalysis", "expand", "same_layout"]
