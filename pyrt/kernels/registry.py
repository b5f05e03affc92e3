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
* ``numpy`` (:mod:`pyrt.kernels.numpy_library`): the portable set for machines without torch.

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
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pyrt.errors import UnsupportedOperatorError
from pyrt.kernels.allowlist import check_allowed
from pyrt.kernels.base import Kernel, KernelLibrary
from pyrt.kernels.numpy_library import NumpyLibrary
from pyrt.kernels.prim_kernels import PrimLibrary
from pyrt.kernels.torch_kernels import TorchLibrary

if TYPE_CHECKING:
    from pyrt.pte_reader import Operator

ENV_VAR = "PYRT_KERNELS"
CHOICES = ("auto", "torch", "numpy")

def library(name: str) -> KernelLibrary:
    """Load kernel library ``name`` ("prim", "torch" or "numpy")."""
    if name == "prim":
        return PrimLibrary()
    if name == "torch":
        return TorchLibrary()
    if name == "numpy":
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


