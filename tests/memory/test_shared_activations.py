"""Shared activation memory (issue 23, items 1 and 5): engines of one method on one device share one
scratch sized to the largest; engines of different methods (which may run at once) do not."""

from __future__ import annotations

import numpy as np
import pytest

import pyrt
from pyrt.device.scratch import SharedScratch
from pyrt.engine import TensorRTEngine
from pyrt.format.trt_blob import IOBinding
from pyrt.sim import simulated_devices
from tests.fixtures.memplan import MiB, add_engine, chain_program

pytest.importorskip("executorch")


def three_engines(activation: int = 40 * MiB) -> bytes:
    return chain_program({"forward": [add_engine(v, activation=activation) for v in (1.0, 2.0, 3.0)]})


def test_three_engines_whose_unshared_activations_do_not_fit_run_with_sharing() -> None:
    sim = simulated_devices(1, memory=100 * MiB)  # 3 x 40 MiB unshared would not fit
    with pyrt.Program(three_engines(), devices=sim) as prog:
        used = sim.driver.memory_used(0)
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        np.testing.assert_array_equal(prog(x)[0], x + 6)
        np.testing.assert_array_equal(prog(x)[0], x + 6)
        (group,) = prog.activation_memory
        assert group.nbytes == 40 * MiB and group.unshared_bytes == 120 * MiB and group.saved_bytes == 80 * MiB
        assert len(group.engines) == 3
        assert 40 * MiB <= used < 41 * MiB  # the scratch; weights and arenas are bytes
    assert sim.driver.memory_used(0) == 0 and not sim.driver.hazards


def test_without_sharing_each_engine_holds_its_own_activations() -> None:
    sim = simulated_devices(1, memory=200 * MiB)
    with pyrt.Program(three_engines(), devices=sim, share_activations=False) as prog:
        assert 120 * MiB <= sim.driver.memory_used(0) < 121 * MiB
        assert prog.activation_memory == []
    small = simulated_devices(1, memory=100 * MiB)
    with pytest.raises(pyrt.PyrtError):
        pyrt.Program(three_engines(), devices=small, share_activations=False)


def test_methods_that_may_run_at_once_do_not_share() -> None:
    data = chain_program({"forward": [add_engine(1.0, activation=8 * MiB), add_engine(2.0, activation=4 * MiB)],
                          "decode": [add_engine(3.0, activation=6 * MiB)]})
    sim = simulated_devices(1, memory=64 * MiB)
    with pyrt.Program(data, devices=sim) as prog:
        groups = {g.label: g for g in prog.activation_memory}
        assert sorted(g.nbytes for g in groups.values()) == [6 * MiB, 8 * MiB]
        assert sum(g.saved_bytes for g in groups.values()) == 4 * MiB
        assert 14 * MiB <= sim.driver.memory_used(0) < 15 * MiB
        x = np.ones((2, 3), np.float32)
        np.testing.assert_array_equal(prog.run(x, method="decode")[0], x + 3)
        np.testing.assert_array_equal(prog.run(x, method="forward")[0], x + 3)


def test_a_growing_scratch_rebinds_the_engines_that_bound_it_before() -> None:
    sim = simulated_devices(1, memory=64 * MiB)
    bindings = [IOBinding("x", "float32", (2, 3), True), IOBinding("y", "float32", (2, 3), False)]
    small, big = (TensorRTEngine.load(memoryview(add_engine(v, activation=a).to_bytes()), device=0,
                                      io_bindings=bindings, trt=sim.tensorrt, cuda=sim.cuda)
                  for v, a in ((1.0, 4 * MiB), (2.0, 8 * MiB)))
    scratch = SharedScratch(sim.cuda, 0, "test")
    small.scratch = big.scratch = scratch
    small.configure(None, "automatic")  # binds a 4 MiB area
    assert scratch.nbytes == 4 * MiB
    big.configure(None, "automatic")  # grows it to 8 MiB: the small engine must move with it
    assert scratch.nbytes == 8 * MiB and 8 * MiB <= sim.driver.memory_used(0) < 9 * MiB
    x = np.ones((2, 3), np.float32)
    with sim.cuda.alloc(x.nbytes, 0) as a, sim.cuda.alloc(x.nbytes, 0) as b, sim.cuda.stream(0) as s:
        sim.cuda.memcpy_htod(a, x)
        small.infer_output_shapes([x.shape])
        small.execute([a.ptr], [b.ptr], s.handle)
        s.synchronize()  # the fake fails the launch if its activation memory was the freed 4 MiB area
        out = np.empty_like(x)
        sim.cuda.memcpy_dtoh(out, b)
    np.testing.assert_array_equal(out, x + 1)
    small.close()
    big.close()
    scratch.close()
    assert sim.driver.memory_used(0) == 0


def test_set_budget_keeps_one_area() -> None:
    data = chain_program({"forward": [add_engine(v, activation=a * MiB) for v, a in ((1.0, 4), (2.0, 8), (3.0, 12))]})
    sim = simulated_devices(1, memory=64 * MiB)
    with pyrt.Program(data, devices=sim) as prog:
        assert 12 * MiB <= sim.driver.memory_used(0) < 13 * MiB
        x = np.ones((2, 3), np.float32)
        np.testing.assert_array_equal(prog(x)[0], x + 6)  # engine 0 runs on the 12 MiB area, not a freed one
        prog.set_budget("50%")  # contexts recreated: still one area
        np.testing.assert_array_equal(prog(x)[0], x + 6)
        assert [g.nbytes for g in prog.activation_memory] == [12 * MiB]
    assert not sim.driver.hazards
