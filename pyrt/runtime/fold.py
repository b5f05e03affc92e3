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

import functools
from collections.abc import Callable
from typing import Any

from pyrt.errors import InputError
from pyrt.format.limits import allocating
from pyrt.format.schema import KernelCall
from pyrt.kernels.base import Kernel, Step, noop, with_steady
from pyrt.memory.host import TorchHost
from pyrt.memory.tensors import Value
from pyrt.pte_reader import ExecutionPlan
from pyrt.runtime.fold_analysis import ChainAnalysis, expand, same_layout

MAX_FOLDED_BYTES = 64 << 20  # private memory one method's folded results may take
SHAPE_READ_OPS = frozenset({"aten::full_like.out"})  # read their first argument's shape and dtype only


class Folder(ChainAnalysis):
    """The folding of one method (built once, asked per kernel call in chain order): runs folded
    calls, binds views and moves tensors to private memory, deciding by its :class:`ChainAnalysis`."""

    def __init__(self, xplan: ExecutionPlan, table: Any, kernels: list[Kernel], raw: list[Any]) -> None:
        self.budget = MAX_FOLDED_BYTES
        super().__init__(xplan, table, kernels, raw)
        if self.enabled:
            self.relocate = self._relocations(xplan, kernels, self.write_pc)

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
        written = expand(out, self.lists)
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
            for j in expand(outs, self.lists):
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
            written = expand(outs, self.lists)
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
            if not (same_layout(v, self.table.vals[a]) or self._strided_ok(a)):
                return None
            found.append((a, v))
        if commit:
            for a, v in found:
                self.table.vals[a] = v
                self.base[a] = self.base.get(t, t)
            if found:
                self._relist([a for a, _ in found])
        return found


    def _writes(self, kernel: Kernel, args: tuple[int, ...]) -> list[int]:
        """The tensors a call writes (list items included)."""
        writes = kernel.writes(args) if kernel.writes is not None else args
        return [j for j in expand(writes, self.lists) if j in self.table.infos]

    def _private(self, tensors: list[int]) -> int:
        """Give ``tensors`` private memory (within the budget): bytes taken, -1 if over."""
        tensors = [j for j in dict.fromkeys(tensors) if j not in self.private]
        size = sum(self.table.infos[j].nbytes for j in tensors)
        if size > self.budget:
            return -1
        vals, host = self.table.vals, self.table.host
        for j in tensors:
            info = self.table.infos[j]
            with allocating(f"method {self.table.method!r}: load-time folding, private memory for value {j} "
                            f"({info.nbytes} bytes)"):
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


    def _relist(self, changed: list[int]) -> None:
        """Lists holding a changed value see its object now; lists over stable items become stable."""
        table = self.table
        for i in dict.fromkeys(i for j in changed for i in self.holders.get(j, ())):
            it = table.items[i]
            if i in table.unstable and i not in self.writers and not any(j in table.unstable for j in it if j >= 0):
                table.unstable.discard(i)
            if i not in table.unstable:
                table.vals[i] = [None if j < 0 else table.vals[j] for j in it]



def vals_restore(vals: list[Value], saved: dict[int, Value]) -> None:
    for j, v in saved.items():
        vals[j] = v




__all__ = ["Folder", "MAX_FOLDED_BYTES"]
