"""Dimension ranges of symbolic shapes: (min, max) per dim, example sizes, the bounds engines need.

A symbolic dim is bounded by the program's range constraints (what the user declared);
one with no finite upper bound is an ExportError, since ExecuTorch plans every tensor at
its bound and an engine profile needs a max.

>>> shape_ranges(__import__("torch").empty(2, 3), "x")
((2, 2), (3, 3))
"""

from __future__ import annotations

from typing import Any

import sympy
import torch

from pyrt.errors import ExportError
from pyrt.export._graph.partition import Extracted, is_tensor_node


def is_dynamic(t: torch.Tensor) -> bool:
    """Whether any dim of ``t`` is symbolic."""
    return any(not isinstance(d, int) for d in t.shape)


def shape_ranges(t: torch.Tensor, name: str, constraints: Any = None, role: str = "input"
                 ) -> tuple[tuple[int, int], ...]:
    """(min, max) per dim; symbolic dims are bounded by the program's range constraints
    (what the user declared; the shape environment's own ranges specialise away 0 and 1)."""
    return tuple((s, s) if isinstance(s, int) else _dim_range(s, name, d, constraints, role)
                 for d, s in enumerate(t.shape))


def _dim_range(size: Any, name: str, dim: int, constraints: Any = None, role: str = "input") -> tuple[int, int]:
    """(min, max) of a symbolic dim (a SymInt or a sympy expression); ExportError when it has no
    finite upper bound (torch's ``int_oo`` claims ``is_finite``: only a sympy Integer is one)."""
    from torch.utils._sympy.value_ranges import bound_sympy

    expr, ranges = _symbolic(size, name, dim, role)
    ranges.update({k: v for k, v in (constraints or {}).items() if getattr(k, "is_Symbol", False)})
    rng = bound_sympy(expr, ranges)
    lower, upper = _finite(rng.lower), _finite(rng.upper)
    if upper is None:
        raise ExportError(f"{role} {name!r} dim {dim} ({expr}) has no upper bound; give Dim(max=...) "
                          "(a data-dependent size: torch._check(size <= N))")
    return max(lower or 0, 0), upper


def _symbolic(size: Any, name: str, dim: int, role: str) -> tuple[sympy.Expr, dict[Any, Any]]:
    """A dim's sympy expression and its shape environment's symbol ranges (none for a bare expression)."""
    if isinstance(size, sympy.Expr):
        return size, {}
    node = getattr(size, "node", None)
    expr = getattr(node, "expr", None)
    if not isinstance(expr, sympy.Expr):
        raise ExportError(f"{role} {name!r} dim {dim} is {size!r} ({type(size).__name__}), not a size "
                          "expression pyrt can bound; give Dim(max=...)")
    return expr, dict(getattr(getattr(node, "shape_env", None), "var_to_range", None) or {})


def _finite(value: Any) -> int | None:
    """A sympy bound as an int; None for an infinite one (sympy's oo or torch's int_oo)."""
    return int(value) if getattr(value, "is_Integer", False) else None


def size_hint(size: Any, name: str, dim: int, constraints: Any = None, role: str = "input") -> int:
    """A dimension's example value: its trace hint, else (a data-dependent size such as
    ``nonzero``'s, which has none) its upper bound; no finite bound is an ExportError."""
    if isinstance(size, int):
        return size
    hint = getattr(getattr(size, "node", None), "hint", None)
    if hint is not None:
        return int(hint)
    return _dim_range(size, name, dim, constraints, role)[1]


def check_outputs(part: Extracted) -> None:
    """ExportError naming an engine output whose size has no finite upper bound (ExecuTorch plans
    every tensor at its bound; its own error is a bare RuntimeError at lowering)."""
    limits = part.module.meta.get("range_constraints")
    for out in part.outputs:
        if is_tensor_node(out):
            shape_ranges(out.meta["val"], out.name, limits, role="output")


def hint_shape(t: torch.Tensor, name: str, constraints: Any = None) -> tuple[int, ...]:
    """Every dim's example value (:func:`size_hint`)."""
    return tuple(size_hint(d, name, i, constraints) for i, d in enumerate(t.shape))


def min_opt_max(t: torch.Tensor, name: str, limits: Any) -> dict[str, list[int]]:
    """A TensorRT profile entry for ``t``: ``{"min", "opt", "max"}`` shapes, the hint as opt."""
    ranges = shape_ranges(t, name, limits)
    return {"min": [a for a, _ in ranges], "opt": list(hint_shape(t, name, limits)), "max": [b for _, b in ranges]}
