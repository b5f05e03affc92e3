"""The fakes are held to the real bindings (issue 10, item 5).

``pyrt.sim.fake_tensorrt`` and ``pyrt.sim.fake_cuda`` stand in for
``tensorrt_rtx`` and ``cuda.bindings.driver``; both real packages import on a
machine without a GPU, so their surfaces can be compared here, in CI:

1. **What the fakes expose.** Every public name of the fake module, runtime,
   engine, execution context, logger and reader bases, Dims and enums must
   exist on the real counterpart with the same kind (class / enum / method /
   property, read-only or settable) and, for methods, an argument list the
   real one accepts: the same parameter names and counts. pybind11 methods
   carry their signatures in ``__doc__`` (one line per overload); Cython
   functions of ``cuda.bindings`` have real ``inspect.signature``\\ s.
2. **Enum members**: every fake member exists with the same value, and
   members behave like pybind11 enums (``.name``, ``int()``, never equal to
   a plain int).
3. **CUDA return shapes.** Every real ``cuda.bindings`` function returns a
   tuple ``(CUresult, out1, ...)``; its docstring's "Returns" section lists
   those entries. Each fake driver function must be annotated with a tuple of
   that length, and return one of that length when called with zeros on a
   fresh driver (its error path, where placeholders are easiest to forget).
4. **What pyrt calls.** pyrt's engine layer runs (load through a buffer and
   through a stream reader, budgets, shapes, launch, failures) over recording
   proxies of the fakes; every attribute it reads, sets or calls on the
   TensorRT module, runtime, engine, context, enums and CUDA driver must
   exist on the real binding (a set needs a settable property, a call needs
   an argument count some real overload accepts), and on the fake unless
   listed below. CUDA calls elsewhere in pyrt (tensors, gpu_reference) are
   found statically: every ``"cu..."`` name (and ``driver.cu...`` attribute) in pyrt's source, with the
   argument count of each ``.call("cu...", ...)`` / ``._copy(...)`` site.
5. **Callbacks.** ``ILogger.log``, ``IStreamReaderV2.read/seek`` and
   ``IOutputAllocator.reallocate_output(_async)/notify_shape`` are called
   *by* TensorRT; their Python arity is the one the real classes
   document (``def read(self, num_bytes: int, stream: int)``), and the fake
   bases take the same.

A difference fails the test unless it is in one of the commented tables
below. Without the real packages the comparisons skip. Behaviour (not just
surface) shared with the real bindings: ``tests/device/test_fake_behaviour.py``.
"""

from __future__ import annotations

import ast
import contextlib
import enum
import inspect
import re
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pyrt.engine
from pyrt.cuda import Cuda
from pyrt.engine import TensorRTEngine
from pyrt.errors import PyrtError
from pyrt.format.trt_blob import IOBinding
from pyrt.sim import fake_cuda, fake_tensorrt
from pyrt.sim.fake_cuda import FakeDriver
from pyrt.sim.fake_tensorrt import FakeCudaEngine, FakeExecutionContext, FakeRuntime, FakeTensorRT
from pyrt.sim.refengine import Ref, RefEngine, RefNode, RefTensor

PYRT = Path(pyrt.engine.__file__).parent

# -- allowed differences ------------------------------------------------------------------------
# Public names the fakes have and the real bindings lack: test helpers, never called by pyrt's
# runtime (point 4 would catch pyrt calling one, unless it is listed in FAKE_ONLY_PROBED).
FAKE_ONLY: dict[str, dict[str, str]] = {
    "module": {
        "driver": "the FakeDriver (or gpu_reference.DeviceMemory) the fake engines live on",
        "calls": "how often each fake call ran (tests assert on it)",
        "inject_failure": "make the next calls of a TensorRT function fail as TensorRT fails",
        "ask_extra_bytes": "bytes added to what the fake asks an output allocator for (the overflow path)",
        "allocations_asked": "(output, bytes) the fake asked output allocators for",
        "seconds_per_row": "a slow GPU for tests of timeouts and overload ($PYRT_SIMULATED_SECONDS_PER_ROW)",
        "stream_bytes_per_second": "a weight-streamed engine's per-pass cost: its streamed bytes at this rate",
    },
    "Runtime": {
        "stream_requests": "byte counts the fake runtime asked a stream reader for",
        "stream_reads": "(asked, taken) per IStreamReaderV2.read call",
    },
    "ICudaEngine": {
        "ref": "the reference engine behind the fake engine",
        "device": "the fake device the engine lives on",
        "logger": "the runtime's logger, for the fake's error messages",
    },
    "Dims": {
        "count": "tuple method: the fake Dims is a tuple (real Dims converts to one)",
        "index": "tuple method, as above",
    },
    "driver": {
        "gpus": "number of simulated devices",
        "memory_used": "bytes allocated on a fake device",
        "free_memory": "bytes free on a fake device",
        "live_allocations": "leak checks in tests",
        "current_device": "the fake TensorRT's view of the current context",
        "view": "the fake TensorRT's window into fake device memory",
        "owner": "which fake device owns an address (the fake's cuPointerGetAttribute stand-in)",
        "stream_device": "the device of a fake stream, for the fake enqueueV3's checks",
        "launch": "the fake TensorRT queues an engine launch on a stream (its work runs when waited for)",
        "pending": "operations queued and not yet run (tests of the asynchronous fake)",
        "hazards": "use-after-free of host buffers and asynchronous faults the fake saw (empty in correct code)",
        "graph_launches": "cuGraphLaunch calls that succeeded (tests of CUDA graph replay)",
        "memory_pools": "False simulates devices without the stream-ordered allocator (cuMemAllocAsync)",
        "allocate_internal": "memory a fake engine holds, without touching the current context",
        "free_internal": "frees allocate_internal's memory",
    },
}
# Same name, different kind, on purpose.
KIND_DIFFERENCES: dict[tuple[str, str], str] = {
    ("module", "Runtime"): "a factory method of the fake module (it binds the fake driver); a class in "
                           "TensorRT. Both are called Runtime(logger) (arity is still compared).",
}
# Names pyrt uses on the real binding that the fakes lack. Each is reached only where the
# real binding is present, or probed with getattr(..., default).
FAKE_LACKS: dict[tuple[str, str], str] = {
    ("module", "ComputeCapability"): "TensorRT-RTX only; pyrt probes it (unsupported_device) with a default",
    ("driver", "cuCtxGetDevice"): "gpu_reference.DeviceMemory runs over the real driver only",
    ("driver", "cuStreamGetDevice"): "as above",
}
# Fake-only names pyrt's runtime is known to probe (issue 10 item 1 removes them).
FAKE_ONLY_PROBED: dict[tuple[str, str], str] = {}


# -- the real packages ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def rtrt() -> Any:
    return pytest.importorskip("tensorrt_rtx")


@pytest.fixture(scope="module")
def rdrv() -> Any:
    return pytest.importorskip("cuda.bindings.driver")


# -- introspection --------------------------------------------------------------------------------
class Sig(typing.NamedTuple):
    """Positional parameters after ``self``: names, and how many are required."""

    names: tuple[str, ...]
    required: int
    var: bool = False  # *args

    def accepts(self, n: int) -> bool:
        return self.required <= n and (self.var or n <= len(self.names))


_MISSING = object()


def kind(owner: Any, name: str) -> str:
    """class | enum | method | property | property-rw | data | missing, for fake and real alike."""
    raw = inspect.getattr_static(owner, name, _MISSING)
    if raw is _MISSING:
        return "missing"
    if isinstance(raw, property):
        return "property-rw" if raw.fset is not None else "property"
    if isinstance(raw, type):
        return "enum" if hasattr(raw, "__members__") else "class"
    if callable(raw) or type(raw).__name__ == "instancemethod":
        return "method"
    return "data"


def _split_params(text: str) -> list[str]:
    """Split a signature's parameter list at top-level commas (types nest [] () <>)."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "[(<"
        depth -= ch in "])>"
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return out + ([cur.strip()] if cur.strip() else [])


def pybind_sigs(func: Any, name: str) -> list[Sig]:
    """Every overload's signature, from a pybind11 docstring (``name(self: T, a: U = d) -> R``)."""
    sigs = []
    for line in (func.__doc__ or "").splitlines():
        m = re.match(rf"^(?:\d+\. )?{re.escape(name)}\((.*)\) -> .*$", line.strip())
        if m is None or "*args" in m.group(1):
            continue
        params = [p for p in _split_params(m.group(1)) if not p.startswith("self")]
        names = tuple(p.split(":")[0].split("=")[0].strip() for p in params)
        sigs.append(Sig(names, sum("=" not in p for p in params)))
    return sigs


def py_sig(func: Any) -> Sig:
    """The signature of a Python (fake) or Cython (cuda.bindings) callable."""
    params = list(inspect.signature(func).parameters.values())
    if params and params[0].name == "self":
        params = params[1:]
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = sum(p.default is p.empty for p in positional)
    var = any(p.kind is p.VAR_POSITIONAL for p in params)
    return Sig(tuple(p.name for p in positional), required, var)


def real_sigs(owner: Any, name: str) -> list[Sig]:
    """A real method's (or class constructor's) overloads."""
    if isinstance(getattr(owner, name), type):  # a class: its __init__
        return pybind_sigs(getattr(owner, name).__init__, "__init__")
    return pybind_sigs(getattr(owner, name), name)


def cuda_returns(func: Any) -> int:
    """How many items a cuda.bindings function returns: its docstring's Returns entries."""
    section = re.search(r"^([ \t]*)Returns\n\1-+\n(.*?)(?:\n[ \t]*\n|\Z)", func.__doc__ or "", re.S | re.M)
    assert section, f"{func.__name__}: no Returns section"
    indent = section.group(1)
    entries = [line for line in section.group(2).splitlines() if line[len(indent):][:1] not in ("", " ")]
    assert entries and entries[0].strip().startswith("CUresult"), f"{func.__name__}: no CUresult in {section[0]!r}"
    return len(entries)


def fake_returns(func: Any) -> int:
    """How many items a fake driver function is annotated to return (``tuple[CUresult, X]``)."""
    hint = typing.get_type_hints(func)["return"]  # resolved in the fake_cuda submodule that defines it
    assert typing.get_origin(hint) is tuple, f"{func.__name__} is annotated {hint}, not a tuple"
    return len(typing.get_args(hint))


def public(obj: Any) -> list[str]:
    return sorted(n for n in dir(obj) if not n.startswith("_"))


# -- fake instances to inspect ----------------------------------------------------------------------
def _ref_engine(*, streaming: bool) -> RefEngine:
    w = np.arange(16, dtype=np.float32).reshape(4, 4)
    return RefEngine(
        [RefTensor("x", "float32", (-1, 4), (1, 4), (8, 4))], [RefTensor("y", "float32", (-1, 4))],
        weights={"w": w}, nodes=[RefNode("aten::matmul", [Ref("x"), Ref("w")], {}, ["y"])],
        weight_streaming=streaming,
    )


BINDINGS = [IOBinding("x", "float32", (-1, 4), True), IOBinding("y", "float32", (-1, 4), False)]


class _Quiet(fake_tensorrt.ILogger):
    def log(self, severity: Any, msg: str) -> None:
        pass


@pytest.fixture
def fakes() -> Iterator[dict[str, Any]]:
    """One of each fake object, live on a fake GPU."""
    driver = FakeDriver(gpus=1, memory=1 << 20)
    trt = FakeTensorRT(driver)
    cuda = Cuda(driver)
    cuda.set_device(0)
    runtime = trt.Runtime(_Quiet())
    engine = runtime.deserialize_cuda_engine(_ref_engine(streaming=True).to_bytes())
    assert engine is not None
    context = engine.create_execution_context()
    yield {"module": trt, "Runtime": runtime, "ICudaEngine": engine, "IExecutionContext": context,
           "ILogger": trt.ILogger, "Logger": trt.Logger, "IStreamReaderV2": trt.IStreamReaderV2,
           "IOutputAllocator": trt.IOutputAllocator, "Dims": trt.Dims, "driver": driver}


def _real_owner(rtrt: Any, label: str) -> Any:
    return rtrt if label == "module" else getattr(rtrt, label)


TRT_LABELS = ["module", "Runtime", "ICudaEngine", "IExecutionContext", "ILogger", "Logger", "IStreamReaderV2",
              "IOutputAllocator", "Dims"]


# -- 1. what the fakes expose ----------------------------------------------------------------------
def _compare_member(fake_owner: Any, real_owner: Any, label: str, name: str) -> list[str]:
    """Differences between one fake member and the real one (empty: they match)."""
    fake_kind = kind(type(fake_owner) if not isinstance(fake_owner, type) else fake_owner, name)
    if fake_kind == "missing":  # an instance attribute set in __init__: its value's kind
        value = getattr(fake_owner, name)
        fake_kind = ("enum" if hasattr(value, "__members__") else "class") if isinstance(value, type) else "data"
    real_kind = kind(real_owner, name)
    where = f"{label}.{name}"
    if label == "IOutputAllocator" and f"def {name}(self" in (real_owner.__doc__ or ""):
        return []  # a Python override TensorRT calls: documented in the class docstring only (point 5)
    if real_kind == "missing":
        return [f"{where}: the fake has it ({fake_kind}), {getattr(real_owner, '__name__', real_owner)} does not"]
    if (label, name) in KIND_DIFFERENCES:
        pass
    elif fake_kind == "data" and real_kind.startswith("property"):
        return []  # a plain attribute reads like a property; pyrt's writes are checked in point 4
    elif fake_kind != real_kind:
        return [f"{where}: {fake_kind} in the fake, {real_kind} in TensorRT"]
    if fake_kind != "method" and (label, name) not in KIND_DIFFERENCES:
        return []
    if (label, name) == ("ILogger", "log") or label in ("IStreamReaderV2", "IOutputAllocator"):
        return []  # callbacks: point 5
    fake = py_sig(getattr(fake_owner, name))
    reals = real_sigs(real_owner, name)
    if not reals:
        return [f"{where}: no signature in TensorRT's docstring to compare with"]
    if not any(fake.names == r.names and fake.required == r.required and not fake.var for r in reals):
        return [f"{where}: the fake takes {fake}, TensorRT {reals}"]
    return []


@pytest.mark.parametrize("label", TRT_LABELS)
def test_every_public_member_of_the_fake_tensorrt_is_real(rtrt: Any, fakes: dict[str, Any], label: str) -> None:
    fake, real = fakes[label], _real_owner(rtrt, label)
    problems = []
    for name in public(fake):
        if name in FAKE_ONLY.get(label, {}):
            assert kind(real, name) == "missing", f"{label}.{name} is real now: drop it from FAKE_ONLY"
            continue
        problems += _compare_member(fake, real, label, name)
    assert not problems, "\n".join(problems)


def test_every_public_member_of_the_fake_driver_is_real(rdrv: Any, fakes: dict[str, Any]) -> None:
    driver = fakes["driver"]
    problems = []
    for name in public(driver):
        if name in FAKE_ONLY["driver"]:
            assert not hasattr(rdrv, name), f"driver.{name} is real now: drop it from FAKE_ONLY"
            continue
        real = getattr(rdrv, name, _MISSING)
        if real is _MISSING:
            problems.append(f"driver.{name}: the fake has it, cuda.bindings.driver does not")
        elif isinstance(real, type) != isinstance(getattr(driver, name), type):
            problems.append(f"driver.{name}: a class in only one of the fake and cuda.bindings")
        elif not isinstance(real, type):
            fake_sig, real_sig = py_sig(getattr(driver, name)), py_sig(real)
            if fake_sig != real_sig:
                problems.append(f"driver.{name}: the fake takes {fake_sig}, cuda.bindings {real_sig}")
    assert not problems, "\n".join(problems)


# -- 2. enum members ---------------------------------------------------------------------------------
def _fake_enums(trt: FakeTensorRT) -> dict[str, Any]:
    return {"DataType": trt.DataType, "TensorIOMode": trt.TensorIOMode, "SeekPosition": trt.SeekPosition,
            "ILogger.Severity": trt.ILogger.Severity,
            "ExecutionContextAllocationStrategy": trt.ExecutionContextAllocationStrategy}


def _real_enum(module: Any, path: str) -> Any:
    for part in path.split("."):
        module = getattr(module, part)
    return module


@pytest.mark.parametrize("path", ["DataType", "TensorIOMode", "SeekPosition", "ILogger.Severity",
                                  "ExecutionContextAllocationStrategy"])
def test_tensorrt_enum_members_match(rtrt: Any, fakes: dict[str, Any], path: str) -> None:
    fake, real = _fake_enums(fakes["module"])[path], _real_enum(rtrt, path)
    for name, member in fake.__members__.items():
        assert name in real.__members__, f"{path}.{name} is not a TensorRT member"
        twin = real.__members__[name]
        assert int(member) == int(twin) == member.value == twin.value, f"{path}.{name}: values differ"
        assert member.name == twin.name == name
        assert (member == int(member)) == (twin == int(twin)) is False  # neither equals a plain int


@pytest.mark.parametrize("name", ["CUresult", "CUdevice_attribute"])
def test_cuda_enum_members_match(rdrv: Any, name: str) -> None:
    fake, real = getattr(fake_cuda, name), getattr(rdrv, name)
    for member in fake:
        assert int(getattr(real, member.name)) == int(member), f"{name}.{member.name}"


@pytest.mark.parametrize("name", ["CUdevice", "CUcontext", "CUstream", "CUevent", "CUdeviceptr"])
def test_cuda_handles_are_classes_that_convert_to_int(rdrv: Any, name: str) -> None:
    # Constructors differ on purpose: the fake's carry their device; pyrt never constructs handles.
    assert isinstance(getattr(rdrv, name), type) and int(getattr(rdrv, name)(7)) == 7
    assert int(getattr(fake_cuda, name)(7, 0)) == 7


# -- 3. CUDA return shapes ---------------------------------------------------------------------------
def _fake_functions() -> list[str]:
    return [n for n in public(FakeDriver) if re.match(r"^cu[A-Z]", n)]


@pytest.mark.parametrize("name", _fake_functions())
def test_cuda_functions_return_what_cuda_bindings_returns(rdrv: Any, name: str) -> None:
    count = cuda_returns(getattr(rdrv, name))
    assert fake_returns(getattr(FakeDriver, name)) == count
    driver = FakeDriver(gpus=1, memory=1 << 20)  # fresh: not initialised, no context
    result = getattr(driver, name)(*[0] * len(py_sig(getattr(driver, name)).names))
    assert isinstance(result, tuple) and len(result) == count, f"{name} returned {result!r}, expected {count} items"
    assert isinstance(result[0], fake_cuda.CUresult)


# -- 4. what pyrt calls ------------------------------------------------------------------------------
class Recorder:
    """A proxy that records every attribute pyrt reads, sets or calls on a fake object.

    ``uses`` collects (owner label, name, how): how is "get", "set" or the call's argument
    count, or "absent" when the fake lacks it. Results of calls that are fake TensorRT objects
    come back wrapped too.
    """

    WRAP: typing.ClassVar[dict[type, str]] = {
        FakeRuntime: "Runtime", FakeCudaEngine: "ICudaEngine", FakeExecutionContext: "IExecutionContext",
    }
    ENUMS: typing.ClassVar[set[str]] = {"DataType", "TensorIOMode", "SeekPosition",
                                        "ExecutionContextAllocationStrategy"}

    def __init__(self, target: Any, label: str, uses: set[tuple[str, str, Any]]) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_label", label)
        object.__setattr__(self, "_uses", uses)

    def __getattr__(self, name: str) -> Any:
        uses, label = self._uses, self._label
        uses.add((label, name, "get"))
        try:
            value = getattr(self._target, name)
        except AttributeError:  # pyrt probed it with getattr(..., default), or is about to fail
            uses.add((label, name, "absent"))
            raise
        if label == "module" and name in self.ENUMS:
            return Recorder(value, name, uses)
        if callable(value) and not isinstance(value, type) and label not in self.ENUMS:
            def call(*args: Any, **kwargs: Any) -> Any:
                uses.add((label, name, len(args) + len(kwargs)))
                result = value(*args, **kwargs)
                wrap = self.WRAP.get(type(result))
                return Recorder(result, wrap, uses) if wrap else result
            return call
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        self._uses.add((self._label, name, "set"))
        setattr(self._target, name, value)


def _drive_pyrt(trt: Any, cuda: Cuda, monkeypatch: pytest.MonkeyPatch) -> None:
    """pyrt's engine layer and CUDA seam, every path that talks to the bindings."""
    cuda.devices()
    cuda.mem_info(0)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    for streaming, via_reader in ((True, True), (False, False)):
        monkeypatch.setattr(pyrt.engine, "STREAM_READER_MIN_BYTES", 0 if via_reader else 1 << 40)
        data = memoryview(_ref_engine(streaming=streaming).to_bytes())
        with TensorRTEngine.load(data, device=0, io_bindings=BINDINGS, trt=trt, cuda=cuda) as engine:
            for budget in (None, 0, 1 << 30):
                if streaming or budget is None:
                    engine.configure(budget, "test")
            assert engine.weight_streaming_scratch_memory_size >= 0
            (shape,) = engine.infer_output_shapes([x.shape])
            with cuda.stream(0) as stream, cuda.event(0) as event, cuda.alloc(x.nbytes, 0) as a, \
                    cuda.alloc(x.nbytes, 0) as b, cuda.alloc(x.nbytes, 1) as c:
                cuda.memcpy_htod(a, x, stream=stream)
                engine.execute([a.ptr], [b.ptr], stream.handle)
                event.record(stream)
                stream.wait(event)
                cuda.memcpy_dtod(a, b, x.nbytes, stream=stream)
                with cuda.stream(1) as peer_stream:  # a peer copy runs on the destination's stream
                    cuda.memcpy_peer(c, b, x.nbytes, stream=peer_stream)
                cuda.memcpy_peer(c, b, x.nbytes)
                out = np.empty_like(x)
                cuda.memcpy_dtoh(out, b, stream=stream)
                cuda.memcpy_htod(a, x)
                cuda.memcpy_dtod(a, b, x.nbytes)
                cuda.memcpy_dtoh(out, b)
                cuda.alloc_async(x.nbytes, stream).free()  # stream-ordered: on ``stream``
                cuda.alloc_async(x.nbytes, stream, free_on=0).free()  # on the legacy one
                stream.synchronize()
                event.synchronize()
            cuda.synchronize(0)
    _drive_profiles_and_shared_memory(trt, cuda)
    with contextlib.suppress(PyrtError):  # refused bytes: the error path's calls
        TensorRTEngine.load(memoryview(b"not an engine"), device=0, io_bindings=BINDINGS, trt=trt, cuda=cuda)
    with contextlib.suppress(PyrtError):  # out of memory: CUresult names
        cuda.alloc(1 << 40, 0)


def _drive_profiles_and_shared_memory(trt: Any, cuda: Cuda) -> None:
    """A two-profile engine on shared (USER_MANAGED) activation memory, run under its second profile."""
    from pyrt.device.scratch import SharedScratch
    from pyrt.sim.refengine import RefProfile

    ref = RefEngine([RefTensor("x", "float32", (-1, 4), (1, 4), (8, 4))], [RefTensor("y", "float32", (-1, 4))],
                    nodes=[RefNode("aten::relu", [Ref("x")], {}, ["y"])],
                    profiles=[RefProfile({"x": ((1, 4), (1, 4), (1, 4))}, 4096),
                              RefProfile({"x": ((2, 4), (4, 4), (8, 4))}, 8192)])
    x = np.ones((3, 4), np.float32)
    scratch = SharedScratch(cuda, 0, "surface")
    with TensorRTEngine.load(memoryview(ref.to_bytes()), device=0, io_bindings=BINDINGS, trt=trt, cuda=cuda) as engine:
        engine.scratch = scratch
        engine.configure(None, "test")
        assert engine.activation_bytes == 8192 and len(engine.profiles) == 2
        with cuda.stream(0) as stream, cuda.alloc(x.nbytes, 0) as a:
            engine.check_inputs([(x.shape, "float32")])
            engine.use_profile(stream.handle)
            engine.infer_output_shapes([x.shape])
            engine.execute([a.ptr], [a.ptr], stream.handle)
            stream.synchronize()
    scratch.close()


def _pyrt_uses(monkeypatch: pytest.MonkeyPatch) -> set[tuple[str, str, Any]]:
    uses: set[tuple[str, str, Any]] = set()
    driver = FakeDriver(gpus=2, memory=1 << 20)
    trt = Recorder(FakeTensorRT(driver), "module", uses)  # the fake TensorRT itself sees the bare driver
    _drive_pyrt(trt, Cuda(Recorder(driver, "driver", uses)), monkeypatch)
    return uses


def test_what_pyrt_calls_on_tensorrt_is_real(rtrt: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    uses = _pyrt_uses(monkeypatch)
    owners = {label: _real_owner(rtrt, label) for label in ("module", "Runtime", "ICudaEngine", "IExecutionContext")}
    owners.update({e: getattr(rtrt, e) for e in Recorder.ENUMS})
    problems = []
    for label, name, how in sorted((u for u in uses if u[0] != "driver"), key=str):
        if name.startswith("__"):
            assert name in ("__name__", "__version__"), f"pyrt reads {label}.{name}"
            continue
        if how == "absent" and (label, name) not in FAKE_LACKS:
            problems.append(f"pyrt uses {label}.{name}, the fake lacks it (and FAKE_LACKS does not list it)")
        real_kind = kind(owners[label], name)
        if real_kind == "missing" and not hasattr(owners[label], name):
            problems.append(f"pyrt uses {label}.{name}, TensorRT has no such member")
        elif how == "set" and real_kind != "property-rw":
            problems.append(f"pyrt sets {label}.{name}, a {real_kind} in TensorRT")
        elif isinstance(how, int) and not any(s.accepts(how) for s in real_sigs(owners[label], name)):
            problems.append(f"pyrt calls {label}.{name} with {how} arguments; TensorRT takes "
                            f"{real_sigs(owners[label], name)}")
    assert not problems, "\n".join(problems)
    assert {("module", "Runtime", 1), ("Runtime", "deserialize_cuda_engine", 1),
            ("ICudaEngine", "weight_streaming_budget_v2", "set"), ("ICudaEngine", "get_tensor_profile_shape", 2),
            ("IExecutionContext", "execute_async_v3", 1), ("SeekPosition", "END", "get"),
            ("ICudaEngine", "create_execution_context", 1), ("IExecutionContext", "set_device_memory", 2),
            ("IExecutionContext", "set_optimization_profile_async", 2),
            ("ExecutionContextAllocationStrategy", "USER_MANAGED", "get")} <= uses


def test_what_pyrt_calls_on_the_cuda_driver_is_real(rdrv: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    uses = {(name, how) for label, name, how in _pyrt_uses(monkeypatch) if label == "driver"}
    static, arities, probes = _static_cuda_uses()
    names = {name for name, _ in uses} | static
    problems = []
    for name in sorted(names):
        if not hasattr(rdrv, name):
            problems.append(f"pyrt uses driver.{name}, cuda.bindings.driver has no such member")
        elif not hasattr(FakeDriver, name) and ("driver", name) not in FAKE_LACKS:
            problems.append(f"pyrt uses driver.{name}, the fake lacks it (and FAKE_LACKS does not list it)")
        elif name in FAKE_ONLY["driver"] and ("driver", name) not in FAKE_ONLY_PROBED:
            problems.append(f"pyrt uses the fake-only driver.{name}")
    for name, how in sorted(uses | arities, key=str):
        if isinstance(how, int) and not py_sig(getattr(rdrv, name)).accepts(how):
            problems.append(f"pyrt calls driver.{name} with {how} arguments; cuda.bindings takes "
                            f"{py_sig(getattr(rdrv, name))}")
    fake_only = {(group, name) for group, names in FAKE_ONLY.items() for name in names}
    for group, name in sorted(fake_only & probes):
        if (group, name) not in FAKE_ONLY_PROBED:
            problems.append(f"pyrt probes the fake-only {group}.{name} (getattr with a literal name)")
    assert not problems, "\n".join(problems)
    assert set(FAKE_ONLY_PROBED) <= probes, "a FAKE_ONLY_PROBED entry is no longer probed: drop it"
    assert ("cuMemcpyPeerAsync", 6) in uses | arities and "cuPointerGetAttribute" in static
    assert {("cuMemAllocAsync", 2), ("cuMemFreeAsync", 2)} <= uses and "cuGraphLaunch" in static


def _static_cuda_uses() -> tuple[set[str], set[tuple[str, int]], set[tuple[str, str]]]:
    """From pyrt's source: driver names ("cu..." strings, ``.CU...`` attributes); the argument
    counts of literal ``.call("cu...", ...)`` and ``._copy("cu...", device, stream, ...)``; and
    ``getattr(driver, "name", ...)`` / ``getattr(trt, "name", ...)`` probes outside pyrt.sim."""
    names: set[str] = set()
    arities: set[tuple[str, int]] = set()
    probes: set[tuple[str, str]] = set()
    for path in PYRT.rglob("*.py"):
        if {"fake_cuda", "fake_tensorrt"} & {path.stem, *path.relative_to(PYRT).parts}:  # the fakes themselves
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                    and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                    and "sim" not in path.relative_to(PYRT).parts):
                target = ast.unparse(node.args[0])
                group = "driver" if "driver" in target else "module" if target in ("trt", "module") else None
                if group:
                    probes.add((group, node.args[1].value))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.match(r"^cu[A-Z]\w+$", node.value):
                names.add(node.value)
            elif isinstance(node, ast.Attribute) and re.match(r"^(CU[a-z]\w*|cu[A-Z]\w+)$", node.attr):
                names.add(node.attr)  # enums, and driver functions looked up once (``driver.cuGraphLaunch``)
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
                    and not any(isinstance(a, ast.Starred) for a in node.args)):
                continue
            fn = node.args[0].value
            if node.func.attr == "call":
                arities.add((fn, len(node.args) - 1))
            elif node.func.attr == "_copy":  # fn(*args) synchronously, fn + "Async"(*args, stream)
                names.add(fn + "Async")
                arities |= {(fn, len(node.args) - 3), (fn + "Async", len(node.args) - 2)}
    return names, arities, probes


# -- 5. callbacks -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("cls", "method"), [("ILogger", "log"), ("IStreamReaderV2", "read"),
                                             ("IStreamReaderV2", "seek"), ("IOutputAllocator", "reallocate_output"),
                                             ("IOutputAllocator", "reallocate_output_async"),
                                             ("IOutputAllocator", "notify_shape")])
def test_callbacks_take_what_tensorrt_passes(rtrt: Any, cls: str, method: str) -> None:
    # The binding's own method signature is the C++ side (read(destination, num_bytes, stream));
    # the Python override's arity is in the class docstring's example, and is what the
    # trampoline passes (pyReadFunc(bytesToRead, stream), pySeekFunc(offset, where), log(severity, msg)).
    documented = re.search(rf"def {method}\(self, ([^)]*)\)", getattr(rtrt, cls).__doc__)
    assert documented, f"{cls}.{method}: no documented signature"
    names = tuple(p.split(":")[0].strip() for p in _split_params(documented.group(1)))
    assert py_sig(getattr(getattr(fake_tensorrt, cls), method)) == Sig(names, len(names))


def test_allowed_difference_tables_name_real_things() -> None:
    """Stale entries fail too: each FAKE_LACKS name must still be absent from the fake."""
    for (owner, name), why in FAKE_LACKS.items():
        target = FakeDriver if owner == "driver" else FakeTensorRT(FakeDriver(gpus=1))
        assert not hasattr(target, name), f"the fake has {owner}.{name} now ({why}): drop it from FAKE_LACKS"
    assert all(issubclass(e, enum.Enum) for e in _fake_enums(FakeTensorRT(FakeDriver(gpus=1))).values())
