"""Kernel registry: operators resolved by name and overload at load time.

A *library* maps an operator (``aten::add`` overload ``out``) to a
:class:`Kernel`. A kernel says which value slots it rebinds at run time (so
the plan knows which arguments it may capture as constants) and builds one
zero-argument *step* closure per instruction, with its arguments resolved
through a :class:`KernelSite`. Libraries, in lookup order:

* ``prim`` (:mod:`pyrt.kernels.prim_kernels`): ExecuTorch's scalar ``executorch_prim``
  ops, ``et_view``, the dim-order ops, ``aten::copy_`` and the ``et_copy`` device copies;
  it needs neither torch nor a numpy kernel;
* ``torch`` (:mod:`pyrt.kernels.torch_kernels`): allowed ATen ops through ``torch.ops``;
* ``numpy`` (:mod:`pyrt.kernels.numpy_kernels`): a core set for machines without torch.

A ``.pte`` is untrusted input, and ``torch.ops`` also holds operators with side
effects (``aten::from_file`` maps any file, shared and writable). So, whichever
library runs them, only the operators ExecuTorch's own runtime defines are
resolved: :func:`allowed_operators`, read from ``allowed_ops.txt`` (generated
from the executorch package by ``scripts/gen_allowed_ops.py``) plus pyrt's
documented additions in ``extra_ops.txt``. Any other operator, and an allowed
one no library implements, is reported at load time with
:class:`~pyrt.errors.UnsupportedOperatorError` naming it and the method.

>>> from pyrt.pte_reader import Operator
>>> lib = library("numpy")
>>> lib.lookup(Operator("aten::add", "out")) is not None
True
>>> resolve("forward", [Operator("aten::from_file", "")], [lib])
Traceback (most recent call last):
...
pyrt.errors.UnsupportedOperatorError: method 'forward' uses operators ExecuTorch's runtime does not define, \
which pyrt refuses to run (see pyrt/kernels/allowed_ops.txt): aten::from_file
>>> resolve("forward", [Operator("aten::_pdist_forward", "out")], [lib])
Traceback (most recent call last):
...
pyrt.errors.UnsupportedOperatorError: method 'forward' uses operators no kernel library (numpy) \
supports: aten::_pdist_forward.out
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from pyrt.errors import InputError, PyrtError, UnsupportedOperatorError
from pyrt.tensors import Value

if TYPE_CHECKING:
    from pyrt.plan import ValueTable
    from pyrt.pte_reader import Operator

Step = Callable[[], Any]
ENV_VAR = "PYRT_KERNELS"
CHOICES = ("auto", "torch", "numpy")
ALLOWLIST_FILES = ("allowed_ops.txt", "extra_ops.txt")  # package data next to this module


@dataclass(frozen=True)
class Kernel:
    """A resolved operator.

    ``rebinds(args)`` lists the value indices the step stores new objects into
    (scalar results, views); ``writes(args)`` the arguments whose memory it may
    write in place (out tensors, ``self`` of in-place ops; None: any argument).
    Both pick arguments by position: which positions may depend on ``len(args)``, never
    on the value indices themselves (:mod:`pyrt.fold` works them out once per operator).
    The plan refuses a file whose kernel writes constant data (read-only file
    memory). ``build(site)`` returns the step closure for one instruction.
    ``pure``: the result depends only on the arguments and nothing else changes (no
    random numbers, no side effects), so a call on constant data may run once at load
    (:mod:`pyrt.fold`). ``view(vals, args)``: for a ``*_copy`` op whose result torch can
    also give as a view of its input (``permute_copy`` -> ``permute``), that view (a list for
    ``split_copy`` and the like), computed from the load-time values; :mod:`pyrt.fold` uses it
    where the input's bytes provably outlive the result. ``strided``: the kernel reads its
    tensor arguments by their logical values whatever their strides (torch's out-variants,
    copies), so :mod:`pyrt.fold` may hand it a strided view where the file planned a
    contiguous tensor; False for kernels that reinterpret bytes (``et_view``, ``as_strided_copy``).
    """

    name: str
    build: Callable[[KernelSite], Step]
    rebinds: Callable[[tuple[int, ...]], Sequence[int]] = lambda args: ()
    needs_library: bool = True  # False: runs without torch or numpy kernels (prims, copies)
    writes: Callable[[tuple[int, ...]], Sequence[int]] | None = None
    pure: bool = False
    view: Callable[[list[Value], tuple[int, ...]], Any] | None = None
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
    already hold (see :mod:`pyrt.steady`). ``tensor``: the tensor whose object (not only its
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
    :func:`pyrt.kernels.torch_kernels._rebinding`): :mod:`pyrt.fold` marks per-key calls this way.
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
    no output, no alias over their bytes, see :meth:`pyrt.fold.Folder.unread`); a kernel
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
            from pyrt.errors import PteFormatError

            raise PteFormatError(f"{self.where}: expects at least {n} arguments, the file gives {len(self.args)}")

    def is_const(self, k: int) -> bool:
        return self.table.is_const(self.args[k])

    def value(self, k: int) -> Any:
        """The load-time value of argument ``k`` (only meaningful when :meth:`is_const`)."""
        return self.table.vals[self.args[k]]

    def getter(self, k: int) -> Callable[[], Any]:
        return self.table.getter(self.args[k])

    def kind(self, k: int) -> str:
        return self.table.kinds[self.args[k]]

    def info(self, k: int) -> Any:
        return self.table.infos.get(self.args[k])

    def setter(self, k: int) -> Callable[[Any], None]:
        vals, i = self.table.vals, self.args[k]

        def store(v: Any) -> None:
            vals[i] = v

        return store

    def error(self, exc: BaseException) -> PyrtError:
        if isinstance(exc, PyrtError):
            return exc
        return InputError(f"{self.where} failed: {type(exc).__name__}: {exc}")


def library(name: str) -> KernelLibrary:
    """Load kernel library ``name`` ("prim", "torch" or "numpy")."""
    if name == "prim":
        from pyrt.kernels.prim_kernels import PrimLibrary

        return PrimLibrary()
    if name == "torch":
        from pyrt.kernels.torch_kernels import TorchLibrary

        return TorchLibrary()
    if name == "numpy":
        from pyrt.kernels.numpy_kernels import NumpyLibrary

        return NumpyLibrary()
    raise UnsupportedOperatorError(f"unknown kernel library {name!r}; choose one of {CHOICES}")


@functools.lru_cache(maxsize=1)
def torch_available() -> bool:
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a blocked import (sys.modules["torch"] = None) or a broken install
        return False


def choose_library(choice: str | None) -> str:
    """Resolve ``kernels=`` (or ``$PYRT_KERNELS``): torch when installed, else numpy."""
    choice = choice or os.environ.get(ENV_VAR) or "auto"
    if choice not in CHOICES:
        raise UnsupportedOperatorError(f"kernels={choice!r} is not one of {CHOICES}")
    if choice == "auto":
        return "torch" if torch_available() else "numpy"
    if choice == "torch" and not torch_available():
        raise UnsupportedOperatorError("kernels='torch' was asked for but torch is not installed")
    return choice


@functools.lru_cache(maxsize=1)
def allowed_operators() -> frozenset[str]:
    """Qualified names (``aten::add.out``) the interpreter may resolve: ExecuTorch's set + pyrt's extras."""
    from importlib.resources import files

    names: set[str] = set()
    for fname in ALLOWLIST_FILES:
        for line in files(__name__).joinpath(fname).read_text(encoding="utf-8").splitlines():
            name = line.partition("#")[0].strip()
            if name:
                names.add(name)
    return frozenset(names)


def check_allowed(method: str, operators: Sequence[Operator]) -> None:
    """UnsupportedOperatorError naming every operator outside :func:`allowed_operators`."""
    allowed = allowed_operators()
    refused = [op.qualified_name for op in operators if op.qualified_name not in allowed]
    if refused:
        raise UnsupportedOperatorError(
            f"method {method!r} uses operators ExecuTorch's runtime does not define, which pyrt refuses to run "
            f"(see pyrt/kernels/allowed_ops.txt): {', '.join(dict.fromkeys(refused))}"
        )


def resolve(method: str, operators: Sequence[Operator], libraries: Sequence[KernelLibrary]) -> list[Kernel]:
    """One kernel per allowed operator, from the first library that has it; all misses reported at once."""
    check_allowed(method, operators)
    kernels: list[Kernel] = []
    missing: list[str] = []
    for op in operators:
        found = next((k for lib in libraries if (k := lib.lookup(op)) is not None), None)
        if found is None:
            missing.append(op.qualified_name)
        else:
            kernels.append(found)
    if missing:
        names = ", ".join(lib.name for lib in libraries if lib.name != "prim") or "prim"
        raise UnsupportedOperatorError(
            f"method {method!r} uses operators no kernel library ({names}) supports: {', '.join(missing)}"
        )
    return kernels


__all__ = ["RANDOM_OPS", "DATA_DEPENDENT_OPS", "ShapeOnly", "shape_only", "with_steady", "noop",
           "Kernel", "KernelLibrary", "KernelSite", "Step", "library", "choose_library", "resolve", "ENV_VAR",
           "allowed_operators", "check_allowed"]
