"""pyrt.checks: the one test of "an int, not a bool" and of "a finite number in a range"."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyrt.checks import checked_int, checked_number, is_int, is_number
from pyrt.errors import InputError, PteFormatError


@pytest.mark.parametrize("value", [True, False, np.bool_(True), 1.0, "1", None, [1], np.float32(1)])
def test_what_is_not_an_int_is_refused(value: object) -> None:
    assert not is_int(value)
    with pytest.raises(InputError, match=r"^n=.* must be an int$"):
        checked_int(value, "n")


@given(st.integers(), st.integers(-5, 5), st.integers(-5, 5))
def test_bounds_are_low_inclusive_end_exclusive(value: int, low: int, end: int) -> None:
    assert is_int(value, low=low, end=end) == (low <= value < end)


def test_numpy_ints_are_ints_and_come_back_plain() -> None:
    got = checked_int(np.int64(5), "n", low=0)
    assert got == 5 and type(got) is int


def test_the_error_is_the_callers_and_an_input_error_carries_its_field() -> None:
    with pytest.raises(PteFormatError, match=r"^size=-1 must be an int >= 0$"):
        checked_int(-1, "size", low=0, error=PteFormatError)
    with pytest.raises(InputError) as info:
        checked_int(0, "--max-num-seqs", low=1, field="max_num_seqs")
    assert info.value.field == "max_num_seqs" and str(info.value) == "--max-num-seqs=0 must be an int >= 1"


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, True, "0.5", None, 10**400])
def test_numbers_are_finite_reals_and_not_bools(value: object) -> None:
    assert not is_number(value)
    with pytest.raises(InputError, match="must be a finite number"):
        checked_number(value, "x")


def test_number_bounds_are_inclusive() -> None:
    assert checked_number(0, "x", low=0, high=1) == 0.0 and checked_number(1, "x", low=0, high=1) == 1.0
    with pytest.raises(InputError, match=r"^x=1.5 must be a finite number >= 0 and <= 1$"):
        checked_number(1.5, "x", low=0, high=1)
