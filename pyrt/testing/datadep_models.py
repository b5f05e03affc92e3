"""Small models with data-dependent output shapes, for export/run tests and benchmarks.

``nonzero``, ``masked_select``, boolean-mask indexing and one-argument ``where``, each
alone (``"nonzero"``...) and between two ``Linear`` layers (``"nonzero_mlp"``...). The
first layer of each ``_mlp`` model is the identity, so the input decides the mask:
:func:`example` gives inputs whose result is empty, partial or full.

>>> sorted(NAMES)[:3]
['bool_index', 'bool_index_mlp', 'masked_select']
>>> model, x = build("nonzero")                               # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from pyrt.errors import PyrtError

OPS = ("nonzero", "masked_select", "bool_index", "where")
NAMES = OPS + tuple(f"{op}_mlp" for op in OPS)
CASES = ("empty", "partial", "full")
ROWS, COLS = 4, 8


def build(name: str, seed: int = 0) -> tuple[Any, Any]:
    """(model in eval mode, the example input used to export it) for ``name``."""
    import torch

    if name not in NAMES:
        raise PyrtError(f"unknown data-dependent model {name!r}; choose one of {', '.join(NAMES)}")
    torch.manual_seed(seed)
    op, mlp = name.removesuffix("_mlp"), name.endswith("_mlp")
    model = _Model(op, mlp).eval()
    return model, example(name, "partial")


def example(name: str, case: str) -> Any:
    """An input for ``name`` whose data-dependent result is ``case``: empty, partial or full."""
    import torch

    if case not in CASES:
        raise PyrtError(f"unknown case {case!r}; choose one of {', '.join(CASES)}")
    g = torch.Generator().manual_seed(1)
    shape = (ROWS, COLS) if name.endswith("_mlp") or name == "bool_index" else (ROWS * COLS,)
    magnitude = torch.rand(shape, generator=g) + 0.5
    if case == "empty":
        return -magnitude
    if case == "full":
        return magnitude
    sign = torch.ones(shape)
    if len(shape) == 2:
        sign[1::2] = -1  # alternate rows (bool_index masks whole rows by their sum)
    else:
        sign[1::3] = -1
    return magnitude * sign


def _model_class() -> Any:
    import torch

    class Model(torch.nn.Module):
        def __init__(self, op: str, mlp: bool) -> None:
            super().__init__()
            self.op, self.mlp = op, mlp
            self.first = torch.nn.Linear(COLS, COLS)
            with torch.no_grad():
                self.first.weight.copy_(torch.eye(COLS))
                self.first.bias.zero_()
            width = {"nonzero": 2, "masked_select": 1, "bool_index": COLS, "where": COLS}[op]
            self.last = torch.nn.Linear(width, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.first(x) if self.mlp else x
            if self.op == "nonzero":
                out = torch.nonzero(y > 0)
                return self.last(out.float()) if self.mlp else out
            if self.op == "masked_select":
                out = torch.masked_select(y, y > 0)
                return self.last(out.unsqueeze(1)) if self.mlp else out
            if self.op == "bool_index":
                out = y[y.sum(dim=-1) > 0]
                return self.last(out) if self.mlp else out
            rows = torch.where(y.sum(dim=-1) > 0)[0] if y.dim() == 2 else torch.where(y > 0)[0]
            out = torch.index_select(y, 0, rows)
            return self.last(out) if self.mlp else out

    return Model


def _Model(op: str, mlp: bool) -> Any:  # noqa: N802 (a class factory: torch is imported lazily)
    return _model_class()(op, mlp)
