"""Data-dependent output shapes (``nonzero``, ``masked_select``, boolean-mask indexing,
one-argument ``where``) at export: bounded planning, typed errors, hints for unbacked sizes.

Issue 24's two reports are guarded here: an unbacked size once reached ``int(None)`` in the
TensorRT profile (an untyped TypeError), and the planner once looped for minutes blocking a
``getitem`` that the partitioner re-admits through its producer.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.fx.experimental.symbolic_shapes import ShapeEnv, _constrain_range_for_size

from pyrt.errors import ExportError
from pyrt.export._builders import _profile, size_hint
from pyrt.export._engines import EngineStore
from pyrt.export._stage import _Planner
from tests.test_export_partitioning import _staged


class MaskedSelectMLP(nn.Module):
    """masked_select between two Linear layers (issue 24's first model)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(8, 8), nn.Linear(1, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        return self.b(torch.masked_select(y, y > 0).unsqueeze(1))


class WhereIndexSelect(nn.Module):
    """One-argument where feeding index_select (issue 24's second model)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.index_select(x, 0, torch.where(x > 0)[0])


class _Shape:
    def __init__(self, *dims: object) -> None:
        self.shape = dims


def _unbacked(upper: int | None) -> torch.SymInt:
    env = ShapeEnv()
    u = env.create_unbacked_symint()
    if upper is not None:
        _constrain_range_for_size(u, min=0, max=upper)
    return u


def test_an_unbacked_size_is_hinted_by_its_upper_bound() -> None:
    u = _unbacked(32)
    assert size_hint(u, "input_0", 0) == 32
    assert _profile(_Shape(u, 4), "input_0", None) == {"min": [0, 4], "opt": [32, 4], "max": [32, 4]}


def test_an_unbacked_size_without_a_bound_is_a_typed_error() -> None:
    with pytest.raises(ExportError, match=r"input 'input_0' dim 0 .* has no upper bound"):
        size_hint(_unbacked(None), "input_0", 0)


def _planner(model: nn.Module, args: tuple, tmp: Path) -> tuple[_Planner, EngineStore]:
    gm, forced, options = _staged(model, args)
    store = EngineStore(tmp)
    from pyrt.export._builders import make_builder

    return _Planner(gm, make_builder("reference"), options, store, forced), store


def test_blocking_a_getitem_blocks_its_producer_and_a_repeat_is_an_error(tmp_path: Path) -> None:
    planner, store = _planner(WhereIndexSelect(), (torch.randn(16),), tmp_path)
    with store:
        item = next(n for n in planner.gm.graph.nodes if n.target is __import__("operator").getitem)
        planner._block([item], "test")
        assert item.args[0] in planner.blocked and item not in planner.blocked
        with pytest.raises(ExportError, match="partitioning made no progress"):
            planner._block([item], "test again")


@pytest.mark.parametrize("model, x", [(WhereIndexSelect(), torch.randn(16)), (MaskedSelectMLP(), torch.randn(4, 8))],
                         ids=["where", "masked_select"])
def test_planning_ends_in_few_rounds(model: nn.Module, x: torch.Tensor, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Each round blocks something new; the where model once ran thousands of rounds."""
    import pyrt.export._stage as stage

    planner, store = _planner(model, (x,), tmp_path)
    limit = len(planner.gm.graph.nodes)
    rounds = []

    def counted(*args: object, **kwargs: object) -> object:
        rounds.append(1)
        if len(rounds) > limit:
            raise AssertionError(f"planning took more than {limit} rounds")
        return real(*args, **kwargs)

    real = stage.propose
    monkeypatch.setattr(stage, "propose", counted)
    with store:
        assert planner.plan()
