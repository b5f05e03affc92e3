"""Several optimization profiles at run time (issue 23, item 4): pyrt picks the first profile whose
ranges hold the input shapes, switches the context on the run's stream, and refuses shapes none holds."""

from __future__ import annotations

import numpy as np
import pytest

import pyrt
from pyrt.testing import simulated_devices
from pyrt.testing.refengine import RefProfile
from tests.memplan_fixtures import MiB, add_engine, chain_program

pytest.importorskip("executorch")


def decoder_like() -> bytes:
    """One engine, input (-1, 4): profile 0 holds 1 row (decode), profile 1 holds 2..8 rows (prefill)."""
    eng = add_engine(1.0, shape=(-1, 4), bounds=((1, 4), (8, 4)), profiles=[
        RefProfile({"x": ((1, 4), (1, 4), (1, 4))}, 1 * MiB), RefProfile({"x": ((2, 4), (8, 4), (8, 4))}, 4 * MiB)])
    return chain_program({"forward": [eng]}, sizes=(8, 4), dynamic=True)


def test_a_two_profile_engine_runs_shapes_of_both_and_refuses_one_outside_both() -> None:
    sim = simulated_devices(1, memory=64 * MiB)
    with pyrt.Program(decoder_like(), devices=sim) as prog:
        for rows in (1, 5, 8, 1, 2):
            x = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
            np.testing.assert_array_equal(prog(x)[0], x + 1)
        with pytest.raises(pyrt.InputError, match=r"profile 0: x \[\(1, 4\), \(1, 4\)\]; profile 1: x \[\(2, 4\), "):
            prog(np.zeros((0, 4), np.float32))
        assert prog.memory_plan.devices[0].activations == 4 * MiB  # the larger profile's
    assert not sim.driver.hazards


def test_inspect_like_profiles_are_read_from_the_engine() -> None:
    sim = simulated_devices(1, memory=64 * MiB)
    with pyrt.Program(decoder_like(), devices=sim) as prog:
        (d,) = prog._delegates
        assert d.engine.profiles == [{"x": ((1, 4), (1, 4))}, {"x": ((2, 4), (8, 4))}]
