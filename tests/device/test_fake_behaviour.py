"""Behaviour the fakes share with the real bindings, run on both where a CPU suffices.

``tensorrt_rtx`` 1.7 imports and runs its binding layer without a GPU: a
subclass of ``ILogger`` / ``IStreamReaderV2`` that skips the base
``__init__``, a logger callback that raises, a ``Runtime`` given a
non-logger, a non-buffer to deserialize, and the reader base's dlopen of
libcuda all behave the same on the fake and on the real package here. The
stream-reader protocol, which needs a GPU on the real side, follows what
TensorRT-RTX did on an H100 (docs/hardware.md). The surface comparison is
``tests/device/test_fake_surface.py``.
"""

from __future__ import annotations

import ctypes.util
import importlib.util
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from pyrt.cuda import Cuda
from pyrt.sim import fake_tensorrt
from pyrt.sim.fake_cuda import FakeDriver
from pyrt.sim.fake_tensorrt import FakeTensorRT
from pyrt.sim.refengine import Ref, RefEngine, RefNode, RefTensor


def _ref_engine(*, streaming: bool) -> RefEngine:
    w = np.arange(16, dtype=np.float32).reshape(4, 4)
    return RefEngine(
        [RefTensor("x", "float32", (-1, 4), (1, 4), (8, 4))], [RefTensor("y", "float32", (-1, 4))],
        weights={"w": w}, nodes=[RefNode("aten::matmul", [Ref("x"), Ref("w")], {}, ["y"])],
        weight_streaming=streaming,
    )


# -- the same scenario on the fake and on tensorrt_rtx ------------------------------------------------
def _flavours() -> list[Any]:
    return ["fake", pytest.param("real", marks=pytest.mark.skipif(
        not _importable("tensorrt_rtx"), reason="tensorrt_rtx is not installed"))]


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _trt(flavour: str) -> Any:
    if flavour == "fake":
        return FakeTensorRT(FakeDriver(gpus=1))
    import tensorrt_rtx

    return tensorrt_rtx


@pytest.mark.parametrize("flavour", _flavours())
@pytest.mark.parametrize("base", ["ILogger", "IStreamReaderV2"])
def test_a_subclass_must_initialise_its_binding_base(flavour: str, base: str) -> None:
    trt = _trt(flavour)

    class Lazy(getattr(trt, base)):  # type: ignore[misc]
        def __init__(self) -> None:
            self.pos = 0  # forgets the base __init__

    with pytest.raises(TypeError, match=rf"{base}\.__init__\(\) must be called when overriding __init__"):
        Lazy()


@pytest.mark.parametrize("flavour", _flavours())
def test_runtime_refuses_a_non_logger(flavour: str) -> None:
    with pytest.raises(TypeError, match="incompatible constructor arguments"):
        _trt(flavour).Runtime(object())


@pytest.mark.parametrize("flavour", _flavours())
def test_a_raising_logger_is_reported_on_stderr_not_raised(flavour: str, capfd: pytest.CaptureFixture[str]) -> None:
    trt = _trt(flavour)

    class Broken(trt.ILogger):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        def log(self, severity: Any, msg: str) -> None:
            raise ValueError("log boom")

    if flavour == "fake":
        Cuda(trt.driver).set_device(0)
    assert trt.Runtime(Broken()).deserialize_cuda_engine(b"junk" * 64) is None  # logs an error, on the CPU too
    assert "[ERROR] Exception caught in log(): ValueError: log boom" in capfd.readouterr().err


@pytest.mark.parametrize("flavour", _flavours())
def test_deserialize_refuses_a_non_buffer(flavour: str) -> None:
    trt = _trt(flavour)
    runtime = trt.Runtime(_quiet_logger(trt))
    with pytest.raises(TypeError, match="incompatible function arguments"):
        runtime.deserialize_cuda_engine("not a buffer")


def _quiet_logger(trt: Any) -> Any:
    class Quiet(trt.ILogger):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        def log(self, severity: Any, msg: str) -> None:
            pass

    return Quiet()


@pytest.mark.skipif(ctypes.util.find_library("cuda") is not None, reason="libcuda is present here")
def test_the_real_reader_base_needs_libcuda_and_the_fake_can_say_so() -> None:
    rtrt = pytest.importorskip("tensorrt_rtx")
    with pytest.raises(RuntimeError, match=r"Failed to open cuda driver\.") as real:
        rtrt.IStreamReaderV2()
    fake = FakeTensorRT(FakeDriver(gpus=1))
    fake.inject_failure("IStreamReaderV2")
    with pytest.raises(RuntimeError) as faked:
        fake.IStreamReaderV2()
    assert str(faked.value) == str(real.value)


# -- the fake stream-reader protocol (what TensorRT-RTX 1.7 did with a Python reader on an H100) -----
class _Reader(fake_tensorrt.IStreamReaderV2):
    """Serves ``data``; ``answer(pos, num_bytes)`` chooses what read() returns."""

    def __init__(self, data: bytes, answer: Callable[[memoryview, int, int], Any]) -> None:
        super().__init__()
        self.data, self.answer, self.pos = memoryview(data), answer, 0

    def read(self, num_bytes: int, stream: int) -> Any:
        out = self.answer(self.data, self.pos, num_bytes)
        self.pos += len(memoryview(out).cast("B")) if isinstance(out, (bytes, memoryview, np.ndarray)) else 0
        return out

    def seek(self, offset: int, where: Any) -> bool:
        self.pos = offset
        return True


def _runtime() -> tuple[FakeTensorRT, Any, list[str]]:
    trt = FakeTensorRT(FakeDriver(gpus=1))
    Cuda(trt.driver).set_device(0)
    errors: list[str] = []

    class Keep(trt.ILogger):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        def log(self, severity: Any, msg: str) -> None:
            errors.append(msg)

    return trt, trt.Runtime(Keep()), errors


@pytest.mark.parametrize("answer", [
    lambda d, p, n: d[p:p + n],                                    # memoryview slices
    lambda d, p, n: bytes(d[p:p + min(n, 100)]),                    # short bytes: asked again for the rest
    lambda d, p, n: np.frombuffer(d[p:p + min(n, 7)], np.uint8),    # any buffer
])
def test_the_fake_reader_protocol_takes_any_buffer(answer: Any) -> None:
    trt, runtime, errors = _runtime()
    reader = _Reader(_ref_engine(streaming=True).to_bytes(), answer)
    assert runtime.deserialize_cuda_engine(reader) is not None, errors
    assert sum(runtime.stream_requests) == reader.data.nbytes


@pytest.mark.parametrize(("answer", "stderr"), [
    (lambda d, p, n: b"", "User aborted the operation"),
    (lambda d, p, n: "text", "Object of type 'str' is not an instance of 'buffer'"),
    (lambda d, p, n: 1 / 0, "Exception caught in read(): ZeroDivisionError"),
])
def test_the_fake_reader_protocol_aborts_like_tensorrt(answer: Any, stderr: str,
                                                       capfd: pytest.CaptureFixture[str]) -> None:
    trt, runtime, errors = _runtime()
    assert runtime.deserialize_cuda_engine(_Reader(_ref_engine(streaming=True).to_bytes(), answer)) is None
    assert stderr in capfd.readouterr().err
    assert errors and "Failed to read header from the stream: read 0 out of 24 bytes" in errors[-1]


def test_the_fake_profile_query_always_returns_three_dims() -> None:
    trt, runtime, errors = _runtime()
    engine = runtime.deserialize_cuda_engine(_ref_engine(streaming=False).to_bytes())
    assert [tuple(d) for d in engine.get_tensor_profile_shape("x", 0)] == [(1, 4), (8, 4), (8, 4)]
    invalid = engine.get_tensor_profile_shape("y", 0)  # an output: TensorRT logs and returns nbDims -1
    assert len(invalid) == 3 and errors
    for dims in invalid:
        with pytest.raises(ValueError, match="should return >= 0"):
            len(dims)
