"""The bulk value decoder (:mod:`pyrt._values`) against the general reader, on valid and corrupted files.

Both must agree value for value on every valid file, and on a corrupted one either
agree or both raise: the fast path may only give up (and let the general reader
name the error), never accept what the general reader rejects.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from pyrt import _values
from pyrt.errors import PyrtError
from pyrt.pte_reader import PteFile


def _slow(plan: object) -> object:
    try:
        return repr(tuple(plan.value(i) for i in range(plan.num_values)))  # type: ignore[attr-defined]
    except PyrtError as exc:
        return type(exc)


def _fast(plan: object) -> object:
    try:
        return repr(plan.values)  # type: ignore[attr-defined]
    except PyrtError as exc:
        return type(exc)


def _agree(data: bytes) -> int:
    try:
        plans = PteFile.open(data).program.execution_plan
    except PyrtError:
        return 0
    for plan in plans:
        assert _fast(plan) == _slow(plan)
    return len(plans)


def test_bulk_decoder_is_used_on_valid_files(any_pte: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = any_pte.read_bytes()
    assert _agree(data)
    calls = []
    real = _values.decode_values
    monkeypatch.setattr(_values, "decode_values", lambda *a: calls.append(1) or real(*a))
    for plan in PteFile.open(data).program.execution_plan:
        plan.values  # noqa: B018
    assert calls


def test_bulk_decoder_agrees_on_corrupted_files(any_pte: Path) -> None:
    data = any_pte.read_bytes()
    program_end = PteFile.open(data).extended_header.program_size if PteFile.open(data).extended_header else len(data)
    rnd = random.Random(any_pte.name)
    for _ in range(150):
        b = bytearray(data)
        for _ in range(rnd.randint(1, 3)):
            b[rnd.randrange(8, program_end)] = rnd.randrange(256)
        _agree(bytes(b))
