"""pyrt.engine.TensorRTEngine and the TensorRT seam.

Contract tests run on two backends: simulated GPUs (fake CUDA driver + fake
TensorRT running reference engines) always, and real cuda-python + a real
TensorRT flavour when a GPU is present (``gpu`` marker). The same tiny models
are built for both: as reference engines for the fake, from ONNX for the real
one, and outputs are checked against numpy formulas written out here.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import pyrt.cuda
from pyrt.cuda import Cuda
from pyrt.device import tensorrt_seam
from pyrt.engine import TensorRTEngine
from pyrt.errors import BackendError, BudgetError, DeviceError, EngineError, InputError
from pyrt.format.trt_blob import IOBinding
from pyrt.sim import simulated_gpus
from pyrt.sim.fake_tensorrt import FakeRuntime, FakeTensorRT
from pyrt.sim.refengine import Ref, RefEngine, RefNode, RefTensor

MiB = 1 << 20
RNG = np.random.default_rng(1234)
HIDDEN = 128
W = (RNG.standard_normal((HIDDEN, HIDDEN)) / 8).astype(np.float32)
B = RNG.standard_normal(HIDDEN).astype(np.float32)


# -- the models, described once ----------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Case:
    """A tiny model: bindings, a numpy reference, and how to build it for either backend."""

    name: str
    bindings: list[IOBinding]
    profile: dict[str, tuple[tuple[int, ...], tuple[int, ...]]]  # dynamic inputs: (min, max)
    reference: Callable[..., list[np.ndarray]]
    weight_streaming: bool


LINEAR = Case(
    "linear_relu",
    [IOBinding("x", "float32", (4, HIDDEN), True), IOBinding("y", "float32", (4, HIDDEN), False)],
    {},
    lambda x: [np.maximum(x @ W.T + B, 0)],
    weight_streaming=True,
)
ADD_MUL = Case(
    "add_mul_dynamic",
    [IOBinding("a", "float32", (-1, 4), True), IOBinding("b", "float32", (-1, 4), True),
     IOBinding("s", "float32", (-1, 4), False), IOBinding("p", "float32", (-1, 4), False)],
    {"a": ((1, 4), (8, 4)), "b": ((1, 4), (8, 4))},
    lambda a, b: [a + b, (a + b) * np.float32(2)],
    weight_streaming=False,
)


def _ref_engine(case: Case) -> bytes:
    if case is LINEAR:
        return RefEngine(
            [RefTensor("x", "float32", (4, HIDDEN))], [RefTensor("y", "float32", (4, HIDDEN))],
            weights={"w": W, "b": B},
            nodes=[RefNode("aten::linear", [Ref("x"), Ref("w"), Ref("b")], {}, ["h"]),
                   RefNode("aten::relu", [Ref("h")], {}, ["y"])],
            weight_streaming=True,
        ).to_bytes()
    return RefEngine(
        [RefTensor("a", "float32", (-1, 4), (1, 4), (8, 4)), RefTensor("b", "float32", (-1, 4), (1, 4), (8, 4))],
        [RefTensor("s", "float32", (-1, 4)), RefTensor("p", "float32", (-1, 4))],
        nodes=[RefNode("aten::add.Tensor", [Ref("a"), Ref("b")], {}, ["s"]),
               RefNode("aten::mul.Scalar", [Ref("s"), 2.0], {}, ["p"])],
    ).to_bytes()


def _torch_module(case: Case) -> tuple[Any, tuple, dict | None]:
    import torch

    if case is LINEAR:
        lin = torch.nn.Linear(HIDDEN, HIDDEN)
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(W))
            lin.bias.copy_(torch.from_numpy(B))
        return torch.nn.Sequential(lin, torch.nn.ReLU()).eval(), (torch.zeros(4, HIDDEN),), None

    class AddMul(torch.nn.Module):
        def forward(self, a, b):  # type: ignore[no-untyped-def]
            s = a + b
            return s, s * 2.0

    batch = torch.export.Dim("batch", min=1, max=8)
    return AddMul().eval(), (torch.zeros(2, 4), torch.zeros(2, 4)), {"a": {0: batch}, "b": {0: batch}}


def build_real_engine(trt: Any, case: Case) -> bytes:
    """Serialize ``case`` with a real TensorRT builder (ONNX via torch.onnx dynamo export)."""
    import torch

    module, example, dynamic = _torch_module(case)
    names = [b.name for b in case.bindings]
    inputs = [b.name for b in case.bindings if b.is_input]
    with warnings.catch_warnings():  # the exporter's deprecation chatter is not ours
        warnings.simplefilter("ignore")
        program = torch.onnx.export(module, example, input_names=inputs,
                                    output_names=[n for n in names if n not in inputs],
                                    dynamic_shapes=dynamic, dynamo=True, verbose=False)
    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    flags = 0
    if tensorrt_seam.flavour_of(trt) == "tensorrt":  # TensorRT 10 needs strong typing to stream weights
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(program.model_proto.SerializeToString()):
        raise RuntimeError([str(parser.get_error(i)) for i in range(parser.num_errors)])
    config = builder.create_builder_config()
    if case.weight_streaming:
        config.set_flag(trt.BuilderFlag.WEIGHT_STREAMING)
    if case.profile:
        profile = builder.create_optimization_profile()
        for name, (lo, hi) in case.profile.items():
            profile.set_shape(name, lo, hi, hi)
        config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise RuntimeError(f"TensorRT could not build {case.name}")
    return bytes(serialized)


# -- backends ----------------------------------------------------------------------------------
@dataclasses.dataclass
class Backend:
    kind: str
    cuda: Cuda
    trt: Any
    build: Callable[[Case], bytes]
    tolerance: float
    sim: Any = None

    def load(self, case: Case, *, device: int = 0, bindings: list[IOBinding] | None = None) -> TensorRTEngine:
        data = memoryview(self.build(case))
        return TensorRTEngine.load(data, device=device, io_bindings=bindings or case.bindings,
                                   trt=self.trt, cuda=self.cuda, name=case.name)


_REAL_BUILDS: dict[tuple[str, str], bytes] = {}


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.gpu)])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    if request.param == "fake":
        with simulated_gpus(2, memory=64 * MiB) as sim:
            yield Backend("fake", sim.cuda, sim.tensorrt, _ref_engine, 1e-5, sim)
        return
    cuda = pyrt.cuda.current()
    if cuda.device_count() == 0:
        pytest.skip(f"needs a CUDA device: {cuda.describe_devices()}")
    try:
        trt = tensorrt_seam.load_tensorrt()
    except BackendError as exc:
        pytest.skip(str(exc))
    if not hasattr(trt, "Builder"):
        pytest.skip(f"{tensorrt_seam.flavour_of(trt)} cannot build engines")
    refusal = tensorrt_seam.unsupported_device(trt, cuda.devices()[0].compute_capability)
    if refusal is not None:
        pytest.skip(refusal)  # e.g. TensorRT-RTX on an H100: measured, docs/hardware.md
    pytest.importorskip("onnx")

    def build(case: Case) -> bytes:
        key = (tensorrt_seam.flavour_of(trt), case.name)
        if key not in _REAL_BUILDS:
            _REAL_BUILDS[key] = build_real_engine(trt, case)
        return _REAL_BUILDS[key]

    yield Backend("real", cuda, trt, build, 2e-2)  # TensorRT may use TF32 for float32 matmuls


def run(engine: TensorRTEngine, cuda: Cuda, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Copy inputs in, execute on a fresh stream, copy outputs out."""
    shapes = engine.infer_output_shapes([x.shape for x in inputs])
    with cuda.stream(engine.device) as stream:
        ins = [cuda.alloc(x.nbytes, engine.device) for x in inputs]
        outs = [cuda.alloc(int(np.prod(s)) * 4, engine.device) for s in shapes]
        try:
            for buf, x in zip(ins, inputs, strict=True):
                cuda.memcpy_htod(buf, np.ascontiguousarray(x), stream=stream)
            engine.execute([b.ptr for b in ins], [b.ptr for b in outs], stream.handle)
            results = [np.empty(s, np.float32) for s in shapes]
            for host, buf in zip(results, outs, strict=True):
                cuda.memcpy_dtoh(host, buf, stream=stream)
            stream.synchronize()
        finally:
            for buf in [*ins, *outs]:
                buf.free()
    return results


def _check(case: Case, outputs: list[np.ndarray], inputs: list[np.ndarray], tol: float) -> None:
    for got, want in zip(outputs, case.reference(*inputs), strict=True):
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


# -- contract tests (every backend) ------------------------------------------------------------
def test_static_engine_computes_real_outputs(backend: Backend) -> None:
    with backend.load(LINEAR) as engine:
        engine.configure(None, "automatic")
        assert (engine.input_names, engine.output_names) == (["x"], ["y"])
        x = RNG.standard_normal((4, HIDDEN)).astype(np.float32)
        _check(LINEAR, run(engine, backend.cuda, [x]), [x], backend.tolerance)
        x2 = -x  # a second run on the same context sees new data
        _check(LINEAR, run(engine, backend.cuda, [x2]), [x2], backend.tolerance)


def test_dynamic_engine_shapes_and_outputs(backend: Backend) -> None:
    with backend.load(ADD_MUL) as engine:
        engine.configure(None, "automatic")
        assert engine.output_names == ["s", "p"]
        for batch in (1, 5, 8):
            a = RNG.standard_normal((batch, 4)).astype(np.float32)
            b = RNG.standard_normal((batch, 4)).astype(np.float32)
            assert engine.infer_output_shapes([a.shape, b.shape]) == [(batch, 4), (batch, 4)]
            _check(ADD_MUL, run(engine, backend.cuda, [a, b]), [a, b], backend.tolerance)


def test_large_engine_deserializes_through_a_stream_reader(backend: Backend, monkeypatch) -> None:
    import pyrt.engine

    # Every engine counts as large here, and TensorRT gets at most 4 KiB per read.
    monkeypatch.setattr(pyrt.engine, "STREAM_READER_MIN_BYTES", 0)
    monkeypatch.setattr(pyrt.engine, "STREAM_CHUNK_BYTES", 4096)
    runtimes: list[FakeRuntime] = []
    if backend.sim is not None:
        original = FakeRuntime._read_stream

        def spy(self: FakeRuntime, reader: Any) -> Any:
            runtimes.append(self)
            return original(self, reader)

        monkeypatch.setattr(FakeRuntime, "_read_stream", spy)
    with backend.load(LINEAR) as engine:
        engine.configure(None, "automatic")
        x = RNG.standard_normal((4, HIDDEN)).astype(np.float32)
        _check(LINEAR, run(engine, backend.cuda, [x]), [x], backend.tolerance)
    if backend.sim is not None:
        (rt,) = runtimes
        # TensorRT asks for exact counts per request, and again for what a short read left out.
        assert sum(rt.stream_requests) == len(_ref_engine(LINEAR)) and len(rt.stream_requests) == 3
        asked = iter(rt.stream_reads)
        for request in rt.stream_requests:
            left = request
            while left:
                want, took = next(asked)
                assert want == left and 0 < took <= 4096
                left -= took
        assert next(asked, None) is None and max(t for _, t in rt.stream_reads) == 4096


def test_explicit_budget_is_applied_read_back_and_reconfigured(backend: Backend) -> None:
    with backend.load(LINEAR) as engine:
        streamable = engine.streamable_weights_size
        if streamable == 0:
            pytest.skip(f"{backend.kind} TensorRT made no weights of {LINEAR.name} streamable")
        assert engine.weight_streaming_scratch_memory_size >= 0
        assert engine.applied_budget is None and engine.budget_source is None
        engine.configure(streamable // 2, "load-time")
        assert (engine.applied_budget, engine.budget_source) == (streamable // 2, "load-time")
        x = RNG.standard_normal((4, HIDDEN)).astype(np.float32)
        _check(LINEAR, run(engine, backend.cuda, [x]), [x], backend.tolerance)
        engine.configure(0, "baked")  # after load, with a context alive: destroyed and recreated
        assert (engine.applied_budget, engine.budget_source) == (0, "baked")
        _check(LINEAR, run(engine, backend.cuda, [x]), [x], backend.tolerance)
        engine.configure(streamable * 10, "load-time")  # clamped to what can stream
        assert engine.applied_budget == streamable
        engine.configure(None, "automatic")
        assert 0 <= engine.applied_budget <= streamable
        _check(LINEAR, run(engine, backend.cuda, [x]), [x], backend.tolerance)


def test_bad_budgets_are_refused_before_tensorrt(backend: Backend) -> None:
    with backend.load(LINEAR) as engine:
        for bad in (-1, 1.5, True, "100"):
            with pytest.raises(BudgetError, match="load-time budget must be an int >= 0"):
                engine.configure(bad, "load-time")  # type: ignore[arg-type]


def test_budget_on_engine_without_streamable_weights_is_ignored(backend: Backend, caplog) -> None:
    with backend.load(ADD_MUL) as engine, caplog.at_level(logging.WARNING, "pyrt.engine"):
        assert engine.streamable_weights_size == 0
        engine.configure(1234, "load-time")
        assert engine.applied_budget is None and engine.budget_source == "load-time"
        assert "ignored" in caplog.text
        a = np.ones((2, 4), np.float32)
        _check(ADD_MUL, run(engine, backend.cuda, [a, a]), [a, a], backend.tolerance)


def test_check_inputs_names_the_binding(backend: Backend) -> None:
    with backend.load(ADD_MUL) as engine:
        ok = ((3, 4), "float32")
        engine.check_inputs([ok, ok])
        engine.check_inputs([((1, 4), "float32"), ((8, 4), "float32")])
        cases = [
            ([ok], "expected 2 inputs"),
            ([ok, ((3, 4), "float16")], "input 'b' must be float32, got float16"),
            ([((3,), "float32"), ok], "input 'a' must have rank 2"),
            ([ok, ((9, 4), "float32")], r"input 'b' shape \(9, 4\) is outside .*\(1, 4\), \(8, 4\)"),
            ([((3, 5), "float32"), ok], "input 'a' shape"),
            ([((0, 4), "float32"), ok], "input 'a' shape"),
        ]
        for shapes_dtypes, message in cases:
            with pytest.raises(InputError, match=message):
                engine.check_inputs(shapes_dtypes)


def test_shape_outside_profile_is_an_input_error_from_tensorrt(backend: Backend) -> None:
    with backend.load(ADD_MUL) as engine:
        engine.configure(None, "automatic")
        with pytest.raises(InputError, match="refused shape \\(9, 4\\) for input 'a'"):
            engine.infer_output_shapes([(9, 4), (9, 4)])
        with pytest.raises(InputError, match="expected 2 input shapes"):
            engine.infer_output_shapes([(2, 4)])


def test_execute_checks_pointer_counts_and_shapes(backend: Backend) -> None:
    with backend.load(ADD_MUL) as engine, backend.cuda.stream(0) as stream:
        engine.configure(None, "automatic")
        with pytest.raises(InputError, match="2 input and 2 output addresses, got 1 and 2"):
            engine.execute([1], [2, 3], stream.handle)
        with pytest.raises(EngineError, match="call infer_output_shapes first"):
            engine.execute([1, 2], [3, 4], stream.handle)


def test_missing_device_fails_before_anything_is_allocated(backend: Backend) -> None:
    count = backend.cuda.device_count()
    with pytest.raises(DeviceError, match=f"CUDA device {count} does not exist.*present devices: 0: "):
        backend.load(LINEAR, device=count)
    if backend.sim is not None:
        assert backend.sim.driver.live_allocations() == 0
        assert backend.sim.tensorrt.calls["deserialize_cuda_engine"] == 0


def test_garbage_bytes_are_refused(backend: Backend) -> None:
    junk = memoryview(b"definitely not an engine" * 8)
    with pytest.raises(EngineError, match="could not deserialize 192 engine bytes on device 0"):
        TensorRTEngine.load(junk, device=0, io_bindings=LINEAR.bindings, trt=backend.trt, cuda=backend.cuda)


@pytest.mark.parametrize(
    ("bindings", "message"),
    [
        ([IOBinding("x", "float32", (4, HIDDEN), True)], "do not match the engine's I/O tensors"),
        ([IOBinding("x", "float32", (4, HIDDEN), True), IOBinding("z", "float32", (4, HIDDEN), False)],
         "do not match"),
        ([IOBinding("x", "float32", (4, HIDDEN), False), IOBinding("y", "float32", (4, HIDDEN), True)],
         "binding 'x' is an output in io_bindings but not in the engine"),
        ([IOBinding("x", "float16", (4, HIDDEN), True), IOBinding("y", "float32", (4, HIDDEN), False)],
         "binding 'x' is float16 in io_bindings, float32 in the engine"),
        ([IOBinding("x", "float32", (8, HIDDEN), True), IOBinding("y", "float32", (4, HIDDEN), False)],
         rf"binding 'x' has shape \(8, {HIDDEN}\) in io_bindings, \(4, {HIDDEN}\) in the engine"),
        ([IOBinding("x", "float32", (4, HIDDEN), True), IOBinding("y", "float32", (4, HIDDEN, 1), False)],
         "binding 'y' has shape"),
    ],
)
def test_io_bindings_must_match_the_engine(backend: Backend, bindings, message: str) -> None:
    with pytest.raises(EngineError, match=message):
        backend.load(LINEAR, bindings=bindings)


def test_closed_engine_is_refused(backend: Backend) -> None:
    engine = backend.load(LINEAR)
    engine.configure(None, "automatic")
    engine.close()
    engine.close()
    assert "closed" in repr(engine)
    with pytest.raises(EngineError, match="linear_relu is closed"):
        engine.configure(None, "automatic")
    with pytest.raises(EngineError, match="is closed"):
        engine.infer_output_shapes([(4, HIDDEN)])


def test_unconfigured_engine_uses_the_automatic_budget(backend: Backend) -> None:
    with backend.load(LINEAR) as engine:
        x = RNG.standard_normal((4, HIDDEN)).astype(np.float32)
        _check(LINEAR, run(engine, backend.cuda, [x]), [x], backend.tolerance)
        assert engine.budget_source == "automatic"


# -- the simulated GPUs: failures real TensorRT rarely shows on demand -------------------------------
@pytest.fixture
def sim() -> Iterator[Any]:
    with simulated_gpus(2, memory=64 * MiB) as s:
        yield s


def _load(case: Case, device: int = 0) -> TensorRTEngine:
    return TensorRTEngine.load(memoryview(_ref_engine(case)), device=device, io_bindings=case.bindings, name=case.name)


def test_engine_bytes_reach_tensorrt_without_a_copy(sim, monkeypatch) -> None:
    seen = []
    original = FakeRuntime.deserialize_cuda_engine
    monkeypatch.setattr(FakeRuntime, "deserialize_cuda_engine",
                        lambda self, buf: seen.append(buf) or original(self, buf))
    data = memoryview(_ref_engine(LINEAR))
    TensorRTEngine.load(data, device=0, io_bindings=LINEAR.bindings).close()
    assert seen == [data] and seen[0] is data


def test_view_reader_seeks_within_the_engine_only(sim) -> None:
    from pyrt.device.stream_reader import view_reader

    trt = sim.tensorrt
    data = memoryview(b"0123456789")
    reader = view_reader(trt, data, 16 << 20)
    assert isinstance(reader, trt.IStreamReaderV2)
    assert reader.seek(-3, trt.SeekPosition.END)
    chunk = reader.read(100, 0)
    assert chunk == b"789" and isinstance(chunk, memoryview) and chunk.obj is data.obj  # a slice, not a copy
    assert reader.read(100, 0) == b""  # at the end
    assert reader.seek(2, trt.SeekPosition.SET) and reader.seek(3, trt.SeekPosition.CUR)
    assert reader.read(2, 0) == b"56"
    assert not reader.seek(11, trt.SeekPosition.SET) and not reader.seek(-1, trt.SeekPosition.SET)
    assert reader.read(1, 0) == b"7"  # a refused seek leaves the position alone
    assert view_reader(types.SimpleNamespace(), memoryview(b"x"), 1) is None  # flavour without readers


def test_addresses_are_bound_once_per_context_until_they_change(sim) -> None:
    x = RNG.standard_normal((4, HIDDEN)).astype(np.float32)
    calls = sim.tensorrt.calls
    with _load(LINEAR) as engine:
        engine.configure(None, "automatic")
        engine.infer_output_shapes([x.shape])
        xin, y1, y2 = (sim.cuda.alloc(x.nbytes, 0) for _ in range(3))
        sim.cuda.memcpy_htod(xin, x)
        with sim.cuda.stream(0) as s:
            for _ in range(3):
                engine.execute([xin.ptr], [y1.ptr], s.handle)
            assert calls["set_tensor_address"] == 2  # x and y, once
            engine.execute([xin.ptr], [y2.ptr], s.handle)  # a new output buffer is bound
            assert calls["set_tensor_address"] == 4
            engine.configure(None, "automatic")  # a new context has nothing bound
            engine.infer_output_shapes([x.shape])
            engine.execute([xin.ptr], [y2.ptr], s.handle)
            assert calls["set_tensor_address"] == 6
            s.synchronize()
        got = np.empty((4, HIDDEN), np.float32)
        sim.cuda.memcpy_dtoh(got, y2)
        _check(LINEAR, [got], [x], 1e-5)


def test_input_shapes_are_set_once_per_context_and_profile_until_they_change(sim) -> None:
    """A run whose shapes repeat the last (every decode step) neither re-checks nor re-sets them; new shapes, a
    new context and a profile switch (which drops the shapes in TensorRT) set them again."""
    from pyrt.sim.refengine import RefProfile

    calls = sim.tensorrt.calls
    ref = RefEngine([RefTensor("x", "float32", (-1, 4), (1, 4), (8, 4))], [RefTensor("y", "float32", (-1, 4))],
                    nodes=[RefNode("aten::relu", [Ref("x")], {}, ["y"])],
                    profiles=[RefProfile({"x": ((1, 4), (1, 4), (1, 4))}), RefProfile({"x": ((2, 4), (4, 4), (8, 4))})])
    bindings = [IOBinding("x", "float32", (-1, 4), True), IOBinding("y", "float32", (-1, 4), False)]
    with TensorRTEngine.load(memoryview(ref.to_bytes()), device=0, io_bindings=bindings) as engine, \
            sim.cuda.stream(0) as stream:
        engine.configure(None, "automatic")

        def prepare(rows: int) -> list[tuple[int, ...]]:
            engine.check_inputs([((rows, 4), "float32")])
            engine.use_profile(stream.handle)
            return engine.infer_output_shapes([(rows, 4)])

        assert [prepare(3) for _ in range(3)] == [[(3, 4)]] * 3
        assert calls["set_input_shape"] == 1
        assert prepare(5) == [(5, 4)] and calls["set_input_shape"] == 2  # new shapes, same profile
        assert prepare(1) == [(1, 4)] and prepare(1) == [(1, 4)]  # profile 0: shapes set once
        assert calls["set_input_shape"] == 3
        assert prepare(5) == [(5, 4)]  # back to profile 1: TensorRT dropped its shapes with the switch
        assert calls["set_input_shape"] == 4
        engine.configure(None, "automatic")  # a new context holds no shapes
        assert prepare(5) == [(5, 4)] and calls["set_input_shape"] == 5
        with pytest.raises(InputError, match="fit none of the engine.s optimization profiles"):
            engine.check_inputs([((9, 4), "float32")])
        with pytest.raises(InputError, match="must be float32"):
            engine.check_inputs([((5, 4), "float16")])  # the dtype is part of what was accepted


def test_engines_on_two_devices_run_where_they_live(sim) -> None:
    with _load(LINEAR, device=0) as e0, _load(LINEAR, device=1) as e1:
        x = RNG.standard_normal((4, HIDDEN)).astype(np.float32)
        for engine in (e1, e0, e1):
            _check(LINEAR, run(engine, sim.cuda, [x]), [x], 1e-5)


def test_pointer_on_another_device_fails_the_launch(sim) -> None:
    with _load(LINEAR, device=0) as engine, sim.cuda.alloc(4 * HIDDEN * 4, 1) as wrong, \
            sim.cuda.alloc(4 * HIDDEN * 4, 0) as right, sim.cuda.stream(0) as stream:
        engine.configure(None, "automatic")
        with pytest.raises(EngineError, match="illegal address .* memory of device 1"):
            engine.execute([wrong.ptr], [right.ptr], stream.handle)
        with pytest.raises(EngineError, match="illegal address .* no allocation"):
            engine.execute([right.ptr + (1 << 30)], [right.ptr], stream.handle)
        with sim.cuda.stream(1) as other:
            with pytest.raises(EngineError, match="is not a live stream of device 0"):
                engine.execute([right.ptr], [right.ptr], other.handle)
        with pytest.raises(EngineError, match="refused address 0x0 for 'x'"):
            engine.execute([0], [right.ptr], stream.handle)


def test_context_creation_failure_when_device_memory_runs_out() -> None:
    weights, scratch = W.nbytes + B.nbytes, W.nbytes  # the fake stages the largest weight
    with simulated_gpus(1, memory=scratch + weights // 2):
        with _load(LINEAR) as engine:
            assert engine.weight_streaming_scratch_memory_size == scratch
            with pytest.raises(EngineError, match="could not create an execution context .*out of device memory"):
                engine.configure(engine.streamable_weights_size, "load-time")
            engine.configure(0, "load-time")  # streaming everything fits
            assert engine.applied_budget == 0
            engine.configure(None, "automatic")  # the automatic budget fits by construction
            assert engine.applied_budget == weights // 2
    with simulated_gpus(1, memory=weights // 2):  # without streaming, the weights never fit
        with pytest.raises(EngineError, match="could not deserialize .*out of device memory"):
            TensorRTEngine.load(memoryview(_no_streaming_linear()), device=0, io_bindings=LINEAR.bindings)


def _no_streaming_linear() -> bytes:
    ref = RefEngine.from_bytes(_ref_engine(LINEAR))
    return dataclasses.replace(ref, weight_streaming=False).to_bytes()


def test_failed_automatic_budget_retries_with_zero(sim, caplog) -> None:
    with _load(LINEAR) as engine, caplog.at_level(logging.WARNING, "pyrt.engine"):
        engine.configure(100, "load-time")
        sim.tensorrt.inject_failure("weight_streaming_budget_v2")  # the automatic value does not take
        engine.configure(None, "automatic")
        assert engine.applied_budget == 0 and "retrying with 0" in caplog.text
        engine.configure(100, "load-time")
        sim.tensorrt.inject_failure("weight_streaming_budget_v2", times=2)
        with pytest.raises(EngineError, match="did not accept weight-streaming automatic budget "
                                              f"{W.nbytes + B.nbytes} nor the fallback 0 \\(reads back 100\\)"):
            engine.configure(None, "automatic")
        sim.tensorrt.inject_failure("weight_streaming_budget_v2")
        with pytest.raises(EngineError, match="did not accept weight-streaming budget 200 \\(reads back 100\\)"):
            engine.configure(200, "load-time")  # an explicit budget is never silently replaced


def test_fake_budget_setter_fails_like_tensorrt(sim) -> None:
    """Why configure drops the context first: the fake, like TensorRT, refuses otherwise."""
    logger = tensorrt_seam.make_logger(sim.tensorrt)
    sim.cuda.set_device(0)
    raw = sim.tensorrt.Runtime(logger).deserialize_cuda_engine(_ref_engine(LINEAR))
    assert raw.weight_streaming_budget_v2 == raw.streamable_weights_size  # streaming off by default
    raw.weight_streaming_budget_v2 = 100
    context = raw.create_execution_context()
    raw.weight_streaming_budget_v2 = 5  # the setter's failure is only logged, as in TensorRT's binding
    assert raw.weight_streaming_budget_v2 == 100
    assert "cannot change while execution contexts exist" in logger.messages.take()
    del context
    raw.weight_streaming_budget_v2 = -1
    assert raw.weight_streaming_budget_v2 == 100 and "non-negative" in logger.messages.take()
    raw.weight_streaming_budget_v2 = 5
    assert raw.weight_streaming_budget_v2 == 5 and logger.messages.take() == ""


@pytest.mark.parametrize(
    ("call", "action", "error", "message"),
    [
        ("create_execution_context", lambda e: e.configure(None, "automatic"), EngineError, "execution context"),
        ("set_input_shape", lambda e: e.infer_output_shapes([(2, 4), (2, 4)]), InputError, "refused shape"),
        ("infer_shapes", lambda e: e.infer_output_shapes([(2, 4), (2, 4)]), EngineError, "shape inference failed"),
        ("deserialize_cuda_engine", lambda e: None, EngineError, "could not deserialize"),
    ],
)
def test_tensorrt_failures_become_typed_errors(sim, call, action, error, message) -> None:
    sim.tensorrt.inject_failure(call)
    with pytest.raises(error, match=message):
        with _load(ADD_MUL) as engine:
            action(engine)


def test_failed_profile_query_is_an_engine_error(sim) -> None:
    # TensorRT always returns three Dims; a failed query's are invalid (nbDims -1), never a short list.
    sim.tensorrt.inject_failure("get_tensor_profile_shape")
    with pytest.raises(EngineError, match=r"no usable optimization profile for dynamic input 'a' of shape \(-1, 4\)"
                       r": TensorRT gives min/opt/max \[None, None, None\].*getProfileShape"):
        _load(ADD_MUL)


def test_stream_reader_that_cannot_be_created_is_a_device_error(sim, monkeypatch) -> None:
    import pyrt.engine

    # The real reader base dlopens libcuda in its constructor, before TensorRT is asked anything.
    monkeypatch.setattr(pyrt.engine, "STREAM_READER_MIN_BYTES", 0)
    sim.tensorrt.inject_failure("IStreamReaderV2")
    size = len(_ref_engine(LINEAR))
    with pytest.raises(DeviceError, match=rf"linear_relu: TensorRT \(fake_tensorrt\) could not create the stream "
                                          rf"reader for {size} engine bytes on device 0: .*Failed to open cuda driver"):
        _load(LINEAR)
    _load(LINEAR).close()  # the next load works


@pytest.mark.parametrize("name", ["streamable_weights_size", "weight_streaming_scratch_memory_size"])
def test_streaming_sizes_are_read_not_guessed(sim, monkeypatch, name: str) -> None:
    from pyrt.sim.fake_tensorrt import FakeCudaEngine

    with _load(ADD_MUL) as engine:  # built without weight streaming: TensorRT reads 0, it does not raise
        assert getattr(engine, name) == 0

    def broken(self: Any) -> int:
        raise RuntimeError("binding failure")

    with _load(ADD_MUL) as engine:
        monkeypatch.setattr(FakeCudaEngine, name, property(broken))
        with pytest.raises(EngineError, match=f"add_mul_dynamic: reading TensorRT's {name} raised RuntimeError: "
                                              "binding failure"):
            getattr(engine, name)
        monkeypatch.setattr(FakeCudaEngine, name, property(lambda self: -1))
        with pytest.raises(EngineError, match=f"TensorRT reports {name} = -1, not a byte count"):
            getattr(engine, name)


def test_failed_launch_and_refused_address_are_engine_errors(sim) -> None:
    with _load(ADD_MUL) as engine, sim.cuda.alloc(64, 0) as buf, sim.cuda.stream(0) as stream:
        engine.infer_output_shapes([(2, 4), (2, 4)])
        ptrs = [buf.ptr, buf.ptr + 32]
        sim.tensorrt.inject_failure("set_tensor_address")
        with pytest.raises(EngineError, match="refused address"):
            engine.execute(ptrs, ptrs, stream.handle)
        sim.tensorrt.inject_failure("execute_async_v3")
        with pytest.raises(EngineError, match="execute_async_v3 failed on device 0: enqueueV3: injected"):
            engine.execute(ptrs, ptrs, stream.handle)
        engine.execute(ptrs, ptrs, stream.handle)  # and then it works


def test_closing_releases_device_memory(sim) -> None:
    engine = TensorRTEngine.load(memoryview(_no_streaming_linear()), device=1, io_bindings=LINEAR.bindings)
    engine.configure(None, "automatic")
    assert sim.driver.memory_used(1) == W.nbytes + B.nbytes
    engine.close()
    assert sim.driver.memory_used(1) == 0


def test_real_tensorrt_rtx_engine_bytes_are_refused_by_the_fake(sim, rtx_engine_bytes: bytes) -> None:
    with pytest.raises(EngineError, match="deserializes only pyrt reference engines.*a serialized TensorRT engine.*"
                                          "export with --builder portable or --builder reference"):
        TensorRTEngine.load(memoryview(rtx_engine_bytes), device=0, io_bindings=LINEAR.bindings)


def test_tensorrt_rtx_on_an_unsupported_gpu_is_a_device_error(rtx_engine_bytes: bytes) -> None:
    """TensorRT-RTX refuses Hopper (seen on an H100): pyrt says so before deserializing."""
    import tensorrt_rtx

    with simulated_gpus(1, capability=(9, 0), name="H100") as sim:
        with pytest.raises(DeviceError, match=r"tensorrt_rtx .* does not run engines on compute capability 9\.0 "
                                              r"\(it targets .*8\.9.*\); device 0: H100"):
            TensorRTEngine.load(memoryview(rtx_engine_bytes), device=0, io_bindings=LINEAR.bindings, trt=tensorrt_rtx,
                                cuda=sim.cuda)


@pytest.fixture(scope="module")
def rtx_engine_bytes() -> bytes:
    """A real TensorRT-RTX engine, built on this (GPU-less) machine once per module (~3 s)."""
    trt = pytest.importorskip("tensorrt_rtx")
    pytest.importorskip("torch")
    pytest.importorskip("onnx")
    return build_real_engine(trt, LINEAR)


# -- the TensorRT seam ------------------------------------------------------------------------------------
def test_missing_flavour_lists_what_was_tried(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # an import of it raises ImportError
    with pytest.raises(BackendError, match="no usable TensorRT flavour; tried tensorrt: ModuleNotFoundError"):
        tensorrt_seam.load_tensorrt("tensorrt")
    with pytest.raises(BackendError, match="unknown TensorRT flavour 'tensorrt_nano'"):
        tensorrt_seam.load_tensorrt("tensorrt_nano")


def test_default_order_reports_every_flavour(monkeypatch) -> None:
    for name in tensorrt_seam.FLAVOURS:
        monkeypatch.setitem(sys.modules, name, None)
    with simulated_gpus(1) as sim, tensorrt_seam.use_tensorrt(None):
        with pytest.raises(BackendError) as info:
            tensorrt_seam.load_tensorrt(cuda=sim.cuda)
    for name in tensorrt_seam.FLAVOURS:
        assert f"{name}: " in str(info.value)


def test_explicit_module_and_default_override() -> None:
    with simulated_gpus(1) as sim:
        assert tensorrt_seam.load_tensorrt() is sim.tensorrt
        assert tensorrt_seam.load_tensorrt(sim.tensorrt) is sim.tensorrt


def test_tensorrt_rtx_flavour_imports_by_name() -> None:
    pytest.importorskip("tensorrt_rtx")
    assert tensorrt_seam.flavour_of(tensorrt_seam.load_tensorrt("tensorrt_rtx")) == "tensorrt_rtx"


def test_tensorrt_lean_is_never_imported_without_a_device(tmp_path, monkeypatch) -> None:
    package = tmp_path / "tensorrt_lean"
    package.mkdir()
    (package / "__init__.py").write_text("raise SystemExit('tensorrt_lean was imported without a device')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "tensorrt_lean", raising=False)
    with simulated_gpus(0) as sim:
        with pytest.raises(DeviceError, match="tensorrt_lean: installed but not imported, it needs a CUDA device"):
            tensorrt_seam.load_tensorrt("tensorrt_lean", cuda=sim.cuda)
        lean_module = types.ModuleType("tensorrt_lean")
        with pytest.raises(DeviceError, match="tensorrt_lean needs a CUDA device .*no CUDA devices"):
            tensorrt_seam.load_tensorrt(lean_module, cuda=sim.cuda)
    assert "tensorrt_lean" not in sys.modules


def test_no_runtime_is_created_without_a_device() -> None:
    """The fake's Runtime "crashes" like tensorrt_lean without a GPU: pyrt must not get there."""
    with simulated_gpus(0) as sim:
        with pytest.raises(DeviceError, match="needs a CUDA device before any TensorRT runtime call"):
            tensorrt_seam.create_runtime(sim.tensorrt, cuda=sim.cuda)
        with pytest.raises(DeviceError, match="CUDA device 0 does not exist"):
            _load(LINEAR)
        assert sim.tensorrt.calls["deserialize_cuda_engine"] == 0


@pytest.mark.parametrize("flavour", ["fake", "tensorrt_rtx"])
def test_dtype_mapping_round_trips(flavour: str) -> None:
    trt = FakeTensorRT(None) if flavour == "fake" else pytest.importorskip(flavour)  # type: ignore[arg-type]
    for name in ("float32", "float16", "bfloat16", "int8", "int32", "int64", "bool", "uint8"):
        assert tensorrt_seam.dtype_from_trt(tensorrt_seam.dtype_to_trt(trt, name)) == name
    assert tensorrt_seam.dtype_from_trt(trt.DataType.FLOAT) == "float32"
    with pytest.raises(BackendError, match="'complex64' has no TensorRT equivalent"):
        tensorrt_seam.dtype_to_trt(trt, "complex64")


def test_logger_keeps_errors_for_messages(caplog) -> None:
    trt = FakeTensorRT(None)  # type: ignore[arg-type]
    logger = tensorrt_seam.make_logger(trt)
    with caplog.at_level(logging.DEBUG, "pyrt.tensorrt"):
        logger.log(trt.ILogger.Severity.WARNING, "careful")
        logger.log(trt.ILogger.Severity.ERROR, "broken")
        logger.log(trt.ILogger.Severity.INTERNAL_ERROR, "very broken")
    assert logger.messages.take() == "broken | very broken"
    assert logger.messages.take() == ""
    assert "careful" in caplog.text


def test_the_old_name_still_imports_with_a_deprecation_warning() -> None:
    """``pyrt.engine.Engine`` was this class's name (pyrt.llm.Engine is the one ``Engine`` now)."""
    with pytest.warns(DeprecationWarning, match=r"pyrt\.engine\.Engine is now pyrt\.engine\.TensorRTEngine "
                                                r"\(pyrt\.llm\.Engine is the LLM engine\)"):
        from pyrt.engine import Engine
    assert Engine is TensorRTEngine
    with pytest.raises(AttributeError, match="module 'pyrt.engine' has no attribute 'Engines'"):
        pyrt.engine.Engines  # noqa: B018 - the lookup is what is tested
