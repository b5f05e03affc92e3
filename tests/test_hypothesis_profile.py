"""Property tests carry no timing assertion: Hypothesis's per-example deadline is off for the whole suite
(conftest.py's profile), so a slow example on a loaded machine is not a failure."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st


def test_the_suites_profile_has_no_deadline() -> None:
    assert settings().deadline is None


@settings(max_examples=2, database=None)
@given(st.integers(0, 1))
def test_an_example_slower_than_hypothesis_default_deadline_passes(value: int) -> None:
    time.sleep(0.25)  # Hypothesis's default deadline is 200 ms
    assert value in (0, 1)
