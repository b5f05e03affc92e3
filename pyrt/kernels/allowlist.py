"""The operators pyrt may resolve: ExecuTorch's own set plus pyrt's documented extras.

A ``.pte`` is untrusted input, and ``torch.ops`` also holds operators with side
effects (``aten::from_file`` maps any file), so only names listed in
``allowed_ops.txt`` (generated from the executorch package by
``scripts/gen_allowed_ops.py``) and ``extra_ops.txt`` are ever looked up.

>>> "aten::add.out" in allowed_operators(), "aten::from_file.default" in allowed_operators()
(True, False)
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from importlib.resources import files
from typing import TYPE_CHECKING

from pyrt.errors import UnsupportedOperatorError

if TYPE_CHECKING:
    from pyrt.pte_reader import Operator

ALLOWLIST_FILES = ("allowed_ops.txt", "extra_ops.txt")  # package data next to this module


@functools.lru_cache(maxsize=1)
def allowed_operators() -> frozenset[str]:
    """Qualified names (``aten::add.out``) the interpreter may resolve: ExecuTorch's set + pyrt's extras."""
    names: set[str] = set()
    for fname in ALLOWLIST_FILES:
        for line in files("pyrt.kernels").joinpath(fname).read_text(encoding="utf-8").splitlines():
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
