"""What a method declares, read from the file: its inputs (tensors or exported scalars), and the
checks an array given for one of them must pass. Shared by the command line (``pyrt.tools.inputs``)
and the server (``pyrt.serve.protocol``).

>>> spec = InputSpec(0, "Tensor", "float32", (8, 3), dynamic=True)
>>> spec.describe()
'float32[<=8, <=3]'
>>> check_shape(spec, (9, 3), "input0")
Traceback (most recent call last):
...
pyrt.errors.InputError: input0: shape [9, 3] exceeds the upper bound [8, 3] in dimension 0
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pyrt.errors import InputError
from pyrt.format.schema import EValue

_SCALARS = ("Int", "Double", "Bool", "String", "Null")


class Method(Protocol):
    """What :func:`method_inputs` reads of one method (a :class:`pyrt.pte_reader.ExecutionPlan`)."""

    @property
    def name(self) -> str: ...

    @property
    def inputs(self) -> Sequence[int]: ...

    @property
    def values(self) -> Sequence[EValue]: ...


class Methods(Protocol):
    """What :func:`method_inputs` reads of a program (a :class:`pyrt.pte_reader.PteProgram`)."""

    @property
    def execution_plan(self) -> Sequence[Method]: ...


class MethodSource(Protocol):
    """What :func:`method_inputs` reads of an open file (a :class:`pyrt.pte_reader.PteFile`, which this
    layer's modules do not import: the reader is built on them)."""

    source: str

    @property
    def program(self) -> Methods: ...


@dataclass(frozen=True)
class InputSpec:
    """One declared input: a tensor (dtype, sizes: upper bounds when ``dynamic``) or a specialised scalar."""

    position: int
    kind: str
    dtype: str | None = None
    shape: tuple[int, ...] = ()
    dynamic: bool = False
    value: Any = None  # scalars: the exported constant

    def describe(self) -> str:
        """``float32[2, 4]``, ``float32[<=8, 8]`` (dynamic: bounds), ``Int 3``."""
        if self.kind == "Tensor":
            dims = ", ".join(f"<={d}" if self.dynamic else str(d) for d in self.shape)
            return f"{self.dtype}[{dims}]"
        return self.kind if self.kind in ("Null", "TensorList") else f"{self.kind} {self.value!r}"


def method_inputs(pte: MethodSource, method: str) -> list[InputSpec]:
    """The declared inputs of ``method`` (InputError naming the methods when there is none such)."""
    plans = {p.name: p for p in pte.program.execution_plan}
    plan = plans.get(method)
    if plan is None:
        raise InputError(f"{pte.source}: no method {method!r}; methods are {list(plans)}")
    out = []
    for pos, i in enumerate(plan.inputs):
        v = plan.values[i]
        if v.kind == "Tensor":
            t = v.tensor
            out.append(InputSpec(pos, "Tensor", t.scalar_type.dtype_name, tuple(t.sizes),
                                 t.shape_dynamism.name != "STATIC"))
        else:
            out.append(InputSpec(pos, v.kind, value=v.value if v.kind in _SCALARS else None))
    return out


def check_shape(spec: InputSpec, shape: tuple[int, ...], where: str) -> None:
    """InputError naming ``where`` unless ``shape`` has the input's rank and lies within its bounds."""
    if len(shape) != len(spec.shape):
        raise InputError(f"{where}: shape {list(shape)} has rank {len(shape)}, the method takes rank "
                         f"{len(spec.shape)}")
    if not spec.dynamic and shape != spec.shape:
        raise InputError(f"{where}: shape {list(shape)} differs from the static shape {list(spec.shape)}")
    over = [i for i, (d, b) in enumerate(zip(shape, spec.shape, strict=True)) if not 0 <= d <= b]
    if over:
        raise InputError(f"{where}: shape {list(shape)} exceeds the upper bound {list(spec.shape)} "
                         f"in dimension {over[0]}")


def flatten(x: Any) -> list[Any]:
    """Leaves of nested tuples/lists (method outputs) in order."""
    if isinstance(x, (list, tuple)):
        return [leaf for item in x for leaf in flatten(item)]
    return [x]
