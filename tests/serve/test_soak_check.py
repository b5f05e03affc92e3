"""What the soak's ``--check`` calls a problem (``benchmarks/soak_serve.problems``), on windows like those a loaded
machine gives: an empty window after warm-up is still warm-up, not a latency drift from NaN."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("requests")

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "soak_serve.py"
_spec = importlib.util.spec_from_file_location("soak_serve_checked", _PATH)
assert _spec is not None and _spec.loader is not None
soak = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(soak)
NAN = float("nan")


def _row(window: int, p50: float, rss: int = 200, pids: tuple[str, ...] = ("dyn:1", "dyn:2", "gpt2:3"),
         outcomes: dict[str, int] | None = None) -> dict[str, Any]:
    return {"window": window, "p50_ms": p50, "outcomes": outcomes or {"ok": 10},
            "replicas": {pid: {"rss": rss, "fds": 67} for pid in pids}}


def test_empty_windows_after_the_first_are_warm_up_too() -> None:
    """The busy-cores CI run's windows: clients waited on warm-up's 26 s answers through all of window 2."""
    rows = [_row(1, 164.0), _row(2, NAN, outcomes={}), _row(3, 102.8), _row(4, 124.5), _row(5, 117.2),
            _row(6, 126.6)]
    assert soak.problems(rows) == []


def test_drift_growth_restarts_and_failures_are_still_found() -> None:
    steady = [_row(1, 500.0), _row(2, NAN, outcomes={}), _row(3, 100.0), _row(4, 110.0)]
    assert soak.problems([*steady, _row(5, 400.0)]) == ["p50 drifted from 100.0 ms to 400.0 ms"]
    assert soak.problems([*steady, _row(5, 100.0, rss=300)]) == [
        "replica dyn:1: rss grew from 200 to 300 after warm-up", "replica dyn:2: rss grew from 200 to 300 after "
        "warm-up", "replica gpt2:3: rss grew from 200 to 300 after warm-up"]
    restarted = soak.problems([*steady, _row(5, 100.0, pids=("dyn:1", "dyn:9", "gpt2:3"))])
    assert restarted == ["replicas changed: dyn had 3 pids after warm-up (dyn:1, dyn:2, dyn:9), 2 replicas"]
    failed = soak.problems([*steady, _row(5, 100.0, outcomes={"ok": 3, "error:500": 1})])
    assert failed == ["window 5: failed requests {'error:500': 1}"]
    assert soak.problems([*steady, _row(5, NAN, outcomes={})]) == ["p50 drifted from 100.0 ms to nan ms"]


def test_no_answer_after_warm_up_is_a_problem() -> None:
    rows = [_row(1, 164.0), _row(2, NAN, outcomes={}), _row(3, NAN, outcomes={}), _row(4, NAN, outcomes={})]
    assert soak.problems(rows) == ["no valid request answered in windows 2-3: nothing after warm-up to compare with"]
