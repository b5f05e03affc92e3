"""Several optimization profiles at run time (issue 23, item 4): pyrt picks the first profile whose
ranges hold the input shapes, switches the context on the run's stream, and refuses shapes none holds."""

from __future__ import annotations

import numpy as np
import pytest

import pyrt
from pyrt.sim import simulated_devices
from pyrt.sim.refengine import RefProfile
from tests.fixtures.memplan import MiB, add_engine, chain_program

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


def test_the_program_reports_every_profile_of_its_engines() -> None:
    sim = simulated_devices(1, memory=64 * MiB)
    with pyrt.Program(decoder_like(), devices=sim) as prog:
        assert prog.optimization_profiles == {"forward/delegate0": [{"x": ((1, 4), (1, 4))}, {"x": ((2, 4), (8, 4))}]}


def test_export_builds_several_profiles_and_inspect_shows_them(tmp_path, capsys, monkeypatch) -> None:
    torch = pytest.importorskip("torch")
    import pyrt.export
    from pyrt.tools.cli import main

    class Model(torch.nn.Module):
        def forward(self, x):  # two graph breaks' worth of work is not needed: one engine, two profiles
            return torch.relu(x * 2.0) + 1.0

    rows = torch.export.Dim("rows", min=1, max=64)
    path = tmp_path / "m.pte"
    pyrt.export.to_pte(Model(), path, (torch.ones(4, 4),), dynamic_shapes={"x": {0: rows}}, builder="reference",
                       profiles=[{"x": {"min": [1, 4], "opt": [1, 4], "max": [1, 4]}},
                                 {"x": {"min": [4, 4], "opt": [16, 4], "max": [64, 4]}}])
    sim = simulated_devices(1, memory=64 * MiB)
    with pyrt.Program(path, devices=sim) as prog:
        (profiles,) = prog.optimization_profiles.values()
        assert [list(p.values())[0] for p in profiles] == [((1, 4), (1, 4)), ((4, 4), (64, 4))]
        for n in (1, 7, 64):
            x = np.linspace(-1, 1, n * 4, dtype=np.float32).reshape(n, 4)
            np.testing.assert_allclose(prog(x), np.maximum(x * 2, 0) + 1)
        with pytest.raises(pyrt.InputError, match="profile 1"):
            prog(np.ones((2, 4), np.float32))  # inside the model's range, outside both profiles
        # activation memory per profile: the engine's intermediates at the profile's largest shapes
        assert prog.memory_plan.devices[0].activations >= 64 * 4 * 4
    monkeypatch.setenv("PYRT_SIMULATED_GPUS", "1")
    assert main(["inspect", "--memory", str(path), "--gpu-memory", "1GiB"]) == 0
    assert "optimization profiles 0: " in capsys.readouterr().out


def test_export_refuses_a_profile_that_misses_a_dynamic_input(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    import pyrt.export

    rows = torch.export.Dim("rows", min=1, max=64)
    with pytest.raises(pyrt.ExportError, match="names \\['y'\\]"):
        pyrt.export.to_pte(torch.nn.ReLU(), tmp_path / "m.pte", (torch.ones(4, 4),),
                           dynamic_shapes={"input": {0: rows}}, builder="reference",
                           profiles=[{"y": {"min": [1, 4], "opt": [1, 4], "max": [1, 4]}}])


def test_tensorrt_rtx_builds_one_optimization_profile_per_entry(monkeypatch) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("tensorrt_rtx")
    from pyrt.export import trt_builder
    from pyrt.export._tensorrt import config as trt_config

    added: list[dict] = []
    real = trt_config._add_profile
    monkeypatch.setattr(trt_config, "_add_profile", lambda s, n, c, r: (added.append(dict(r)), real(s, n, c, r)))
    built = trt_builder.build_engine(torch.nn.ReLU(), [torch.ones(4, 4)], flavour="tensorrt_rtx", input_names=["x"],
                                     dynamic_shapes=[{"x": {"min": [1, 4], "opt": [1, 4], "max": [1, 4]}},
                                                     {"x": {"min": [2, 4], "opt": [16, 4], "max": [64, 4]}}])
    assert built.inputs[0].shape == (-1, 4)  # dynamic: the union of the profiles
    assert added == [{0: ((1, 4), (1, 4), (1, 4))}, {0: ((2, 4), (16, 4), (64, 4))}]
