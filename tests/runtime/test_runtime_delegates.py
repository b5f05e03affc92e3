"""Delegated programs end to end through ``pyrt.sim.simulated_gpus`` (fake CUDA + fake TensorRT).

The main program is written by ``pyrt.export.to_pte`` (reference engines,
ExecuTorch 1.5.1 serializer): two TensorRT engines around a graph break, on
two devices, with ``et_copy`` ops, streamable weights, a baked budget on one
engine and a dynamic batch. Outputs must equal eager PyTorch. A hand-built
program covers what the exporter never writes: engines reading host arenas
and an engine feeding an engine on another device directly.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("executorch")

from pyrt import cuda as cuda_seam  # noqa: E402
from pyrt.errors import BudgetError, DeviceError, InputError  # noqa: E402
from pyrt.runtime.program import Program  # noqa: E402
from pyrt.sim import simulated_gpus  # noqa: E402
from tests.conftest import cuda_device_count  # noqa: E402
from tests.fixtures.pte import handmade_two_engines as _handmade  # noqa: E402


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(8, 16)
        self.l2 = torch.nn.Linear(16, 4)

    def forward(self, x: Any) -> Any:
        h = torch.sin(torch.relu(self.l1(x)))  # sin runs in ExecuTorch: a graph break
        return self.l2(h) * 2


class EngineOnly(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(4, 3)

    def forward(self, x: Any) -> Any:
        return torch.relu(self.l1(x))


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from torch.export import Dim

    from pyrt.export import to_pte

    directory = tmp_path_factory.mktemp("delegates")
    torch.manual_seed(0)
    model, only = Model().eval(), EngineOnly().eval()
    two = directory / "two.pte"
    summary = to_pte(model, two, (torch.randn(3, 8),), builder="reference", torch_executed_ops=["aten.sin.default"],
           dynamic_shapes={"x": {0: Dim("b", min=1, max=8)}}, device={0: "cuda:0", 1: "cuda:1"},
           weight_streaming=True, weight_streaming_budget={1: 256, "*": None}, progress=False)
    assert [str(e.device) for e in summary.engines] == ["cuda:0", "cuda:1"], summary  # the exporter's side
    trt_only = directory / "trt_only.pte"
    to_pte(only, trt_only, (torch.randn(2, 4),), builder="reference", progress=False)
    return {"two": two, "model": model, "trt_only": trt_only, "only": only}


def eager(model: torch.nn.Module, x: Any) -> Any:
    with torch.no_grad():
        return model(x)


# -- the exported program ----------------------------------------------------------------------------


def test_graph_break_two_devices_dynamic_batch(exported: dict[str, Any]) -> None:
    with simulated_gpus(2), Program(exported["two"]) as prog:
        for batch in (3, 1, 8):
            x = torch.randn(batch, 8)
            out = prog(x)
            assert isinstance(out, torch.Tensor) and out.shape == (batch, 4)
            torch.testing.assert_close(out, eager(exported["model"], x), rtol=1e-5, atol=1e-6)
        x = np.random.rand(2, 8).astype(np.float32)
        out = prog(x)
        assert isinstance(out, np.ndarray)
        np.testing.assert_allclose(out, eager(exported["model"], torch.from_numpy(x)).numpy(), rtol=1e-5, atol=1e-6)
        with pytest.raises(InputError):
            prog(torch.randn(9, 8))  # over the exported bound


def test_weight_streaming_baked_and_automatic(exported: dict[str, Any]) -> None:
    with simulated_gpus(2), Program(exported["two"]) as prog:
        ws = prog.weight_streaming
        assert [(w.delegate_index, w.device, w.source) for w in ws] == [(0, 0, "automatic"), (1, 1, "baked")]
        assert ws[1].budget == 256 and all(w.streamable_bytes > 0 and w.scratch_bytes > 0 for w in ws)
        assert ws[0].budget == ws[0].streamable_bytes  # the fake's automatic budget streams nothing


def test_load_time_budget_overrides_baked(exported: dict[str, Any]) -> None:
    with simulated_gpus(2), Program(exported["two"], budget="50%") as prog:
        ws = prog.weight_streaming
        assert [w.source for w in ws] == ["load-time", "load-time"]
        assert [w.budget for w in ws] == [w.streamable_bytes // 2 for w in ws]
    with simulated_gpus(2), Program(exported["two"], budget={0: 100}) as prog:
        assert [(w.budget, w.source) for w in prog.weight_streaming] == [(100, "load-time"), (256, "baked")]


def test_set_budget_between_runs(exported: dict[str, Any]) -> None:
    x = torch.randn(4, 8)
    with simulated_gpus(2), Program(exported["two"]) as prog:
        before = prog(x)
        prog.set_budget(64)  # a total, split by streamable size
        ws = prog.weight_streaming
        assert sum(w.budget for w in ws) == 64 and {w.source for w in ws} == {"load-time"}
        torch.testing.assert_close(prog(x), before)
        with pytest.raises(BudgetError):
            prog.set_budget("-3")
        assert sum(w.budget for w in prog.weight_streaming) == 64  # rejected before any engine changed
        prog.set_budget(None)
        assert [w.source for w in prog.weight_streaming] == ["automatic", "baked"]
        torch.testing.assert_close(prog(x), before)


def test_device_map_moves_engines(exported: dict[str, Any]) -> None:
    x = torch.randn(2, 8)
    with simulated_gpus(1), Program(exported["two"], device_map={1: 0}) as prog:
        assert [w.device for w in prog.weight_streaming] == [0, 0]
        torch.testing.assert_close(prog(x), eager(exported["model"], x), rtol=1e-5, atol=1e-6)
    with simulated_gpus(3), Program(exported["two"], device_map={"cuda:0": "cuda:2"}) as prog:
        assert [w.device for w in prog.weight_streaming] == [2, 1]
        torch.testing.assert_close(prog(x), eager(exported["model"], x), rtol=1e-5, atol=1e-6)


def test_missing_device_fails_before_allocating(exported: dict[str, Any]) -> None:
    with simulated_gpus(1) as sim:
        with pytest.raises(DeviceError, match=r"CUDA device 1 does not exist.*present devices: 0: Fake GPU 0"):
            Program(exported["two"])
        assert sim.driver.live_allocations() == 0


def test_close_releases_device_memory(exported: dict[str, Any]) -> None:
    with simulated_gpus(2) as sim:
        prog = Program(exported["two"])
        prog(torch.randn(2, 8))
        assert sim.driver.live_allocations() > 0
        prog.close()
        assert sim.driver.live_allocations() == 0


def test_caller_stream(exported: dict[str, Any]) -> None:
    x = torch.randn(2, 8)
    with simulated_gpus(2) as sim, Program(exported["two"]) as prog, sim.cuda.stream(0) as s:
        torch.testing.assert_close(prog(x, stream=s), eager(exported["model"], x), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(prog(x, stream=s.handle), eager(exported["model"], x), rtol=1e-5, atol=1e-6)
        with pytest.raises(InputError, match="stream must be"):
            prog(x, stream="default")


def test_device_input_through_cuda_array_interface(exported: dict[str, Any]) -> None:
    from pyrt.format.dtypes import ScalarType
    from pyrt.memory.tensors import DeviceTensor

    x = np.random.rand(2, 4).astype(np.float32)
    with simulated_gpus(1) as sim, Program(exported["trt_only"]) as prog:
        alloc = sim.cuda.alloc(x.nbytes, 0)
        sim.cuda.memcpy_htod(alloc, x)
        out = prog(DeviceTensor(alloc, 0, ScalarType.FLOAT, (2, 4), 8))
        alloc.free()
    assert isinstance(out, np.ndarray)
    np.testing.assert_allclose(out, eager(exported["only"], torch.from_numpy(x)).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(cuda_device_count() > 0, reason="this machine has a GPU")
def test_no_gpu_and_no_fake_is_device_error(exported: dict[str, Any]) -> None:
    with pytest.raises(DeviceError, match="CUDA device 0 does not exist"):
        Program(exported["trt_only"])


@pytest.mark.parametrize("budget", [True, -1, float("nan"), "lots", "150%", {"a": 1}, {0: -5}])
def test_bad_budget_is_named_before_any_device_work(exported: dict[str, Any], budget: Any) -> None:
    # With no device at all, the user's bad value still comes first (not a DeviceError).
    with simulated_gpus(0) as sim:
        with pytest.raises(BudgetError, match="load-time budget"):
            Program(exported["trt_only"], budget=budget)
        assert sim.driver.live_allocations() == 0


def _run_isolated(code: str) -> str:
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          cwd=root, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_trt_only_program_does_not_import_torch(exported: dict[str, Any]) -> None:
    out = _run_isolated(f"""
        import sys
        import pyrt
        from pyrt.sim import simulated_gpus
        with simulated_gpus(1):
            prog = pyrt.Program({str(exported["trt_only"])!r})
            print(sorted(m for m in ("torch", "executorch", "tensorrt") if m in sys.modules))
            prog.close()
    """)
    assert out.strip() == "[]"


def test_trt_only_program_runs_without_torch(exported: dict[str, Any]) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 7
    out = _run_isolated(f"""
        import sys
        sys.modules["torch"] = None  # importing torch now fails: numpy all the way down
        import numpy as np, pyrt
        from pyrt.sim import simulated_gpus
        with simulated_gpus(1), pyrt.Program({str(exported["trt_only"])!r}) as prog:
            y = prog(np.arange(8, dtype=np.float32).reshape(2, 4) / 7)
        print(type(y).__name__, y.tolist())
    """)
    kind, values = out.split(" ", 1)
    assert kind == "ndarray"
    np.testing.assert_allclose(eval(values), eager(exported["only"], torch.from_numpy(x)).numpy(), rtol=1e-5)


# -- hand-built: host-arena engine I/O and engine -> engine across devices ----------------------------


def test_engine_feeds_engine_on_another_device(tmp_path: Path) -> None:
    w = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    path = _handmade(tmp_path / "handmade.pte", w)
    x = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    with simulated_gpus(2) as sim:
        with Program(path) as prog:
            (out,) = prog(x)
            np.testing.assert_allclose(out, np.maximum(x, 0) ** 2 + w, rtol=1e-6)
            (again,) = prog(-x)
            np.testing.assert_allclose(again, np.maximum(-x, 0) ** 2 + w, rtol=1e-6)
        assert sim.driver.live_allocations() == 0
    assert cuda_seam.current() is not sim.cuda


def test_device_output_stays_on_device_for_device_callers(tmp_path: Path) -> None:
    from pyrt.format.dtypes import ScalarType
    from pyrt.memory.tensors import DeviceTensor

    w = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    path = _handmade(tmp_path / "device_out.pte", w, out_on_device=True)
    x = np.random.default_rng(2).standard_normal((2, 3)).astype(np.float32)
    want = np.maximum(x, 0) ** 2 + w
    with simulated_gpus(2) as sim, Program(path) as prog:
        (host_out,) = prog(x)  # a host caller gets host results
        np.testing.assert_allclose(host_out, want, rtol=1e-6)
        src = sim.cuda.alloc(x.nbytes, 0)
        sim.cuda.memcpy_htod(src, x)
        (dev_out,) = prog(DeviceTensor(src, 0, ScalarType.FLOAT, (2, 3), 6))
        assert isinstance(dev_out, DeviceTensor) and dev_out.device == 1 and dev_out.shape == (2, 3)
        assert dev_out.__cuda_array_interface__["data"][0] == dev_out.ptr
        back = np.empty((2, 3), np.float32)
        sim.cuda.memcpy_dtoh(back, dev_out.allocation)
        np.testing.assert_allclose(back, want, rtol=1e-6)
        before = sim.driver.live_allocations()
        del dev_out  # the caller owns it: freed with the last reference (on the legacy stream, not waited for)
        sim.cuda.borrowed_stream(0, 1).synchronize()
        assert sim.driver.live_allocations() == before - 1
        src.free()


@pytest.mark.gpu
def test_real_tensorrt_end_to_end(tmp_path: Path) -> None:
    """On a machine with a GPU and a TensorRT flavour: a real engine, a graph break, host tensors in and out."""
    from pyrt.export import to_pte

    torch.manual_seed(0)
    model = Model().eval()
    path = tmp_path / "real.pte"
    to_pte(model, path, (torch.randn(3, 8),), builder="auto", torch_executed_ops=["aten.sin.default"],
           weight_streaming=True, progress=False)
    x = torch.randn(3, 8)
    with Program(path) as prog:
        torch.testing.assert_close(prog(x), eager(model, x), rtol=2e-3, atol=2e-3)  # TF32 / fp16 tactics
        prog.set_budget("50%")
        torch.testing.assert_close(prog(x), eager(model, x), rtol=2e-3, atol=2e-3)
        assert all(w.source == "load-time" for w in prog.weight_streaming if w.streamable_bytes)


def test_input_in_a_device_arena(tmp_path: Path) -> None:
    from pyrt.format.dtypes import ScalarType
    from pyrt.memory.tensors import DeviceTensor

    w = np.zeros((2, 3), np.float32)
    path = _handmade(tmp_path / "device_in.pte", w, in_on_device=True)
    x = np.random.default_rng(3).standard_normal((2, 3)).astype(np.float32)
    want = np.maximum(x, 0) ** 2
    with simulated_gpus(2) as sim, Program(path) as prog:
        np.testing.assert_allclose(prog(x)[0], want, rtol=1e-6)  # host -> device arena
        for device in (0, 1):  # same device (device copy) and the other one (peer copy)
            src = sim.cuda.alloc(x.nbytes, device)
            sim.cuda.memcpy_htod(src, x)
            (out,) = prog(DeviceTensor(src, 0, ScalarType.FLOAT, (2, 3), 6))
            np.testing.assert_allclose(out, want, rtol=1e-6)
            src.free()
        with pytest.raises(InputError, match="must be float32"):
            prog(x.astype(np.float64))


def test_trt_flavour_choice(exported: dict[str, Any]) -> None:
    from pyrt.errors import BackendError

    x = torch.randn(2, 4)
    with simulated_gpus(1) as sim:
        with Program(exported["trt_only"], trt=sim.tensorrt) as prog:  # a module: used as given
            torch.testing.assert_close(prog(x), eager(exported["only"], x), rtol=1e-5, atol=1e-6)
        with pytest.raises(BackendError, match="unknown TensorRT flavour 'tensorrt_max'"):
            Program(exported["trt_only"], trt="tensorrt_max")
        assert sim.driver.live_allocations() == 0
