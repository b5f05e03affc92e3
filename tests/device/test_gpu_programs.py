"""pyrt's CUDA half through Program: simulated GPUs always, the real GPU when present.

The same tests run twice: on ``simulated_gpus(1)``, and (marked ``gpu``) on the
real driver with :func:`pyrt.sim.gpu_reference.reference_tensorrt`, which
runs pyrt reference engines on real device memory (no TensorRT flavour runs on
every GPU: TensorRT-RTX refuses Hopper). Programs placed on ``cuda:1`` are mapped
onto device 0, so one GPU is enough. What runs for real on a GPU: device arenas,
``et_copy`` ops, DLPack and ``__cuda_array_interface__`` inputs from torch and CuPy,
device outputs read by torch and CuPy, caller streams, budgets and context
re-creation with real allocations.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pyrt.cuda
from pyrt.memory.tensors import DeviceTensor
from pyrt.runtime.program import Program
from pyrt.sim import simulated_gpus
from pyrt.sim.gpu_reference import reference_tensorrt
from tests.fixtures import gpu_programs

ONE_GPU = {"cuda:1": "cuda:0"}


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return gpu_programs.programs_for(tmp_path_factory)


@dataclasses.dataclass
class Side:
    """Where programs run: the simulated GPU, or the real one."""

    kind: str
    trt: Any
    cuda: pyrt.cuda.Cuda
    device_inputs: dict[str, Callable[[np.ndarray], Any]]

    def program(self, path: Path, **kw: Any) -> Program:
        return Program(path, trt=self.trt, device_map=ONE_GPU, **kw)

    def to_host(self, out: Any) -> np.ndarray:
        if isinstance(out, np.ndarray):
            return out
        if isinstance(out, DeviceTensor):
            host = np.empty(out.shape, np.float32)
            self.cuda.memcpy_dtoh(host, self.cuda.borrow(out.ptr, out.nbytes, out.device))
            return host
        if hasattr(out, "cpu"):  # torch
            return out.detach().cpu().numpy()
        import cupy

        return cupy.asnumpy(out)


def _pyrt_device_tensor(cuda: pyrt.cuda.Cuda, owned: list[Any]) -> Callable[[np.ndarray], Any]:
    from pyrt.format.dtypes import ScalarType

    def make(x: np.ndarray) -> DeviceTensor:
        buf = cuda.alloc(x.nbytes, 0)
        owned.append(buf)  # the test's own input memory, freed when the test ends
        cuda.memcpy_htod(buf, np.ascontiguousarray(x))
        return DeviceTensor(buf, 0, ScalarType.FLOAT, tuple(x.shape), x.size)

    return make


@pytest.fixture(params=["simulated", pytest.param("gpu", marks=pytest.mark.gpu)])
def side(request: pytest.FixtureRequest) -> Iterator[Side]:
    owned: list[Any] = []
    if request.param == "simulated":
        with simulated_gpus(1) as sim:
            yield Side("simulated", sim.tensorrt, sim.cuda, {"pyrt": _pyrt_device_tensor(sim.cuda, owned)})
            for buf in owned:
                buf.free()
            assert sim.driver.live_allocations() == 0, "a program leaked device memory"
        return
    cuda = pyrt.cuda.current()
    if cuda.device_count() == 0:
        pytest.skip(f"needs a CUDA device: {cuda.describe_devices()}")
    makers: dict[str, Callable[[np.ndarray], Any]] = {"pyrt": _pyrt_device_tensor(cuda, owned)}
    try:
        import torch

        if torch.cuda.is_available():
            makers["torch"] = lambda x: torch.from_numpy(x).cuda()
            makers["torch-cai"] = lambda x: _CaiOnly(torch.from_numpy(x).cuda())
    except ImportError:
        pass
    try:
        import cupy

        makers["cupy"] = lambda x: cupy.asarray(x)
        makers["cupy-dlpack"] = lambda x: _DlpackOnly(cupy.asarray(x))
    except ImportError:
        pass
    yield Side("gpu", reference_tensorrt(cuda), cuda, makers)
    for buf in owned:
        buf.free()


def _torch_cuda() -> Any:
    """torch, where it has CUDA (else the test is skipped)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    return torch


class _CaiOnly:
    """A producer that offers only ``__cuda_array_interface__``."""

    def __init__(self, t: Any) -> None:
        self.keep = t
        self.__cuda_array_interface__ = t.__cuda_array_interface__


class _DlpackOnly:
    """A producer that offers only DLPack."""

    def __init__(self, t: Any) -> None:
        self.keep = t

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self.keep.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> Any:
        return self.keep.__dlpack_device__()


def _data(path: Path) -> Any:
    return np.load(path.with_suffix(".npz"))


def test_graph_break_with_dynamic_batch(side: Side, programs: dict[str, Path]) -> None:
    data = _data(programs["graph_break"])
    with side.program(programs["graph_break"]) as prog:
        for b in gpu_programs.BATCHES:
            out = prog(data[f"x{b}"])
            np.testing.assert_allclose(side.to_host(out), data[f"y{b}"], rtol=1e-5, atol=1e-6)


def test_threads_sharing_a_program_with_changing_batches_each_get_their_own_result(
        side: Side, programs: dict[str, Path]) -> None:
    """The engine remembers the input shapes it last set (and the output shapes TensorRT inferred):
    callers on four threads, each batch size in turn, must each get the output of their own input."""
    from concurrent.futures import ThreadPoolExecutor

    data = _data(programs["graph_break"])
    batches = [gpu_programs.BATCHES[k % len(gpu_programs.BATCHES)] for k in range(48)]
    with side.program(programs["graph_break"]) as prog, ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda b: side.to_host(prog(data[f"x{b}"])), batches))
    for k, (b, out) in enumerate(zip(batches, outs, strict=True)):
        np.testing.assert_allclose(out, data[f"y{b}"], rtol=1e-5, atol=1e-6, err_msg=f"run {k}, batch {b}")


def test_device_inputs_from_every_producer(side: Side, programs: dict[str, Path]) -> None:
    for name in ("graph_break", "trt_only"):
        data = _data(programs[name])
        x, want = (data["x3"], data["y3"]) if name == "graph_break" else (data["x"], data["y"])
        with side.program(programs[name]) as prog:
            for producer, make in side.device_inputs.items():
                got = side.to_host(prog(make(x)))
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"{name} with {producer}")


def test_budgets_and_context_recreation(side: Side, programs: dict[str, Path]) -> None:
    data = _data(programs["graph_break"])
    x, want = data["x8"], data["y8"]
    with side.program(programs["graph_break"], budget="50%") as prog:
        ws = prog.weight_streaming
        assert [w.source for w in ws] == ["load-time", "load-time"]
        assert [w.budget for w in ws] == [w.streamable_bytes // 2 for w in ws] and all(w.budget for w in ws)
        np.testing.assert_allclose(side.to_host(prog(x)), want, rtol=1e-5, atol=1e-6)
        for budget in (0, "100%", "auto", 64):
            prog.set_budget(budget)
            np.testing.assert_allclose(side.to_host(prog(x)), want, rtol=1e-5, atol=1e-6, err_msg=str(budget))
        assert sum(w.budget for w in prog.weight_streaming) == 64


def test_device_arenas_and_et_copy(side: Side, programs: dict[str, Path]) -> None:
    for name in ("device_in", "device_out"):
        data = _data(programs[name])
        x, want = data["x"], data["y"]
        with side.program(programs[name]) as prog:
            (host_out,) = prog(x)  # a host caller gets host results
            assert isinstance(host_out, np.ndarray), name
            np.testing.assert_allclose(host_out, want, rtol=1e-6, err_msg=name)
            for producer, make in side.device_inputs.items():
                (out,) = prog(make(x))
                np.testing.assert_allclose(side.to_host(out), want, rtol=1e-6, err_msg=f"{name}/{producer}")
                if name == "device_out" and producer == "pyrt":  # device callers keep device outputs
                    assert isinstance(out, DeviceTensor) and out.device == 0
                    assert out.__cuda_array_interface__["data"][0] == out.ptr


@pytest.mark.gpu
def test_torch_and_cupy_read_device_outputs(programs: dict[str, Path]) -> None:
    torch = _torch_cuda()
    data = _data(programs["device_out"])
    x, want = data["x"], data["y"]
    with Program(programs["device_out"], trt=reference_tensorrt(pyrt.cuda.current()), device_map=ONE_GPU) as prog:
        (out,) = prog(torch.from_numpy(x).cuda())
        t = out if isinstance(out, torch.Tensor) else torch.as_tensor(out, device="cuda")
        assert t.is_cuda
        np.testing.assert_allclose(t.cpu().numpy(), want, rtol=1e-6)
        try:
            import cupy
        except ImportError:
            return
        (out,) = prog(cupy.asarray(x))
        np.testing.assert_allclose(cupy.asnumpy(cupy.asarray(out)), want, rtol=1e-6)


@pytest.mark.gpu
def test_caller_stream(programs: dict[str, Path]) -> None:
    torch = _torch_cuda()
    data = _data(programs["graph_break"])
    x, want = torch.from_numpy(data["x8"]).cuda(), data["y8"]
    with Program(programs["graph_break"], trt=reference_tensorrt(pyrt.cuda.current()), device_map=ONE_GPU) as prog:
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            y = x * 1.0  # pending work on the caller's stream that pyrt must wait for
            out = prog(y)
        stream.synchronize()
        np.testing.assert_allclose(out.cpu().numpy(), want, rtol=1e-5, atol=1e-6)
        out = prog.run(x, stream=stream)
        stream.synchronize()
        np.testing.assert_allclose(out.cpu().numpy(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_producer_stream_still_at_work(programs: dict[str, Path]) -> None:
    """A torch input still being computed on a side stream, offered through CAI v3 with its "stream":
    pyrt must wait for that stream (no host sync); a missing wait reads unfinished data."""
    torch = _torch_cuda()
    data = _data(programs["device_in"])
    x, want = data["x"], data["y"]
    with Program(programs["device_in"], trt=reference_tensorrt(pyrt.cuda.current()), device_map=ONE_GPU) as prog:
        for _ in range(3):
            base = torch.from_numpy(x).cuda()  # (a pageable copy: torch waits for it)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                slow = torch.randn(4096, 4096, device="cuda")
                for _ in range(20):  # tens of milliseconds of queued work before the input exists
                    slow = torch.tanh(slow @ slow)
                t = base + slow[0, 0] * 0
            # torch's own interface names no stream; say which one, as CuPy does (CAI v3)
            producer = _CaiOnly(t)
            producer.__cuda_array_interface__ = {**t.__cuda_array_interface__, "version": 3,
                                                 "stream": int(side.cuda_stream)}
            (out,) = prog(producer)
            np.testing.assert_allclose(_to_numpy(out), want, rtol=1e-6)
            side.synchronize()


def _to_numpy(out: Any) -> np.ndarray:
    if isinstance(out, np.ndarray):
        return out
    host = np.empty(out.shape, np.float32)
    cuda = pyrt.cuda.current()
    cuda.memcpy_dtoh(host, cuda.borrow(out.ptr, out.nbytes, out.device))  # legacy stream: pyrt made it ready
    return host


@pytest.mark.gpu
def test_cuda_graphs_with_host_computed_engines_fall_back(programs: dict[str, Path], tmp_path: Path) -> None:
    """Reference engines synchronise their stream at each launch, which no capture allows: the
    real driver refuses the capture and the segment runs eagerly, with correct results."""
    chain = programs["two_engines"].with_name("chain16.pte")
    if not chain.exists():
        pytest.importorskip("executorch")
        chain = gpu_programs.chain_program(tmp_path / "chain16.pte", 16)
    x = np.linspace(-1, 1, 4, dtype=np.float32)
    cuda = pyrt.cuda.current()
    with Program(chain, trt=reference_tensorrt(cuda), devices=cuda, cuda_graphs=True) as prog:
        for _ in range(3):
            (out,) = prog(x)
            np.testing.assert_allclose(out, np.maximum(x, 0) * 2 ** 16, rtol=1e-6)
        assert [s.state for s in prog._runners["forward"]._segments] == ["refused"]
