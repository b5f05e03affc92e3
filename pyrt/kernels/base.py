"""What a kernel is: :class:`Kernel`, the per-instruction :class:`KernelSite`, step markers.

A *library* maps an operator (``aten::add`` overload ``out``) to a
:class:`Kernel`. A kernel says which value slots it rebinds at run time (so
the plan knows which arguments it may capture as constants) and builds one
zero-argument *step* closure per instruction, with its arguments resolved
through a :class:`KernelSite`.

>>> step = shape_only(noop, reads=(1,), rebinds=(2,))
>>> step.shape_only
ShapeOnly(reads=(1,), rebinds=(2,), tensor=-1)
"""


from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from pyrt.errors import InputError, PteFormatError, PyrtError
from pyrt.memory.tensors import Value

if TYPE_CHECKING:
    from pyrt.memory.table import TensorInfo, ValueTable
    from pyrt.pte_reader import Operator

Step = Callable[[], object]  # its result, if any, is ignored


@dataclass(frozen=True)
class Kernel:
    """A resolved operator.

    ``rebinds(args)`` lists the value indices the step stores new objects into
    (scalar results, views); ``writes(args)`` the arguments whose memory it may
    write in place (out tensors, ``self`` of in-place ops; None: any argument).
    Both pick arguments by position: which positions may depend on ``len(args)``, never
    on the value indices themselves (:mod:`pyrt.runtime.fold` works them out once per operator).
    The plan refuses a file whose kernel writes constant data (read-only file
    memory). ``build(site)`` returns the step closure for one instruction.
    ``pure``: the result depends only on the arguments and nothing else changes (no
    random numbers, no side effects), so a call on constant data may run once at load
    (:mod:`pyrt.runtime.fold`). ``view(vals, args)``: for a ``*_copy`` op whose result torch can
    also give as a view of its input (``permute_copy`` -> ``permute``), that view (a list for
    ``split_copy`` and the like), computed from the load-time values; :mod:`pyrt.runtime.fold` uses it
    where the input's bytes provably outlive the result. ``strided``: the kernel reads its
    tensor arguments by their logical values whatever their strides (torch's out-variants,
    copies), so :mod:`pyrt.runtime.fold` may hand it a strided view where the file planned a
    contiguous tensor; False for kernels that reinterpret bytes (``et_view``, ``as_strided_copy``).
    """

    name: str
    build: Callable[[KernelSite], Step]
    rebinds: Callable[[tuple[int, ...]], Sequence[int]] = lambda args: ()
    needs_library: bool = True  # False: runs without torch or numpy kernels (prims, copies)
    writes: Callable[[tuple[int, ...]], Sequence[int]] | None = None
    pure: bool = False
    view: Callable[[list[Value], tuple[int, ...]], Any] | None = None  # Any: a torch view, or a list of them
    strided: bool = False


RANDOM_OPS = frozenset({"aten::native_dropout", "aten::rand", "aten::randn", "aten::bernoulli",
                        "aten::normal", "aten::uniform", "aten::randint", "aten::randperm",
                        "aten::multinomial", "aten::dropout", "aten::rrelu_with_noise"})  # never folded


DATA_DEPENDENT_OPS = frozenset({  # output shapes (or scalars) that depend on tensor data, not on shapes
    "aten::nonzero", "aten::masked_select", "aten::index", "aten::repeat_interleave", "aten::_local_scalar_dense",
    "aten::unique", "aten::_unique2", "aten::unique_consecutive", "aten::unique_dim", "aten::allclose",
    "executorch_prim::et_copy_index"})


@dataclass(frozen=True)
class ShapeOnly:
    """A step whose results follow from tensor shapes and the scalars it ``reads``: sym_size, et_view, prim math.

    Run again with the same shapes and the same ``reads``, it rebinds ``rebinds`` to what they
    already hold (see :mod:`pyrt.runtime.steady`). ``tensor``: the tensor whose object (not only its
    shape) the result depends on (et_view's view), or -1.
    """

    reads: tuple[int, ...]
    rebinds: tuple[int, ...]
    tensor: int = -1


def shape_only(step: Step, reads: Sequence[int], rebinds: Sequence[int], tensor: int = -1) -> Step:
    """Mark ``step`` as :class:`ShapeOnly`; returns it."""
    step.shape_only = ShapeOnly(tuple(reads), tuple(rebinds), tensor)  # type: ignore[attr-defined]
    return step


def noop() -> None:
    """The step of an instruction with nothing to do at run time (the executor skips it)."""
    return None


def with_steady(step: Step, steady: Step) -> Step:
    """Attach the variant of ``step`` to run when every shape equals the previous run's (no resizing).

    It replaces any earlier one, including a ``steady_if(stable)`` choice (see
    :func:`pyrt.kernels.torch_kernels._rebinding`): :mod:`pyrt.runtime.fold` marks per-key calls this way.
    """
    step.steady = steady  # type: ignore[attr-defined]
    if getattr(step, "steady_if", None) is not None:
        del step.steady_if  # type: ignore[attr-defined]
    return step


class KernelLibrary(Protocol):
    name: str

    def lookup(self, op: Operator) -> Kernel | None: ...


@dataclass(slots=True)
class KernelSite:
    """One instruction's view of the value table while its step is built.

    ``unread``: tensors the call writes that nothing reads afterwards (no instruction,
    no output, no alias over their bytes, see :meth:`pyrt.runtime.fold.Folder.unread`); a kernel
    may leave them unwritten.
    """

    method: str
    instruction: int
    operator: str
    args: tuple[int, ...]
    table: ValueTable
    unread: frozenset[int] = frozenset()

    @property
    def where(self) -> str:
        return f"method {self.method!r} instruction {self.instruction} ({self.operator})"

    def require_args(self, n: int) -> None:
        """PteFormatError unless the instruction has at least ``n`` arguments."""
        if len(self.args) < n:
            raise PteFormatError(f"{self.where}: expects at least {n} arguments, the file gives {len(self.args)}")

    def is_const(self, k: int) -> bool:
        return self.table.is_const(self.args[k])

    def value(self, k: int) -> Any:
        """The load-time value of argument ``k`` (only meaningful when :meth:`is_const`).

        Any (like :meth:`getter`'s values): a :data:`~pyrt.memory.tensors.Value` whose kind the operator's
        schema fixes (a tensor, an int, an int list...), which each kernel knows and mypy cannot.
        """
        return self.table.vals[self.args[k]]

    def getter(self, k: int) -> Callable[[], Any]:
        return self.table.getter(self.args[k])

    def kind(self, k: int) -> str:
        return self.table.kinds[self.args[k]]

    def info(self, k: int) -> TensorInfo | None:
        return self.table.infos.get(self.args[k])

    def setter(self, k: int) -> Callable[[Value], None]:
        vals, i = self.table.vals, self.args[k]

        def store(v: Value) -> None:
            vals[i] = v

        return store

    def error(self, exc: BaseException) -> PyrtError:
        if isinstance(exc, PyrtError):
            return exc
        return InputError(f"{self.where} failed: {type(exc).__name__}: {exc}")
