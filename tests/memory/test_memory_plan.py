"""The program-wide memory plan and budget="fit" (issue 23, items 2, 3 and 5)."""

from __future__ import annotations

import numpy as np
import pytest

import pyrt
from pyrt.runtime.memory_plan import EngineMemory, plan_memory
from pyrt.sim import simulated_devices
from pyrt.streaming import split_proportionally
from tests.fixtures.memplan import MiB, add_engine, chain_program

pytest.importorskip("executorch")


def program() -> bytes:
    """Three engines in a chain: 64 and 32 MiB of streamable weights and one that does not stream,
    16 MiB of activations each; values in a cuda:0 arena of 4 MiB."""
    return chain_program({"forward": [add_engine(1.0, activation=16 * MiB, weight_bytes=64 * MiB, streaming=True),
                                      add_engine(2.0, activation=16 * MiB, weight_bytes=32 * MiB, streaming=True),
                                      add_engine(3.0, activation=16 * MiB)]},
                         arena_on_device=True, arena_bytes=4 * MiB)


def test_fit_leaves_the_headroom_free_and_sums_exactly() -> None:
    sim = simulated_devices(1, memory=128 * MiB)
    with pyrt.Program(program(), devices=sim, budget="fit", headroom="32MiB") as prog:
        (d,) = prog.memory_plan.devices
        assert (d.arenas, d.activations, d.activations_unshared) == (4 * MiB, 16 * MiB, 48 * MiB)
        assert d.streaming_scratch == (64 * MiB + 32 * MiB) // 8
        assert d.headroom == 32 * MiB and 0 <= d.streamable - 96 * MiB < 1024  # + two 24-byte weights
        assert d.budget == d.available == d.free - 4 * MiB - 16 * MiB - 12 * MiB - 32 * MiB  # exact
        budgets = [w.budget for w in prog.weight_streaming]
        assert budgets[:2] == [prog.memory_plan.budgets[0], prog.memory_plan.budgets[1]]
        streamable = [w.streamable_bytes for w in prog.weight_streaming]
        assert sum(budgets[:2]) == d.budget and budgets[:2] == split_proportionally(d.budget, streamable[:2])
        assert [w.source for w in prog.weight_streaming] == ["fit", "fit", "none"]
        x = np.ones((2, 3), np.float32)
        np.testing.assert_array_equal(prog(x)[0], x + 6)
        free = sim.driver.free_memory(0)
        assert 32 * MiB <= free < 32 * MiB + 64 * 1024  # the headroom, and only it, is left
        assert "headroom" in prog.memory_plan.explain() and "activations (shared)" in prog.memory_plan.table()


def test_fit_changes_with_headroom_and_device_map() -> None:
    sim = simulated_devices(2, memory=[128 * MiB, 192 * MiB])
    with pyrt.Program(program(), devices=sim, budget="fit", headroom="32MiB") as a:
        first = a.memory_plan.devices[0].budget
        a.set_budget("fit", headroom="16MiB")
        assert a.memory_plan.devices[0].budget == first + 16 * MiB
        assert sum(w.budget or 0 for w in a.weight_streaming) == first + 16 * MiB
        big = a.plan_memory(gpu_memory="24GiB").devices[0]
        assert big.budget == big.streamable and big.total == 24 << 30  # everything resident
    with pyrt.Program(program(), devices=sim, budget="fit", headroom="32MiB", device_map={0: 1}) as b:
        (d,) = b.memory_plan.devices
        assert d.device == 1 and d.budget == min(d.streamable, first + 64 * MiB)


def test_a_plan_that_cannot_fit_at_budget_zero_is_a_resource_error_before_any_context() -> None:
    data = chain_program({"forward": [add_engine(1.0, activation=48 * MiB, weight_bytes=8 * MiB, streaming=True)]})
    sim = simulated_devices(1, memory=40 * MiB)
    with pytest.raises(pyrt.ResourceError, match="forward/delegate0 activations 48.00 MiB"):
        pyrt.Program(data, devices=sim, budget="fit")
    assert sim.tensorrt.calls["create_execution_context"] == 0
    assert sim.driver.memory_used(0) == 0


def test_arenas_larger_than_the_gpu_fail_before_any_engine_is_deserialized() -> None:
    data = chain_program({"forward": [add_engine(1.0)]}, arena_on_device=True, arena_bytes=64 * MiB)
    sim = simulated_devices(1, memory=32 * MiB)
    with pytest.raises(pyrt.ResourceError, match="device arenas"):
        pyrt.Program(data, devices=sim)
    assert sim.tensorrt.calls["deserialize_cuda_engine"] == 0


def test_plan_split_is_exact_and_clamped() -> None:
    engines = [EngineMemory(i, f"e{i}", 0, s, 0, 10, "g") for i, s in enumerate((7, 0, 13, 1000))]
    plan = plan_memory(engines, {0: (1000 + 10, 2000)}, headroom=0)
    assert sum(plan.budgets.values()) == 1000 and plan.budgets[0] <= 7 and 1 not in plan.budgets
    big = plan_memory(engines, {0: (10**6, 2 * 10**6)}, headroom="1%")
    assert big.budgets == {0: 7, 2: 13, 3: 1000}
    with pytest.raises(pyrt.BudgetError, match="headroom"):
        plan_memory(engines, {0: (100, 100)}, headroom="auto")


def test_inspect_memory_prints_the_plan_for_a_gpu_size_not_present(tmp_path, monkeypatch, capsys) -> None:
    from pyrt.tools.cli import main

    path = tmp_path / "m.pte"
    path.write_bytes(program())
    monkeypatch.setenv("PYRT_SIMULATED_GPUS", "1")
    assert main(["inspect", "--memory", str(path), "--gpu-memory", "24GiB", "--headroom", "2GiB"]) == 0
    out = capsys.readouterr().out
    assert "GPUs of 24GiB" in out and "weights resident (budget)" in out and "24.00 GiB" in out
    assert "activations saved by sharing" in out and "32.00 MiB" in out  # 48 MiB unshared, 16 shared
    assert main(["inspect", "--memory", "--json", str(path), "--gpu-memory", "128MiB", "--headroom", "32MiB"]) == 0
    import json

    plan = json.loads(capsys.readouterr().out)["memory_plan"]
    (d,) = plan["devices"]
    assert d["total"] == 128 * MiB and d["headroom"] == 32 * MiB
    assert sum(plan["budgets"].values()) == d["weights_resident"] < d["streamable"]


def test_bench_sweep_prints_the_memory_plan_beside_throughput(tmp_path, monkeypatch, capsys) -> None:
    from pyrt.tools.cli import main

    path = tmp_path / "m.pte"
    path.write_bytes(program())
    monkeypatch.setenv("PYRT_SIMULATED_GPUS", "1")
    assert main(["bench", str(path), "--sweep", "0%..100%:50%", "--iters", "2", "--warmup", "0",
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "GPU memory per budget" in out and "cuda:0 weights resident" in out and "cuda:0 activations" in out
    assert out.count("runs/s") >= 2
