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

* *per-key* calls (dynamic-shape methods, see :mod:`pyrt.runtime.steady`): pure calls on data
  that follows from the input shapes alone (``arange(seq_len)``, a causal mask) write
  private memory and are skipped by runs whose shapes repeat the last run's;
* *views*: a ``*_copy`` call (``Kernel.view``; ``cat`` of one tensor and dim-order
  copies too) whose input's bytes provably stay unwritten until the result's last read
  binds, once, torch's view of the input in place of the copy, where the view has the
  planned result's layout (shape, dtype, strides), or where every reader of the result
  takes strided tensors by value (``Kernel.strided``: torch out-variants and copies; no
  output, delegate, move or byte reinterpretation such as ``et_view``). An input whose
  arena bytes are reused too early gets private memory first (:meth:`Folder._relocations`).
  A static ``view_copy`` alias (a second tensor over exactly the same arena bytes, no
  instruction) follows its tensor into private memory or a view (:meth:`Folder._follow`)
  instead of pinning it;
* *shape views* (per-key methods): a ``*_copy`` call on a dynamic tensor, under the same
  conditions with shapes aside (readers take strided tensors, dynamic results, the
  input's bytes at a fixed place: planned memory, directly or through ``et_view``),
  makes its results views of the input at run time (``Tensor.set_`` on the objects the
  readers hold); runs whose shapes repeat the last run's skip it (:meth:`Folder.shape_view`).

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

from pyrt.errors import InputError
from pyrt.format.schema import DelegateCall, JumpFalseCall, KernelCall, MoveCall
from pyrt.kernels.base import DATA_DEPENDENT_OPS, Kernel, Step, noop, with_steady
from pyrt.memory.host import TorchHost
from pyrt.memory.tensors import Value
from pyrt.pte_reader import ExecutionPlan

MAX_FOLDED_BYTES = 64 << 20  # private memory one method's folded results may take
CONST_SCALARS = ("Null", "Int", "Double", "Bool", "String", "DoubleList", "BoolList")
LISTS = ("IntList", "TensorList", "OptionalTensorList")
INF = float("inf")
_CONST_SCALARS = frozenset(CONST_SCALARS)
SHAPE_READ_OPS = frozenset({"aten::full_like.out"})  # read their first argument's shape and dtype only


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
        self.readers: dict[int, list[int]] = {}  # value -> the instructions reading it (list items included)
        for pc, values in read_items.items():
            for j in values:
                self.readers.setdefault(j, []).append(pc)
        self.et_view_of = {ins.args[2]: ins.args[0] for ins in instrs  # et_view result -> the tensor it views
                           if isinstance(ins, KernelCall) and len(ins.args) == 3
                           and kernels[ins.op_index].name == "executorch_prim::et_view.default"}
        self.strided_pcs = {pc for pc, ins in enumerate(instrs)
                            if isinstance(ins, KernelCall) and kernels[ins.op_index].strided}
        self.outputs = set(_expand(xplan.outputs, lists))
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
        # tensor -> the aliases that read exactly its bytes while it holds them (rebound with it, see _follow)
        self.alias_of: dict[int, list[int]] = {}
        self.alias_src: dict[int, int] = {}  # alias -> the tensor whose bytes it reads
        if aliases:
            writes = {i: at for i, at in write_pc.items() if i in bounds and infos[i].device is None}
            for pc, values in others:  # moves and delegates write arena bytes too (their values are pinned)
                for j in values:
                    if j in bounds and infos[j].device is None:
                        writes.setdefault(j, pc)
            held, exact = _aliased(aliases, bounds, read_items, end, _expand(xplan.outputs, lists), writes)
            pinned.update(held)
            for a, t in exact.items():
                if self._rebindable(a, t, pinned, writers, xplan.outputs):
                    self.alias_of.setdefault(t, []).append(a)
                    self.alias_src[a] = t
                else:
                    pinned.add(t)
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

        Views bound at load also give :func:`noop`. In a keyed method (see :mod:`pyrt.runtime.steady`),
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
        if kernel.view is not None and self.keyed and (viewing := self.shape_view(pc, args, kernel)) is not None:
            return viewing
        if not self.keyed or not pure or kernel.writes is None:  # (writes: narrowed for mypy)
            return build()
        if not kernel.writes(args):  # shape-only prims and scalar-returning calls
            step = build()
            marks = getattr(step, "shape_only", None)
            if marks is not None and self._all(marks.reads, self.key_const) and (
                    marks.tensor < 0 or marks.tensor in self.key_const):
                self.key_const.update(marks.rebinds)
            return step
        reads = self.reads[pc]
        if kernel.name in SHAPE_READ_OPS and args and (first := self.table.infos.get(args[0])) is not None \
                and first.device is None:
            reads = [a for a in reads if a != args[0]]  # its shape follows from the input shapes here
        if not self._all(reads, self.key_const):
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
        x = self._viewed(args[0])
        info = table.infos.get(x)
        if (not out or x in out or info is None or info.dynamic or info.device is not None or not table.is_const(x)
                or not self._all([a for a in args[1:] if a not in out], self.const)):
            return False
        written = _expand(out, self.lists)
        tensors = list(dict.fromkeys(j for j in written if j in table.infos))  # split_copy: out and return list
        if not tensors or not all(self._free(j, pc) for j in written):
            return False
        base = self.base.get(x, x)
        until = max(self.last_read.get(v, pc) for j in tensors for v in (j, *self.alias_of.get(j, ())))
        if not self._outlives(base, pc, until):  # the results and the aliases following them
            return False
        try:
            view = kernel.view(table.vals, args)
        except Exception:  # left to the kernel (and its error) at run time
            return False
        views = list(view) if isinstance(view, (list, tuple)) else [view]
        if not self._layouts_fit(views, tensors):
            return False
        if any(self._follow(j, v, commit=False) is None for v, j in zip(views, tensors, strict=True)):
            return False
        for v, j in zip(views, tensors, strict=True):
            table.vals[j] = v
            self.base[j] = base
            self._follow(j, v)
        table.unstable.difference_update(written)
        self._relist(written)
        return True

    def shape_view(self, pc: int, args: tuple[int, ...], kernel: Kernel) -> Step | None:
        """In a keyed method (see :mod:`pyrt.runtime.steady`), a ``*_copy`` call on a dynamic tensor as a step that
        makes the planned results views of the input (``Tensor.set_``), skipped by steady runs; None when
        it may not.

        Same conditions as :meth:`as_view`, shapes aside: results read only by kernels that take strided
        tensors (:meth:`_strided_ok`), written by no other instruction, no aliases over their bytes; the
        input is the same tensor object every run, its bytes unwritten until the results' last read;
        the other arguments follow from the input shapes. A run with the last run's shapes would
        compute the same views over the same bytes, so its steady variant is :func:`noop`.
        """
        table = self.table
        out, x = self.outs[pc], self._viewed(args[0])
        info = table.infos.get(x)
        if (not out or x in out or info is None or not info.dynamic or info.device is not None
                or not self._all([a for a in args[1:] if a not in out], self.key_const)):
            return None
        root = self._fixed_root(x)
        tensors = None if root is None else self._shape_view_results(pc, info.scalar_type)
        if root is None or tensors is None:
            return None
        base = self.base.get(root, root)
        if not self._outlives(base, pc, max(self.last_read.get(j, pc) for j in tensors)):
            return None
        results = [table.vals[j] for j in tensors]  # the objects every reader holds: they become the views
        caps = [table.infos[j].capacity for j in tensors]
        view, where = kernel.view, f"method {table.method!r}, instruction {pc}"
        assert view is not None  # (narrowed for mypy)
        getters = [table.getter(a) for a in args]  # lists of sym sizes are rebuilt from their items per run
        positions = tuple(range(len(args)))

        def shape_view() -> None:
            found = view([g() for g in getters], positions)
            views = found if isinstance(found, (list, tuple)) else (found,)
            if len(views) != len(results):
                raise InputError(f"{where}: {len(views)} views for {len(results)} results")
            for t, v, cap in zip(results, views, caps, strict=True):
                if v.numel() > cap:
                    raise InputError(f"{where}: output of shape {tuple(v.shape)} exceeds its memory-planned "
                                     f"bound of {cap} elements")
                t.set_(v)

        for j in tensors:
            self.base[j] = base
        if x in self.key_const:  # a view of per-key data is per-key data too (positions.unsqueeze(0)...)
            self.key_const.update(tensors)
        return with_steady(shape_view, noop)

    def _shape_view_results(self, pc: int, dtype: Any) -> list[int] | None:
        """The tensors the ``*_copy`` call at ``pc`` writes, if :meth:`shape_view` may make them views of
        a ``dtype`` tensor: each written only there and unread before, a dynamic tensor of that dtype
        (never a static one: load-time views of it would see old bytes), one object every run, read
        only by kernels taking strided tensors, no alias over its bytes; else None."""
        table = self.table
        written = _expand(self.outs[pc], self.lists)
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
            x = self._viewed(ins.args[0])
            outs = self.outs[pc]
            for j in _expand(outs, self.lists):
                viewed[j] = x
            while True:  # the tensor whose bytes a chain of views (and aliases) would read
                if x in viewed and viewed[x] in table.infos and not table.infos[viewed[x]].dynamic:
                    x = viewed[x]
                elif x in self.alias_src:
                    x = self.alias_src[x]
                else:
                    break
            info = table.infos.get(x)
            if (info is None or info.storage != "planned" or info.dynamic or x in self.pinned
                    or self.writers.get(x) != 1 or not 0 <= write_pc.get(x, -1) < self._first_read(x)
                    or not table.is_const(x) or not self._all([a for a in ins.args[1:] if a not in outs], self.const)):
                continue
            written = _expand(outs, self.lists)
            tensors = list(dict.fromkeys(j for j in written if j in table.infos))
            if not tensors or not all(self._free(j, pc) for j in written):
                continue
            until = max(self.last_read.get(v, pc) for j in tensors for v in (j, *self.alias_of.get(j, ())))
            if self._outlives(x, pc, until):
                continue  # a view needs no move
            try:
                view = view_of(table.vals, ins.args)
            except Exception:  # left to the kernel at run time
                continue
            views = list(view) if isinstance(view, (list, tuple)) else [view]
            if self._layouts_fit(views, tensors):
                out.add(x)
        if self.keyed:
            out.update(self._shape_relocations(xplan, kernels, write_pc))
        return out

    def _shape_relocations(self, xplan: ExecutionPlan, kernels: list[Kernel], write_pc: dict[int, int]) -> set[int]:
        """The same for :meth:`shape_view`: dynamic tensors (seen directly or through ``et_view``
        results) whose arena bytes are reused while a view of them would live."""
        table, out = self.table, set[int]()
        for pc, ins in enumerate(xplan.chains[0].instructions):
            if not isinstance(ins, KernelCall) or kernels[ins.op_index].view is None or not ins.args:
                continue
            x = self._fixed_root(ins.args[0])
            if x is None:
                continue
            info = table.infos[x]
            if (info.storage != "planned" or not info.dynamic or x in self.pinned or self.writers.get(x) != 1
                    or not 0 <= write_pc.get(x, -1) < self._first_read(x)
                    or x in self.outs[pc]):
                continue
            tensors = self._shape_view_results(pc, info.scalar_type)
            if tensors is None:
                continue
            if not self._outlives(x, pc, max(self.last_read.get(j, pc) for j in tensors)):
                out.add(x)
        return out

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
            _same_layout(v, vals[j]) or (_same_values(v, vals[j]) and self._strided_ok(j))
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

    def _follow(self, t: int, value: Any, commit: bool = True) -> list[tuple[int, Any]] | None:
        """(alias, its new value) for each alias of ``t`` when ``t`` becomes ``value``; None when one
        cannot follow (its shape is no view of ``value``, or strided where a reader needs bytes).
        ``commit``: bind them now."""
        found = []
        for a in self.alias_of.get(t, ()):
            try:
                v = value.view(self.table.infos[a].sizes)
            except RuntimeError:
                return None
            if not (_same_layout(v, self.table.vals[a]) or self._strided_ok(a)):
                return None
            found.append((a, v))
        if commit:
            for a, v in found:
                self.table.vals[a] = v
                self.base[a] = self.base.get(t, t)
            if found:
                self._relist([a for a, _ in found])
        return found

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
            if j in self.alias_of:  # contiguous private memory: each alias is a contiguous view of it
                self._follow(j, vals[j])
        self.private.update(tensors)
        self.budget -= size
        self._relist(tensors)
        return size

    def fold(self, pc: int, args: tuple[int, ...], kernel: Kernel, build: Callable[[], Step]) -> bool:
        """Run the call at ``pc`` now if it folds (``build`` makes its step); True when it did."""
        if not self.enabled or not kernel.pure or kernel.writes is None:
            return False
        reads = self.reads[pc]
        if kernel.name in SHAPE_READ_OPS and args and self._static_host(args[0]):
            reads = [a for a in reads if a != args[0]]  # only its (static) shape and dtype are read
        if not self.outs[pc] or not self._all(reads, self.const):
            return False
        written = self.written[pc]
        if not all(self._free(j, pc) for j in written):
            return False
        followers = [a for j in written for a in self.alias_of.get(j, ())]
        vals, budget, private = self.table.vals, self.budget, set(self.private)
        saved = {j: vals[j] for j in (*written, *followers)}
        if any(j in self.dynamic for j in written) or self._private(self._writes(kernel, args)) < 0:
            return False
        try:
            build()()
        except Exception:  # left to run (and raise, with its instruction named) at run time
            vals_restore(vals, saved)
            self._relist([*written, *followers])
            self.budget, self.private = budget, private
            for a in followers:
                self.base.pop(a, None)
            return False
        self.const.update(written)
        self.key_const.update(written)  # constant data also follows from the shapes (per-key calls may read it)
        self.table.unstable.difference_update(written)
        self._relist(written)
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
             end: int, outputs: list[int], writes: dict[int, int]) -> tuple[set[int], dict[int, int]]:
    """Planned tensors whose bytes an alias reads: a tensor value no instruction writes.

    A static ``view_copy`` becomes such an alias (a second tensor value over the same
    bytes, no instruction). Moving the tensor it views to private memory would leave
    the alias reading stale arena bytes, so each tensor written before a read of an
    alias and overlapping it is kept, back to the last write that covers the alias.
    Returns (tensors kept, alias -> tensor) where an alias reads, every time, the bytes
    of one tensor with exactly its bounds: those are left to the caller, who may move the
    alias along with the tensor instead (:meth:`Folder._follow`).
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


def _same_layout(view: Any, planned: Any) -> bool:
    """Would kernels see ``view`` laid out as the planned tensor (shape, dtype, strides)?"""
    if view.dtype != planned.dtype or view.shape != planned.shape:
        return False
    return view.stride() == planned.stride() or (view.is_contiguous() and planned.is_contiguous())


def _same_values(view: Any, planned: Any) -> bool:
    """Do ``view`` and the planned tensor hold values of the same dtype and shape (strides aside)?"""
    return view.dtype == planned.dtype and view.shape == planned.shape


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
