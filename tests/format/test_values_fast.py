"""The bulk decoders (:mod:`pyrt.format.values`) against the general reader, on valid and corrupted files.

Values and instructions must agree item for item on every valid file, and on a
corrupted one either agree or both raise: the fast path may only give up (and let
the general reader name the error), never accept what the general reader rejects.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from pyrt.errors import PyrtError
from pyrt.format import values as _values
from pyrt.pte_reader import PteFile


@contextmanager
def _general_reader_only() -> Iterator[None]:
    def give_up(*args: Any) -> Any:
        raise _values.Fallback

    saved = _values.decode_values, _values.decode_instructions, _values.decode_operators
    _values.decode_values = _values.decode_instructions = _values.decode_operators = give_up  # type: ignore[assignment]
    try:
        yield
    finally:
        _values.decode_values, _values.decode_instructions, _values.decode_operators = saved  # type: ignore[assignment]


def _decode(data: bytes) -> list[object]:
    out: list[object] = []
    try:
        plans = PteFile.open(data).program.execution_plan
    except PyrtError as exc:
        return [type(exc)]
    for plan in plans:
        for what in ("values", "chains", "operators"):
            try:
                out.append(repr(getattr(plan, what)))  # repr: a NaN double equals itself
            except PyrtError as exc:
                out.append(type(exc))
    return out


def _agree(data: bytes) -> None:
    fast = _decode(data)
    with _general_reader_only():
        slow = _decode(data)
    assert fast == slow


def test_bulk_decoders_are_used_on_valid_files(any_pte: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = any_pte.read_bytes()
    _agree(data)
    calls: list[str] = []
    for name in ("decode_values", "decode_instructions", "decode_operators"):
        real = getattr(_values, name)
        monkeypatch.setattr(_values, name, lambda *a, _r=real, _n=name: calls.append(_n) or _r(*a))
    plans = PteFile.open(data).program.execution_plan
    has_instructions = any(chain.instructions for plan in plans for chain in plan.chains)
    assert all(plan.values is not None and plan.operators is not None for plan in plans)
    has_operators = any(plan.operators for plan in plans)
    want = {"decode_values"} | ({"decode_instructions"} if has_instructions else set())
    assert set(calls) == want | ({"decode_operators"} if has_operators else set())


def test_bulk_decoders_agree_on_corrupted_files(any_pte: Path) -> None:
    data = any_pte.read_bytes()
    header = PteFile.open(data).extended_header
    program_end = header.program_size if header else len(data)
    rnd = random.Random(any_pte.name)
    for _ in range(150):
        b = bytearray(data)
        for _ in range(rnd.randint(1, 3)):
            b[rnd.randrange(8, program_end)] = rnd.randrange(256)
        _agree(bytes(b))
