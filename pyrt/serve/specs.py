"""What a method declares, read from the file: its inputs (tensors or exported scalars) and outputs.

(``pyrt.tools.inputs`` reads the same for the command line; the serve package does not
import the tools package, which imports it to register ``pyrt serve``.)

>>> spec = InputSpec(0, "Tensor", "float32", (8, 3), dynamic=True)
>>> check_array(spec, np.zeros((9, 3), np.float32), "input0")
Traceback (most recent call last):
...
pyrt.errors.InputError: input0: shape [9, 3] exceeds the upper bound [8, 3] in dimension 0
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pyrt.errors import InputError
from pyrt.pte_reader import PteFile

_SCALARS = ("Int", "Double", "Bool", "String", "Null")


@dataclass(frozen=True)
class InputSpec:
    """One declared input: a tensor (dtype, sizes: upper bounds when ``dynamic``) or a specialised scalar."""

    position: int
    kind: str
    dtype: str | None = None
    shape: tuple[int, ...] = ()
    dynamic: bool = False
    value: Any = None  # scalars: the exported constant


def _plan(pte: PteFile, method: str) -> Any:
    plans = {p.name: p for p in pte.program.execution_plan}
    if method not in plans:
        raise InputError(f"{pte.source}: no method {method!r}; methods are {list(plans)}")
    return plans[method]


def method_inputs(pte: PteFile, method: str) -> list[InputSpec]:
    """The declared inputs of ``method``, in position order."""
    plan = _plan(pte, method)
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


def check_array(spec: InputSpec, x: np.ndarray, where: str) -> None:
    """InputError naming ``where`` unless ``x`` has the input's dtype and a shape within its bounds."""
    shape = tuple(x.shape)
    if x.dtype.name != spec.dtype:
        raise InputError(f"{where}: got {x.dtype.name}{list(shape)}, the method takes {spec.dtype}")
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
