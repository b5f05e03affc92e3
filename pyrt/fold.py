"""Load-time work on a method's kernel calls: constant folding, per-shape results, views.

ExecuTorch programs recompute things that never change from run to run: the
transposes of linear weights (``permute_copy`` of a constant), rotary tables,
causal masks of a static length. A kernel call is *folded* when

* its kernel is pure (``Kernel.pure``: no random numbers, no side effects);
* every argument it reads holds constant data: a constant tensor from the file, a
  scalar or list nothing rebinds (and no method input), or an earlier folded result;
* every value it writes or rebinds has this instruction as its only writer, is read by
  no earlier instruction, moved by no MoveCall, read by no delegate, read through no
  arena alias (a static ``view_copy`` is a second tensor over the same bytes), and (for
  tensors) is a static host tensor that is neither a method input nor a mutable buffer.

A folded call runs once while the method's steps are built, writing into private
memory (``host.empty``), never into the memory-planned arena (other values reuse
that memory later in the chain), and its instruction becomes a no-op. Its results
then count as constants, so chains of them fold too. The same kernels compute the
same bytes as at run time; a call that raises is left to raise at run time.

Two relatives, torch host only:

* *per-key* calls (dynamic-shape methods, see :mod:`pyrt.steady`): pure calls on data
  that follows from the input shapes alone (``arange(seq_len)``, a causal mask) write
  private memory and are skipped by runs whose shapes repeat the last run's;
* *views*: a ``*_copy`` call (``Kernel.view``) whose input's bytes provably stay
  unwritten until the result's last read binds, once, torch's view of the input in
  place of the copy, where the view has the planned result's layout (shape, dtype,
  strides), so every later kernel sees the same bytes laid out the same way. An input
  whose arena bytes are reused too early gets private memory first (:meth:`Folder._relocations`).

Methods with jumps or more than one chain are left alone. Private memory is capped per
method (:data:`MAX_FOLDED_BYTES`); past the cap, calls run as the file says.

>>> folder = Folder(xplan, table, kernels, raw)                       # doctest: +SKIP
>>> folder.step(pc, ins.args, kernels[ins.op_index], build) is noop    # doctest: +SKIP
True
"""

from __future__ import annotations

import bisect
import functools
import math
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from pyrt.kernels import DATA_DEPENDENT_OPS, Kernel, Step, noop, with_steady
from pyrt.pte_reader import ExecutionPlan
from pyrt.schema import DelegateCall, JumpFalseCall, KernelCall, MoveCall
from pyrt.tensors import TorchHost, Value

MAX_FOLDED_BYTES = 64 << 20  # private memory one method's folded results may take
CONST_SCALARS = ("Null", "Int", "Double", "Bool", "String", "DoubleList", "BoolList")
LISTS = ("IntList", "TensorList", "OptionalTensorList")
INF = float("inf")
_CONST_SCALARS = frozenset(CONST_SCALARS)


class Folder:
    """The folding analysis of one method (built once, asked per kernel call in chain order)."""

    def __init__(self, xplan: ExecutionPlan, table: Any, kernels: list[Kernel], raw: list[Any]) -> None:
        self.table = table
        self.budget = MAX_FOLDED_BYTES
        self.enabled = len(xplan.chains) == 1 and not any(
            isinstance(ins, JumpFalseCall) for ins in xplan.chains[0].instructions)
        self.base: dict[int, int] = {}  # value turned into a view -> the value whose bytes it views
        self.private: set[int] = set()  # tensors moved to private memory (folded or per-key)
        self.relocate: set[int] = set()
        self.keyed = False
        if not self.enabled:  # every call runs as the file says: nothing to work out
            return
        items, infos = table.items, table.infos
        self.lists = lists = {i: (i, *[j for j in it if j >= 0]) for i, it in items.items()}  # list -> it and its items
        self.holders: dict[int, list[int]] = {}  # value -> the lists holding it
        for i, it in items.items():
            for j in it:
                self.holders.setdefault(j, []).append(i)
        # One pass over the chain; per kernel call, worked out once: what it writes or
        # rebinds (``outs``), those with list items, each once (``written``), the arguments
        # it only reads (``reads``); per instruction, what it reads, list items included
        # (``read_items``).
        instrs = xplan.chains[0].instructions
        self.outs = outs = dict[int, list[int]]()
        self.written = all_written = dict[int, list[int]]()
        self.reads = all_reads = dict[int, list[int]]()
        read_items: dict[int, list[int]] = {}
        read_vals: list[int] = []  # every read of a kernel call, in chain order, with its pc
        read_pcs: list[int] = []
        write_vals: list[int] = []  # every write of a kernel call, in chain order, with its pc
        write_pcs: list[int] = []
        pinned: set[int] = set(xplan.inputs)  # values folding must never touch
        others: list[tuple[int, list[int]]] = []  # (pc, values) a move or a delegate writes
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
                    written = list(dict.fromkeys(_expand(out, lists)))  # each value once per call
                    reads = _expand(reads, lists)
                else:
                    written = out
                all_written[pc] = written
                read_items[pc] = reads
                write_vals += written
                write_pcs += [pc] * len(written)
                read_vals += reads
                read_pcs += [pc] * len(reads)
            elif isinstance(ins, MoveCall):
                pinned.update(_expand((ins.move_from, ins.move_to), lists))
                others.append((pc, [ins.move_to]))
                read_items[pc] = _expand((ins.move_from,), lists)
            elif isinstance(ins, DelegateCall):
                delegated = _expand(ins.args, lists)
                pinned.update(delegated)
                others.append((pc, delegated))
                read_items[pc] = delegated
        writers = dict(Counter(write_vals))  # value -> how many kernel calls write it
        write_pc = dict(zip(reversed(write_vals), reversed(write_pcs), strict=True))  # value -> its first writer's pc
        write_pc.update(dict.fromkeys(xplan.inputs, -1))  # inputs: written before pc 0
        first_read = dict(zip(reversed(read_vals), reversed(read_pcs), strict=True))
        last_read = dict(zip(read_vals, read_pcs, strict=True))
        end = len(instrs)
        last_read.update(dict.fromkeys(_expand(xplan.outputs, lists), end))  # read by the copy-out after the chain
        # One pass over the tensors: dynamic ones, pinned ones, arena bytes, constants.
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
        if aliases:
            pinned.update(_aliased(aliases, bounds, read_items, end, _expand(xplan.outputs, lists),
                                   {i: at for i, at in write_pc.items() if i in bounds and infos[i].device is None}))
        self.writers, self.first_read, self.pinned = writers, first_read, pinned
        self.last_read = last_read
        self.spans: dict[int, list[tuple[int, int, int]]] = {}  # arena -> (pc, lo, hi) of writes, by pc
        for pc, values in sorted([*all_written.items(), *others]):
            for j in values:
                if (b := bounds.get(j)) is not None:
                    self.spans.setdefault(b[0], []).append((pc, b[1], b[2]))
        self.keyed = (isinstance(table.host, TorchHost)
                      and any(infos[i].dynamic for i in xplan.inputs if i in infos)
                      and not others
                      and not {kernels[ins.op_index].name.partition(".")[0] for ins in instrs
                               if isinstance(ins, KernelCall)} & DATA_DEPENDENT_OPS)
        self.const: set[int] = {i for i, k in enumerate(table.kinds)
                                if k in _CONST_SCALARS and i not in writers and i not in pinned}
        self.const.update(i for i in constants if i not in pinned and i not in writers)
        self.key_const = set(self.const)  # data that follows from the run's input shapes (keyed methods)
        self.relocate = self._relocations(xplan, kernels, write_pc)

    def step(self, pc: int, args: tuple[int, ...], kernel: Kernel, build: Callable[[], Step]) -> Step:
        """The step of the kernel call at ``pc``: :func:`noop` when it folded, else ``build()``'s.

        Views bound at load also give :func:`noop`. In a keyed method (see :mod:`pyrt.steady`),
        a pure call on data that follows from the input shapes writes private memory and gets
        ``noop`` as its steady variant (steady runs skip it).
        """
        if not self.enabled:  # jumps or several chains: every call runs as the file says
            return build()
        pure = kernel.pure and kernel.writes is not None
        if pure and self.fold(pc, args, kernel, build):
            return noop
        if self.relocate:
            moved = [j for j in self.written[pc] if j in self.relocate]
            if moved:
                self._private(moved)
        if kernel.view is not None and self.as_view(pc, args, kernel):
            return noop
        if not self.keyed or not pure or kernel.writes is None:  # (writes: narrowed for mypy)
            return build()
        if not kernel.writes(args):  # shape-only prims and scalar-returning calls
            step = build()
            marks = getattr(step, "shape_only", None)
            if marks is not None and self._all(marks.reads, self.key_const) and (
                    marks.tensor < 0 or marks.tensor in self.key_const):
                self.key_const.update(marks.rebinds)
            return step
        if not self._all(self.reads[pc], self.key_const):
            return build()
        written = self.written[pc]
        if not all(self._free(j, pc, dynamic=True) for j in written):
            return build()
        size = self._private(self._writes(kernel, args))
        if size < 0:
            return build()
        step = build()
        self.key_const.update(written)
        try:
            return with_steady(step, noop)
        except AttributeError:  # a callable without attributes (a builtin): wrapped
            return with_steady(functools.partial(step), noop)

    def as_view(self, pc: int, args: tuple[int, ...], kernel: Kernel) -> bool:
        """Bind a ``*_copy`` call's results, once, as views of its input; True when it did.

        Only where the views are laid out as the planned results are (same shape, dtype and
        strides, or both contiguous: downstream kernels see the same layout) and no write to
        the input's bytes comes before the results' last read.
        """
        table = self.table
        if kernel.view is None or not self.enabled or not isinstance(table.host, TorchHost) or not args:
            return False
        out = self.outs[pc]
        x = args[0]
        info = table.infos.get(x)
        if (not out or x in out or info is None or info.dynamic or info.device is not None or not table.is_const(x)
                or not self._all([a for a in args[1:] if a not in out], self.const)):
            return False
        written = _expand(out, self.lists)
        tensors = [j for j in written if j in table.infos]
        if not tensors or not all(self._free(j, pc) for j in written):
            return False
        base = self.base.get(x, x)
        if not self._outlives(base, pc, max(self.last_read.get(j, pc) for j in tensors)):
            return False
        try:
            view = kernel.view(table.vals, args)
        except Exception:  # left to the kernel (and its error) at run time
            return False
        views = list(view) if isinstance(view, (list, tuple)) else [view]
        outs = [j for j in written if j in table.infos]
        if len(views) != len(outs) or not all(_same_layout(v, table.vals[j]) for v, j in zip(views, outs, strict=True)):
            return False
        for v, j in zip(views, outs, strict=True):
            table.vals[j] = v
            self.base[j] = base
        table.unstable.difference_update(written)
        self._relist(written)
        return True

    def _relocations(self, xplan: ExecutionPlan, kernels: list[Kernel], write_pc: dict[int, int]) -> set[int]:
        """Inputs of view-able ``*_copy`` calls whose arena bytes are reused while the result lives.

        Given private memory when their writer's step is built, they outlive the result,
        which can then be a view of them (:meth:`as_view`).
        """
        table, out = self.table, set[int]()
        if not isinstance(table.host, TorchHost):
            return out
        viewed: dict[int, int] = {}  # result of a view-able call -> its input
        for pc, ins in enumerate(xplan.chains[0].instructions):
            if not isinstance(ins, KernelCall):
                continue
            kernel = kernels[ins.op_index]
            view_of = kernel.view
            if view_of is None or not ins.args:
                continue
            x = ins.args[0]
            outs = self.outs[pc]
            for j in _expand(outs, self.lists):
                viewed[j] = x
            while x in viewed and viewed[x] in table.infos and not table.infos[viewed[x]].dynamic:
                x = viewed[x]  # the tensor whose bytes a chain of views would read
            info = table.infos.get(x)
            if (info is None or info.storage != "planned" or info.dynamic or x in self.pinned
                    or self.writers.get(x) != 1 or not 0 <= write_pc.get(x, -1) < self.first_read.get(x, -1)
                    or not table.is_const(x) or not self._all([a for a in ins.args[1:] if a not in outs], self.const)):
                continue
            written = _expand(outs, self.lists)
            tensors = [j for j in written if j in table.infos]
            if not tensors or not all(self._free(j, pc) for j in written):
                continue
            if self._outlives(x, pc, max(self.last_read.get(j, pc) for j in tensors)):
                continue  # a view needs no move
            try:
                view = view_of(table.vals, ins.args)
            except Exception:  # left to the kernel at run time
                continue
            views = list(view) if isinstance(view, (list, tuple)) else [view]
            if len(views) == len(tensors) and all(
                    _same_layout(v, table.vals[j]) for v, j in zip(views, tensors, strict=True)):
                out.add(x)
        return out

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

    def _writes(self, kernel: Kernel, args: tuple[int, ...]) -> list[int]:
        """The tensors a call writes (list items included)."""
        writes = kernel.writes(args) if kernel.writes is not None else args
        return [j for j in _expand(writes, self.lists) if j in self.table.infos]

    def _private(self, tensors: list[int]) -> int:
        """Give ``tensors`` private memory (within the budget): bytes taken, -1 if over."""
        tensors = [j for j in dict.fromkeys(tensors) if j not in self.private]
        size = sum(self.table.infos[j].nbytes for j in tensors)
        if size > self.budget:
            return -1
        vals, host = self.table.vals, self.table.host
        for j in tensors:
            info = self.table.infos[j]
            vals[j] = host.empty(info.scalar_type, info.sizes, info.dim_order)
        self.private.update(tensors)
        self.budget -= size
        self._relist(tensors)
        return size

    def fold(self, pc: int, args: tuple[int, ...], kernel: Kernel, build: Callable[[], Step]) -> bool:
        """Run the call at ``pc`` now if it folds (``build`` makes its step); True when it did."""
        if not self.enabled or not kernel.pure or kernel.writes is None:
            return False
        if not self.outs[pc] or not self._all(self.reads[pc], self.const):
            return False
        written = self.written[pc]
        if not all(self._free(j, pc) for j in written):
            return False
        vals, saved, budget = self.table.vals, {j: self.table.vals[j] for j in written}, self.budget
        if any(j in self.dynamic for j in written) or self._private(self._writes(kernel, args)) < 0:
            return False
        try:
            build()()
        except Exception:  # left to run (and raise, with its instruction named) at run time
            vals_restore(vals, saved)
            self._relist(written)
            self.budget = budget
            return False
        self.const.update(written)
        self.table.unstable.difference_update(written)
        self._relist(written)
        return True

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

    def _relist(self, changed: list[int]) -> None:
        """Lists holding a changed value see its object now; lists over stable items become stable."""
        table = self.table
        for i in dict.fromkeys(i for j in changed for i in self.holders.get(j, ())):
            it = table.items[i]
            if i in table.unstable and i not in self.writers and not any(j in table.unstable for j in it if j >= 0):
                table.unstable.discard(i)
            if i not in table.unstable:
                table.vals[i] = [None if j < 0 else table.vals[j] for j in it]


def _aliased(aliases: set[int], bounds: dict[int, tuple[int, int, int]], reads: dict[int, list[int]],
             end: int, outputs: list[int], writes: dict[int, int]) -> set[int]:
    """Planned tensors whose bytes an alias reads: a tensor value no instruction writes.

    A static ``view_copy`` becomes such an alias (a second tensor value over the same
    bytes, no instruction). Moving the tensor it views to private memory would leave
    the alias reading stale arena bytes, so each tensor written before a read of an
    alias and overlapping it is kept, back to the last write that covers the alias.
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
    for a, pc in dict.fromkeys(found):
        mem, lo, hi = bounds[a]
        spans = by_arena.get(mem, [])
        for k in range(bisect.bisect_left(spans, (pc, -1, -1, -1)) - 1, -1, -1):  # latest write first
            _, t_lo, t_hi, t = spans[k]
            if t_lo < hi and t_hi > lo:
                out.add(t)
                if t_lo <= lo and t_hi >= hi:
                    break  # this write covers every byte the alias reads
    return out


def _same_layout(view: Any, planned: Any) -> bool:
    """Would kernels see ``view`` laid out as the planned tensor (shape, dtype, strides)?"""
    if view.dtype != planned.dtype or view.shape != planned.shape:
        return False
    return view.stride() == planned.stride() or (view.is_contiguous() and planned.is_contiguous())


def vals_restore(vals: list[Value], saved: dict[int, Value]) -> None:
    for j, v in saved.items():
        vals[j] = v


def _outputs(kernel: Kernel, args: tuple[int, ...]) -> list[int]:
    """Values a call writes or rebinds (None writes: every argument)."""
    written = args if kernel.writes is None else kernel.writes(args)
    return list(dict.fromkeys([*written, *kernel.rebinds(args)]))


def _expand(values: Iterable[int], lists: dict[int, tuple[int, ...]]) -> list[int]:
    """Values plus the items of the lists among them (``lists``: list -> itself and its items, see ``Folder.lists``)."""
    out: list[int] = []
    for v in values:
        found = lists.get(v)
        if found is None:
            out.append(v)
        else:
            out.extend(found)
    return out


__all__ = ["Folder", "MAX_FOLDED_BYTES"]
