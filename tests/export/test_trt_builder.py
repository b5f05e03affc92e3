"""pyrt.export.trt_builder: real TensorRT-RTX engines built on the CPU (ahead of time).

TensorRT-RTX builds without a GPU; only deserializing its engines needs one, so that
check is the single GPU test. The TensorRT-10-like flavour below is a fake at the lowest
seam (the tensorrt module): it wraps the real tensorrt_rtx and only changes what
TensorRT 10 does differently (weakly typed networks by default, no ComputeCapability).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
trt = pytest.importorskip("tensorrt_rtx")
onnx = pytest.importorskip("onnx")

from pyrt.errors import ExportError  # noqa: E402
from pyrt.export._tensorrt.flavour import parse_compute_capabilities, resolve_flavour  # noqa: E402
from pyrt.export._tensorrt.shapes import parse_dynamic_shapes  # noqa: E402
from pyrt.export.trt_builder import (  # noqa: E402
    STAGES,
    BuiltEngine,
    build_engine,
    build_engine_from_onnx,
)
from pyrt.format.trt_blob import IOBinding, encode_blob, parse_blob  # noqa: E402
from tests.conftest import cuda_device_count  # noqa: E402


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 32)
        self.fc2 = torch.nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class ConvNet(torch.nn.Module):
    """Two inputs of different dtypes, two outputs: checks argument and output order."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 6, 3, padding=1)
        self.head = torch.nn.Linear(6, 5)

    def forward(self, image: torch.Tensor, steps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = torch.relu(self.conv(image))
        return features, self.head(features.mean((2, 3))) + steps.to(torch.float32)


def _mlp_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(3, 8),)


def _conv_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(2, 3, 10, 12), torch.arange(2, dtype=torch.int64).reshape(2, 1))


def _expected(module: torch.nn.Module, examples: tuple[torch.Tensor, ...]) -> list[tuple[str, tuple[int, ...]]]:
    """Output dtypes and shapes as torch itself computes them."""
    with torch.no_grad():
        out = module(*examples)
    outs = out if isinstance(out, tuple) else (out,)
    return [(str(o.dtype).removeprefix("torch."), tuple(o.shape)) for o in outs]


# -- session fixtures: each is one real ONNX export + TensorRT-RTX build -------------------------


@pytest.fixture(scope="session")
def mlp() -> tuple[MLP, tuple[torch.Tensor, ...], BuiltEngine, list[str]]:
    torch.manual_seed(0)
    model, examples, stages = MLP().eval(), _mlp_inputs(), []
    return model, examples, build_engine(model, examples, flavour="tensorrt_rtx", progress=stages.append), stages


@pytest.fixture(scope="session")
def conv() -> tuple[ConvNet, tuple[torch.Tensor, ...], BuiltEngine]:
    torch.manual_seed(0)
    model, examples = ConvNet().eval(), _conv_inputs()
    built = build_engine(model, examples, flavour="tensorrt_rtx", weight_streaming=True,
                         input_names=["image", "steps"], output_names=["features", "logits"])
    return model, examples, built


@pytest.fixture(scope="session")
def mlp_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The MLP as an ONNX file, to build several engines from one export."""
    path = tmp_path_factory.mktemp("onnx") / "mlp.onnx"
    torch.manual_seed(0)
    torch.onnx.export(MLP().eval(), _mlp_inputs(), str(path), dynamo=True, external_data=True)
    return path


# -- successful builds -------------------------------------------------------------------------


def test_mlp_bindings_match_the_model(mlp) -> None:
    model, examples, built, _ = mlp
    assert built.flavour == "tensorrt_rtx"
    assert built.inputs == [IOBinding("x", "float32", (3, 8), True)]
    assert [(b.dtype, b.shape) for b in built.outputs] == _expected(model, examples)
    assert all(not b.is_input for b in built.outputs)
    assert built.streamable_weights is False
    assert isinstance(built.engine, memoryview) and built.engine.nbytes > 0
    assert built.build_seconds > 0


def test_progress_reports_every_stage_in_order(mlp) -> None:
    assert mlp[3] == list(STAGES)


def test_conv_bindings_follow_argument_and_output_order(conv) -> None:
    model, examples, built = conv
    assert [(b.name, b.dtype, b.shape) for b in built.inputs] == [
        ("image", "float32", (2, 3, 10, 12)), ("steps", "int64", (2, 1))]
    assert [b.name for b in built.outputs] == ["features", "logits"]
    assert [(b.dtype, b.shape) for b in built.outputs] == _expected(model, examples)
    assert built.streamable_weights is True


def test_built_engine_round_trips_through_a_tr01_blob(conv) -> None:
    _, _, built = conv
    blob = parse_blob(encode_blob(built.engine, built.inputs + built.outputs))
    assert bytes(blob.engine) == bytes(built.engine)
    assert blob.inputs == built.inputs and blob.outputs == built.outputs


def test_weight_streaming_flag_reaches_the_builder(mlp_onnx: Path) -> None:
    plain = build_engine_from_onnx(mlp_onnx, flavour="tensorrt_rtx")
    again = build_engine_from_onnx(mlp_onnx, flavour="tensorrt_rtx")
    streaming = build_engine_from_onnx(mlp_onnx, flavour="tensorrt_rtx", weight_streaming=True)
    assert bytes(plain.engine) == bytes(again.engine), "builds are deterministic, so a difference means the flag"
    assert bytes(streaming.engine) != bytes(plain.engine)
    assert (plain.streamable_weights, streaming.streamable_weights) == (False, True)
    assert streaming.inputs == plain.inputs and streaming.outputs == plain.outputs


def test_dynamic_fp16_named_build() -> None:
    torch.manual_seed(0)
    model = MLP().eval()
    built = build_engine(model, _mlp_inputs(), flavour="tensorrt_rtx", fp16=True, workspace=64 << 20,
                         dynamic_shapes={"inp": {"min": [1, 8], "opt": [3, 8], "max": [64, 8]}},
                         input_names=["inp"], output_names=["out"], compute_capabilities=["sm86", "12.0"])
    assert built.inputs == [IOBinding("inp", "float16", (-1, 8), True)]
    assert built.outputs == [IOBinding("out", "float16", (-1, 4), False)]
    assert model.fc1.weight.dtype == torch.float32, "fp16 must convert a copy, not the caller's module"


def test_auto_prefers_tensorrt_then_rtx(mlp_onnx: Path) -> None:
    built = build_engine_from_onnx(mlp_onnx, flavour="auto")
    if importlib.util.find_spec("tensorrt") is None:
        assert built.flavour == "tensorrt_rtx"
    else:
        assert built.flavour in ("tensorrt", "tensorrt_rtx")


def test_importing_the_builder_pulls_in_neither_torch_nor_tensorrt() -> None:
    code = ("import sys, pyrt.export.trt_builder; "
            "print(sorted(m for m in ('torch', 'tensorrt', 'tensorrt_rtx', 'onnx') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- TensorRT 10 (weakly typed by default), faked at the module seam ---------------------------


def _tensorrt10_like() -> types.ModuleType:
    """tensorrt_rtx posing as TensorRT 10: create_network(0) is weakly typed, a weakly typed
    network refuses WEIGHT_STREAMING as TensorRT 10 does, and there is no ComputeCapability."""
    fake = types.ModuleType("tensorrt")
    for name in dir(trt):
        if not name.startswith("__") and name != "ComputeCapability":
            setattr(fake, name, getattr(trt, name))
    strong = trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED

    class Network:
        def __init__(self, network: object, strongly_typed: bool) -> None:
            self.real, self.strongly_typed = network, strongly_typed

        def get_flag(self, flag: object) -> bool:
            return self.strongly_typed if flag == strong else self.real.get_flag(flag)

        def __getattr__(self, name: str) -> object:
            return getattr(self.real, name)

    class Builder:
        def __init__(self, logger: object) -> None:
            self.real, self.logger = trt.Builder(logger), logger

        def create_network(self, flags: int) -> Network:
            return Network(self.real.create_network(0), bool(flags & (1 << int(strong))))

        def _refuses(self, network: Network, config: object) -> bool:
            if config.get_flag(trt.BuilderFlag.WEIGHT_STREAMING) and not network.strongly_typed:
                self.logger.log(trt.ILogger.Severity.ERROR, "WEIGHT_STREAMING needs a strongly typed network")
                return True
            return False

        def build_serialized_network(self, network: Network, config: object) -> object:
            return None if self._refuses(network, config) else self.real.build_serialized_network(network.real, config)

        def build_serialized_network_to_stream(self, network: Network, config: object, writer: object) -> bool:
            if self._refuses(network, config):
                return False
            return self.real.build_serialized_network_to_stream(network.real, config, writer)

        def __getattr__(self, name: str) -> object:
            return getattr(self.real, name)

    fake.Builder = Builder
    fake.OnnxParser = lambda network, logger: trt.OnnxParser(network.real, logger)
    return fake


def test_tensorrt10_gets_a_strongly_typed_network_for_weight_streaming(mlp_onnx: Path, monkeypatch) -> None:
    from pyrt.export import trt_builder

    monkeypatch.setattr(trt_builder, "STREAM_MIN", 0)  # stream even this small engine
    built = build_engine_from_onnx(mlp_onnx, flavour=_tensorrt10_like(), weight_streaming=True)
    assert (built.flavour, built.streamable_weights) == ("tensorrt", True)
    assert built.engine.nbytes > 0
    out = Recorder()
    streamed = build_engine_from_onnx(mlp_onnx, flavour=_tensorrt10_like(), weight_streaming=True, out=out)
    assert (streamed.route, bytes(out.data)) == ("stream", bytes(built.engine))


# -- streamed builds: the engine goes to `out` as TensorRT serializes it -------------------------


class Recorder:
    """An ``out`` that keeps what it is given and how (sizes of each write call)."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.data, self.sizes, self.fail_after = bytearray(), [], fail_after

    def write(self, chunk: object) -> int:
        if self.fail_after is not None and len(self.sizes) >= self.fail_after:
            raise OSError(28, "No space left on device")
        view = memoryview(chunk).cast("B")
        self.sizes.append(view.nbytes)
        self.data += view
        return view.nbytes


def _without_stream_writer() -> types.ModuleType:
    """tensorrt_rtx whose builder lacks build_serialized_network_to_stream (an older TensorRT)."""
    fake = types.ModuleType("tensorrt_rtx")
    for name in dir(trt):
        if not name.startswith("__"):
            setattr(fake, name, getattr(trt, name))

    class Builder:
        def __init__(self, logger: object) -> None:
            self.real = trt.Builder(logger)

        def __getattr__(self, name: str) -> object:
            if name == "build_serialized_network_to_stream":
                raise AttributeError(name)
            return getattr(self.real, name)

    fake.Builder = Builder
    return fake


def test_streamed_build_writes_the_in_memory_engine_in_bounded_chunks(mlp_onnx: Path, monkeypatch) -> None:
    from pyrt.export import trt_builder
    from pyrt.export._tensorrt import serialize

    in_memory = build_engine_from_onnx(mlp_onnx, flavour="tensorrt_rtx")
    small = Recorder()
    kept = build_engine_from_onnx(mlp_onnx, flavour="tensorrt_rtx", out=small)
    assert (kept.route, kept.engine, bytes(small.data)) == ("memory", None, bytes(in_memory.engine)), \
        "an engine under STREAM_MIN is built in memory (a streamed build holds ~64 MiB), then written"
    monkeypatch.setattr(serialize, "OUT_CHUNK", 4096)
    monkeypatch.setattr(trt_builder, "STREAM_MIN", 0)
    out = Recorder()
    streamed = build_engine_from_onnx(mlp_onnx, flavour="tensorrt_rtx", out=out)
    assert (streamed.route, streamed.engine, streamed.size) == ("stream", None, len(out.data))
    assert bytes(out.data) == bytes(in_memory.engine), "builds are deterministic: the stream is the engine"
    assert max(out.sizes) <= 4096 and len(out.sizes) >= len(out.data) // 4096
    assert (streamed.inputs, streamed.outputs) == (in_memory.inputs, in_memory.outputs)
    assert in_memory.route == "memory" and in_memory.size == in_memory.engine.nbytes


def test_flavour_without_a_stream_writer_falls_back_to_memory(mlp_onnx: Path) -> None:
    out = Recorder()
    built = build_engine_from_onnx(mlp_onnx, flavour=_without_stream_writer(), out=out)
    assert (built.route, built.engine, built.size) == ("memory", None, len(out.data))
    assert bytes(out.data) == bytes(build_engine_from_onnx(mlp_onnx, flavour="tensorrt_rtx").engine)


def test_a_failing_out_is_an_export_error_not_a_crash(mlp_onnx: Path) -> None:
    with pytest.raises(ExportError, match=r"writing the tensorrt_rtx engine .* failed after \d+ bytes: "
                                          r"OSError: .*No space left on device") as info:
        build_engine_from_onnx(mlp_onnx, flavour="tensorrt_rtx", out=Recorder(fail_after=0))
    assert isinstance(info.value.__cause__, OSError)


class TransposedWeight(torch.nn.Module):
    """``x @ w.T`` with a 2 MiB weight: onnxscript would fold the Transpose into a copy of ``w``."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(1024, 512), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.w.t()


def test_parser_reads_the_module_weights_in_place(monkeypatch) -> None:
    from pyrt.export import trt_builder
    from pyrt.export._tensorrt import torch_onnx

    torch.manual_seed(0)
    model, examples = TransposedWeight().eval(), (torch.randn(2, 512),)
    seen: dict[str, object] = {}
    real = trt_builder.parse_over_module_weights

    def spy(session, parser, network, path, weights) -> None:
        seen.update(weights)
        real(session, parser, network, path, weights)

    monkeypatch.setattr(trt_builder, "parse_over_module_weights", spy)
    in_place = build_engine(model, examples, flavour="tensorrt_rtx")
    big = [w for w in seen.values() if w.nbytes == model.w.nbytes]
    assert [w.data_ptr() for w in big] == [model.w.data_ptr()], "the parser got the module's tensor, not a copy"
    monkeypatch.setattr(torch_onnx, "module_initializers", lambda program: {})
    from_file = build_engine(model, examples, flavour="tensorrt_rtx")  # parse_from_file: the parser's own copy
    assert bytes(in_place.engine) == bytes(from_file.engine)


class SmallTransposedWeights(torch.nn.Module):
    """Two ``x @ w.T`` of 128 KiB weights, under the size onnxscript folds constants at."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Parameter(torch.randn(256, 128), requires_grad=False)
        self.b = torch.nn.Parameter(torch.randn(128, 256), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x @ self.a.t()) @ self.b.t()


@pytest.mark.parametrize("model_class", [TransposedWeight, SmallTransposedWeights])
def test_to_pte_hands_the_parser_the_modules_own_weights(model_class, monkeypatch, tmp_path) -> None:
    """``to_pte``'s route (the partition translated to ONNX directly) parses over the module's tensors too:
    no copy read back from the external data file, and no transposed copy of a weight of any size."""
    from pyrt.export import to_pte, trt_builder

    torch.manual_seed(0)
    model = model_class().eval()
    seen: dict[str, object] = {}
    real = trt_builder.parse_over_module_weights

    def spy(session, parser, network, path, weights) -> None:
        seen.update(weights)
        real(session, parser, network, path, weights)

    monkeypatch.setattr(trt_builder, "parse_over_module_weights", spy)
    to_pte(model, tmp_path / "m.pte", (torch.randn(2, model.parameters().__next__().shape[1]),),
           builder="tensorrt_rtx", progress=False)
    given = {w.data_ptr() for w in seen.values()}
    assert {p.data_ptr() for p in model.parameters()} <= given, "a weight reached the parser as a copy"


def test_the_onnx_step_writes_no_copy_of_the_weights(monkeypatch, tmp_path) -> None:
    """The parser takes the weights from memory, so the ONNX file references them without writing them
    (a copy of the model on disk, or in memory where the temporary folder is a tmpfs)."""
    from pyrt.export import to_pte
    from pyrt.export._engines import builders

    torch.manual_seed(0)
    model = TransposedWeight().eval()
    written: list[int] = []
    real = builders.export_partition

    def spy(module, path, *args):
        out = real(module, path, *args)
        written.append(sum(f.stat().st_size for f in path.parent.iterdir()))
        return out

    monkeypatch.setattr(builders, "export_partition", spy)
    to_pte(model, tmp_path / "m.pte", (torch.randn(2, 512),), builder="tensorrt_rtx", progress=False)
    assert written and written[0] < model.w.nbytes // 100, f"the ONNX step wrote {written[0]} bytes"


def test_stream_writer_subclass_initialises_the_pybind_base() -> None:
    from pyrt.export._tensorrt.serialize import stream_writer

    writer = stream_writer(trt, Recorder())
    assert isinstance(writer, trt.IStreamWriter)
    assert writer.write(b"abc") == 3 and writer.size == 3  # a Python call works once the base is initialised
    assert stream_writer(types.ModuleType("no_writer"), Recorder()) is None


def test_stream_writer_also_takes_the_documented_capsule_and_size() -> None:
    """The binding documents ``write(data: capsule, size)``; TensorRT-RTX 1.7.1 passes bytes instead.
    Both forms write the same bytes."""
    import ctypes

    from pyrt.export._tensorrt.serialize import stream_writer

    raw = ctypes.create_string_buffer(b"engine-bytes", 12)
    new = ctypes.pythonapi.PyCapsule_New
    new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    out = Recorder()
    writer = stream_writer(trt, out)
    assert writer.write(new(ctypes.addressof(raw), None, None), 12) == 12
    assert writer.write(b"+tail") == 5
    assert bytes(out.data) == b"engine-bytes+tail" and writer.error is None


def test_compute_capabilities_need_tensorrt_rtx(mlp_onnx: Path) -> None:
    with pytest.raises(ExportError, match="only TensorRT-RTX"):
        build_engine_from_onnx(mlp_onnx, flavour=_tensorrt10_like(), compute_capabilities=["sm86"])


# -- failures name the problem -----------------------------------------------------------------


class Det(torch.nn.Module):
    def forward(self, a: torch.Tensor) -> torch.Tensor:
        return torch.linalg.det(a)


def test_parser_rejection_names_the_node_and_op() -> None:
    with pytest.raises(ExportError, match=r"OnnxParser rejected.*node 0 .*\(op Det\)"):
        build_engine(Det().eval(), (torch.randn(3, 3),), flavour="tensorrt_rtx")


def test_unknown_onnx_op_is_reported(tmp_path: Path) -> None:
    from onnx import TensorProto, helper

    node = helper.make_node("PyrtBogus", ["x"], ["y"], name="bogus_node", domain="pyrt.test")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("pyrt.test", 1)])
    onnx.save(model, str(tmp_path / "bogus.onnx"))
    with pytest.raises(ExportError, match=r"'bogus_node' \(op PyrtBogus\)"):
        build_engine_from_onnx(tmp_path / "bogus.onnx", flavour="tensorrt_rtx")


def test_corrupt_and_missing_onnx_files(tmp_path: Path) -> None:
    (tmp_path / "junk.onnx").write_bytes(b"\x00not a protobuf\xff" * 8)
    with pytest.raises(ExportError, match="OnnxParser (rejected|found no outputs)"):
        build_engine_from_onnx(tmp_path / "junk.onnx", flavour="tensorrt_rtx")
    with pytest.raises(ExportError, match="does not exist"):
        build_engine_from_onnx(tmp_path / "absent.onnx", flavour="tensorrt_rtx")


def test_failed_build_reports_tensorrt_errors(mlp_onnx: Path) -> None:
    # TensorRT-RTX cannot compile an FP32 GEMM for Turing, so build_serialized_network returns None.
    with pytest.raises(ExportError, match=r"returned no engine.*TensorRT said: .*\S"):
        build_engine_from_onnx(mlp_onnx, flavour="tensorrt_rtx", compute_capabilities=["sm75"])


def test_current_compute_capability_needs_a_gpu(mlp_onnx: Path) -> None:
    if cuda_device_count() > 0:
        pytest.skip("a CUDA device is present: 'current' builds here (see the gpu test)")
    with pytest.raises(ExportError, match=r"returned no engine.*'current' needs a visible CUDA GPU"):
        build_engine_from_onnx(mlp_onnx, flavour="tensorrt_rtx", compute_capabilities=["current"])


@pytest.mark.parametrize("flavour", ["tensorrt_lean", "tensorrt_dispatch", types.ModuleType("tensorrt_lean")])
def test_runtime_only_flavours_have_no_builder(flavour) -> None:
    with pytest.raises(ExportError, match="runtime-only TensorRT package and has no builder"):
        build_engine(MLP(), _mlp_inputs(), flavour=flavour)


def test_unknown_flavours() -> None:
    with pytest.raises(ExportError, match="'tensorrt_nano' is not one of"):
        resolve_flavour("tensorrt_nano")
    with pytest.raises(ExportError, match="has no Builder, OnnxParser, ILogger"):
        resolve_flavour(types.ModuleType("not_tensorrt"))


GOOD = {"min": [1, 8], "opt": [3, 8], "max": [16, 8]}


@pytest.mark.parametrize(("spec", "message"), [
    ([("x", GOOD)], "must be a dict"),
    ({"x": {"min": [1, 8], "max": [16, 8]}}, r"dynamic_shapes\['x'\] must be a dict with exactly"),
    ({"x": {**GOOD, "min": [4, 8], "opt": [8, 8]}},
     r"dynamic_shapes\['x'\] dim 0 spans 4..16, but the example input has size 3"),
    ({"x": {**GOOD, "opt": [32, 8]}}, r"dim 0: need 0 <= min <= opt <= max, got 1, 32, 16"),
    ({"x": {**GOOD, "max": [16, 8, 1]}}, "differ in rank"),
    ({"x": {"min": [1], "opt": [3], "max": [16]}}, "has rank 1, its example input has shape"),
    ({"x": {**GOOD, "min": "1,8"}}, r"\['min'\] must be a list of ints"),
    ({"y": GOOD}, r"'y' is not an input name; the inputs are \['x'\]"),
    ({1: GOOD}, "not an input position"),
    ({"x": GOOD, 0: GOOD}, "twice"),
])
def test_bad_dynamic_shapes_are_rejected_before_export(spec, message) -> None:
    with pytest.raises(ExportError, match=message):
        build_engine(MLP(), _mlp_inputs(), flavour="tensorrt_rtx", dynamic_shapes=spec)


class FixedBatch(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(3, 8) * 2


def test_dynamic_dim_specialised_by_the_model_is_reported() -> None:
    # torch.export refuses first (Dim.DYNAMIC traced to a constant); the post-parse check backs it up.
    with pytest.raises(ExportError, match=r"static shape of 3 for dimension inputs\['x'\]|fixed it to 3"):
        build_engine(FixedBatch().eval(), _mlp_inputs(), flavour="tensorrt_rtx",
                     dynamic_shapes={0: {"min": [1, 8], "opt": [3, 8], "max": [16, 8]}})


def test_range_on_a_static_onnx_dim_is_reported(mlp_onnx: Path) -> None:
    with pytest.raises(ExportError, match=r"dim 0 of input 0 \('x'\) to range 1..16, but the network fixed it to 3"):
        build_engine_from_onnx(mlp_onnx, flavour="tensorrt_rtx", dynamic_shapes={"x": GOOD})
    with pytest.raises(ExportError, match=r"names input 'z', but the network's inputs are \['x'\]"):
        build_engine_from_onnx(mlp_onnx, flavour="tensorrt_rtx", dynamic_shapes={"z": GOOD})


def test_a_profile_shape_tensorrt_refuses_is_an_export_error() -> None:
    from pyrt.export._tensorrt import config as trt_config
    from pyrt.export._tensorrt import flavour as trt_flavour
    from pyrt.export._tensorrt import network as trt_network

    # parse_dynamic_shapes refuses negative dims before this point; here TensorRT's own check
    # runs, and its binding raises RuntimeError ("Shape provided for min is inconsistent ...").
    session = trt_flavour.open_session("tensorrt_rtx", trt_flavour.build_options(False, None, None))
    network = trt_network.strongly_typed_network(session)
    network.add_input("x", trt.DataType.FLOAT, (-1, 4))
    config = session.builder.create_builder_config()
    with pytest.raises(ExportError, match=r"dynamic_shapes for input 'x': tensorrt_rtx refused "
                                          r"\(\(-2, 4\), \(2, 4\), \(9, 4\)\): Shape provided for min"):
        trt_config._add_profile(session, network, config, {0: ((-2, 4), (2, 4), (9, 4))})


def test_dynamic_onnx_input_needs_a_range(tmp_path: Path) -> None:
    from onnx import TensorProto, helper

    node = helper.make_node("Relu", ["x"], ["y"], name="relu")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "relu.onnx"))
    with pytest.raises(ExportError, match=r"input 0 \('x'\) has dynamic shape \(-1, 4\) but dynamic_shapes"):
        build_engine_from_onnx(tmp_path / "relu.onnx", flavour="tensorrt_rtx")
    built = build_engine_from_onnx(tmp_path / "relu.onnx", flavour="tensorrt_rtx",
                                   dynamic_shapes={0: {"min": [1, 4], "opt": [2, 4], "max": [9, 4]}})
    assert built.inputs == [IOBinding("x", "float32", (-1, 4), True)]
    assert built.outputs == [IOBinding("y", "float32", (-1, 4), False)]


def test_float64_inputs_are_refused() -> None:
    with pytest.raises(ExportError, match=r"input 0 \('x'\) is float64 in the module but float32"):
        build_engine(MLP().double().eval(), (torch.randn(3, 8, dtype=torch.float64),), flavour="tensorrt_rtx")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"compute_capabilities": ["sm90"]}, r"compute_capabilities\[0\] = 'sm90' is not one of"),
    ({"compute_capabilities": ["current", "sm86"]}, "'current' must be the only target"),
    ({"compute_capabilities": "sm86"}, "must be a non-empty list"),
    ({"workspace": 0}, "workspace must be a positive number of bytes"),
    ({"weight_streaming": "yes"}, "weight_streaming must be a bool"),
    ({"input_names": ["a", "b"]}, "2 names for 1 example inputs"),
    ({"output_names": ["o", "o"]}, "repeats a name"),
])
def test_bad_options_are_rejected(kwargs, message) -> None:
    with pytest.raises(ExportError, match=message):
        build_engine(MLP(), _mlp_inputs(), flavour="tensorrt_rtx", **kwargs)


def test_bad_modules_and_examples() -> None:
    with pytest.raises(ExportError, match=r"example_inputs\[1\] is a int, not a torch.Tensor"):
        build_engine(MLP(), (torch.randn(3, 8), 4))
    with pytest.raises(ExportError, match="needs a torch.nn.Module"):
        build_engine(lambda x: x, _mlp_inputs())


def test_parsers_normalise() -> None:
    assert parse_compute_capabilities(["SM_75", "8.0", "sm121"]) == ("SM75", "SM80", "SM121")
    assert parse_compute_capabilities(["Current"]) == ("CURRENT",)
    assert parse_dynamic_shapes({"b": {"min": [1], "opt": [2], "max": [2]}}, ["a", "b"], [(5,), (2,)]) == {
        1: ((1,), (2,), (2,))}


# -- GPU: the engine deserializes and its I/O matches the bindings -----------------------------


@pytest.mark.gpu  # conftest skips it without a CUDA device: TensorRT-RTX deserializes only on a GPU
def test_engine_deserializes_with_the_reported_io(conv) -> None:
    _skip_unsupported_gpu()
    _, _, built = conv
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    engine = runtime.deserialize_cuda_engine(built.engine)
    assert engine is not None
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    assert names == [b.name for b in built.inputs + built.outputs]
    for b in built.inputs + built.outputs:
        is_input = engine.get_tensor_mode(b.name) == trt.TensorIOMode.INPUT
        assert (is_input, tuple(engine.get_tensor_shape(b.name))) == (b.is_input, b.shape)
    assert engine.streamable_weights_size > 0


def test_current_on_a_gpu_the_flavour_cannot_run_is_refused(mlp_onnx: Path) -> None:
    """On an H100, TensorRT-RTX built a 'current' engine that ran nowhere ("Supported compute
    capabilities: None"); pyrt refuses the build instead."""
    from pyrt.sim import simulated_gpus

    with simulated_gpus(1, capability=(9, 0), name="H100"):
        with pytest.raises(ExportError, match=r"'current' is device 0: H100 .*does not run engines on compute "
                                              r"capability 9\.0 .*the engine would run nowhere"):
            build_engine_from_onnx(mlp_onnx, flavour="tensorrt_rtx", compute_capabilities=["current"])


def _skip_unsupported_gpu() -> None:
    from pyrt import cuda as cuda_seam
    from pyrt.device.tensorrt_seam import unsupported_device

    refusal = unsupported_device(trt, cuda_seam.current().devices()[0].compute_capability)
    if refusal is not None:
        pytest.skip(refusal)  # e.g. TensorRT-RTX on an H100: measured, docs/hardware.md


@pytest.mark.gpu
def test_current_compute_capability_builds_on_a_gpu(mlp_onnx: Path) -> None:
    _skip_unsupported_gpu()
    built = build_engine_from_onnx(mlp_onnx, flavour="tensorrt_rtx", compute_capabilities=["current"])
    engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(built.engine)
    assert engine is not None and engine.num_io_tensors == len(built.inputs) + len(built.outputs)
