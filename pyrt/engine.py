"""One TensorRT engine: deserialize, apply a weight-streaming budget, run.

Lifecycle (formats.md §3): :meth:`TensorRTEngine.load` deserializes the engine bytes
(zero-copy: a small engine's memoryview goes straight to TensorRT; an engine of
``STREAM_READER_MIN_BYTES`` or more is served through TensorRT's
``IStreamReaderV2`` as memoryview slices of the mmap of at most ``STREAM_CHUNK_BYTES``,
so TensorRT never holds a second full host copy of streamable weights, and each piece's
file pages are dropped from the process once served), :meth:`TensorRTEngine.configure`
applies the budget *before* creating the execution context and reads it back,
and calling ``configure`` again destroys and recreates the context.
``infer_output_shapes`` sets input shapes; ``execute`` binds addresses and
enqueues on a stream. Every TensorRT return value is checked. Outputs whose shape only
the run decides get TensorRT output allocators (:mod:`pyrt.device.output_allocator`).

>>> import numpy as np
>>> from pyrt.sim import simulated_gpus
>>> from pyrt.sim.refengine import Ref, RefEngine, RefNode, RefTensor
>>> from pyrt.format.trt_blob import IOBinding
>>> ref = RefEngine([RefTensor("x", "float32", (4,))], [RefTensor("y", "float32", (4,))],
...                 nodes=[RefNode("aten::relu", [Ref("x")], {}, ["y"])])
>>> bindings = [IOBinding("x", "float32", (4,), True), IOBinding("y", "float32", (4,), False)]
>>> with simulated_gpus(1) as sim, TensorRTEngine.load(memoryview(ref.to_bytes()), device=0,
...                                                    io_bindings=bindings) as engine:
...     engine.configure(None, "automatic")
...     x, y = sim.cuda.alloc(16, 0), sim.cuda.alloc(16, 0)
...     sim.cuda.memcpy_htod(x, np.array([-1, 2, -3, 4], dtype=np.float32))
...     engine.infer_output_shapes([(4,)])
...     with sim.cuda.stream(0) as s:
...         engine.execute([x.ptr], [y.ptr], s.handle)
...         s.synchronize()
...     out = np.empty(4, dtype=np.float32)
...     sim.cuda.memcpy_dtoh(out, y)
[(4,)]
>>> out.tolist()
[0.0, 2.0, 0.0, 4.0]
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyrt.cuda as cuda_seam
from pyrt.checks import is_int
from pyrt.device import output_allocator, tensorrt_seam
from pyrt.device import profiles as profiles_mod
from pyrt.device import scratch as scratch_mod
from pyrt.device.stream_reader import view_reader
from pyrt.errors import BudgetError, DeviceError, EngineError, InputError
from pyrt.renames import renamed

_log = logging.getLogger("pyrt.engine")

STREAM_READER_MIN_BYTES = 64 << 20  # below this, handing TensorRT the buffer is as cheap and simpler
STREAM_CHUNK_BYTES = 16 << 20  # most bytes one read hands TensorRT (a zero-copy slice of the engine)


@dataclass(frozen=True)
class _Input:
    name: str
    dtype: str
    shape: tuple[int, ...]  # -1 for a dynamic dim
    min_shape: tuple[int, ...]
    max_shape: tuple[int, ...]
    profiles: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = ()  # (min, max) per optimization profile


class TensorRTEngine:
    """A deserialized TensorRT engine on one CUDA device; close it, or use ``with``.

    (Not :class:`pyrt.llm.Engine`, which generates text with a whole program.)
    """

    def __init__(self, *, trt: Any, cuda: cuda_seam.Cuda, runtime: Any, logger: Any, engine: Any,
                 device: int, io_bindings: Sequence[Any], name: str) -> None:
        self._trt, self._cuda = trt, cuda
        self._runtime, self._logger, self._engine = runtime, logger, engine
        self._context: Any = None
        self.device = device
        self.name = name or "engine"
        self.io_bindings = list(io_bindings)
        self.input_names = [b.name for b in self.io_bindings if b.is_input]
        self.output_names = [b.name for b in self.io_bindings if not b.is_input]
        self.output_dtypes = [b.dtype for b in self.io_bindings if not b.is_input]
        self._io_names = [*self.input_names, *self.output_names]
        self._inputs: list[_Input] = []
        self._applied_budget: int | None = None
        self._budget_source: str | None = None
        self._shapes_set = False
        # what the last calls settled, so a run whose shapes repeat (every decode step) does not redo it:
        # the (shape, dtype) of each input check_inputs accepted; the input shapes set on the context, with the
        # output shapes TensorRT inferred from them (valid while _shapes_set)
        self._checked: tuple[tuple[tuple[int, ...], str], ...] | None = None
        self._inferred: tuple[tuple[tuple[int, ...], ...], list[tuple[int, ...]]] | None = None
        self._bound: list[int] = []  # addresses bound on the current context, in name order
        self._allocators = output_allocator.OutputAllocators(self.name)  # data-dependent outputs, per context
        self.scratch: scratch_mod.SharedScratch | None = None  # contexts use its memory (USER_MANAGED)
        self._active_profile = self._wanted_profile = 0
        self._check_bindings()

    # -- loading -----------------------------------------------------------------
    @classmethod
    def load(cls, engine_bytes: memoryview, *, device: int, io_bindings: Sequence[Any],
             trt: Any = None, cuda: Any = None, name: str = "") -> TensorRTEngine:
        """Deserialize ``engine_bytes`` (not copied by pyrt) on CUDA device ``device``.

        DeviceError (listing present devices) comes before anything is allocated;
        EngineError when TensorRT refuses the bytes or they disagree with ``io_bindings``.
        """
        seam = cuda_seam.resolve(cuda)
        label = name or "engine"
        info = seam.require_device(device, purpose=f"TensorRT {label}")
        module = tensorrt_seam.load_tensorrt(trt, cuda=seam)
        refusal = tensorrt_seam.unsupported_device(module, info.compute_capability)
        if refusal is not None:
            raise DeviceError(f"{label}: {refusal}; device {info}; use a TensorRT flavour that supports it")
        seam.set_device(device)
        runtime, logger = tensorrt_seam.create_runtime(module, cuda=seam)
        source: Any = engine_bytes
        if _nbytes(engine_bytes) >= STREAM_READER_MIN_BYTES:
            try:
                source = view_reader(module, memoryview(engine_bytes).cast("B"), STREAM_CHUNK_BYTES) or engine_bytes
            except RuntimeError as exc:  # the reader base dlopens libcuda: "Failed to open cuda driver."
                raise DeviceError(f"{label}: TensorRT ({tensorrt_seam.flavour_of(module)}) could not create the "
                                  f"stream reader for {_nbytes(engine_bytes)} engine bytes on device {device}: "
                                  f"{exc}") from exc
        try:
            engine = runtime.deserialize_cuda_engine(source)
        except Exception as exc:  # bindings raise TypeError for a non-buffer, RuntimeError inside
            raise EngineError(f"{label}: deserializing {_nbytes(engine_bytes)} engine bytes raised {exc}") from exc
        finally:
            if source is not engine_bytes:
                source.release()  # the last slice served
        if engine is None:
            raise EngineError(
                f"{label}: TensorRT ({tensorrt_seam.flavour_of(module)}) could not deserialize "
                f"{_nbytes(engine_bytes)} engine bytes on device {device}: {logger.messages.take() or 'no log'}"
            )
        return cls(trt=module, cuda=seam, runtime=runtime, logger=logger, engine=engine,
                   device=device, io_bindings=io_bindings, name=label)

    def _check_bindings(self) -> None:
        """io_bindings must name exactly the engine's I/O tensors, with their modes and dtypes."""
        eng, mode = self._engine, self._trt.TensorIOMode
        engine_names = {eng.get_tensor_name(i) for i in range(eng.num_io_tensors)}
        bound = {b.name for b in self.io_bindings}
        if engine_names != bound or len(bound) != len(self.io_bindings):
            raise EngineError(
                f"{self.name}: io_bindings {sorted(b.name for b in self.io_bindings)} do not match the "
                f"engine's I/O tensors {sorted(engine_names)}"
            )
        for b in self.io_bindings:
            want = mode.INPUT if b.is_input else mode.OUTPUT
            if eng.get_tensor_mode(b.name) != want:
                raise EngineError(f"{self.name}: binding {b.name!r} is an {'input' if b.is_input else 'output'} "
                                  f"in io_bindings but not in the engine")
            actual = tensorrt_seam.dtype_from_trt(eng.get_tensor_dtype(b.name))
            if actual != b.dtype:
                raise EngineError(f"{self.name}: binding {b.name!r} is {b.dtype} in io_bindings, "
                                  f"{actual} in the engine")
            shape = tuple(eng.get_tensor_shape(b.name))
            if len(shape) != len(b.shape) or any(
                    -1 not in (x, y) and x != y for x, y in zip(shape, b.shape, strict=True)):
                raise EngineError(f"{self.name}: binding {b.name!r} has shape {tuple(b.shape)} in io_bindings, "
                                  f"{shape} in the engine")
            if b.is_input:
                self._inputs.append(self._profile(b.name, b.dtype, shape))

    def _profile(self, name: str, dtype: str, shape: tuple[int, ...]) -> _Input:
        """The input's (min, max) under every optimization profile; min/max_shape span them all."""
        if -1 not in shape:
            return _Input(name, dtype, shape, shape, shape)
        ranges = profiles_mod.read_ranges(self._engine, name, shape, self.name, self._logger.messages.take)
        lo = tuple(min(r[0][k] for r in ranges) for k in range(len(shape)))
        hi = tuple(max(r[1][k] for r in ranges) for k in range(len(shape)))
        return _Input(name, dtype, shape, lo, hi, ranges)

    @property
    def profiles(self) -> list[dict[str, tuple[tuple[int, ...], tuple[int, ...]]]]:
        """Per optimization profile: each dynamic input's (min, max) shape."""
        count = max((len(i.profiles) for i in self._inputs), default=0)
        return [{i.name: i.profiles[p] for i in self._inputs if i.profiles} for p in range(count)]

    def use_profile(self, stream: int) -> None:
        """Switch the context to the profile :meth:`check_inputs` picked, on ``stream`` (a no-op when active)."""
        want = self._wanted_profile
        context = self._ready()
        if want == self._active_profile:
            return
        self._cuda.set_device(self.device)
        if not context.set_optimization_profile_async(want, int(stream)):
            raise EngineError(f"{self.name}: TensorRT could not switch to optimization profile {want}: "
                              f"{self._logger.messages.take() or 'no log'}")
        self._active_profile = want
        self._shapes_set = False  # input shapes are set again under the new profile

    # -- weight streaming ------------------------------------------------------------
    @property
    def streamable_weights_size(self) -> int:
        """Bytes of weights TensorRT can stream (0: the engine was built without streaming)."""
        return self._streaming_property("streamable_weights_size")

    @property
    def weight_streaming_scratch_memory_size(self) -> int:
        """Device scratch bytes TensorRT needs to stream weights."""
        return self._streaming_property("weight_streaming_scratch_memory_size")

    def _streaming_property(self, name: str) -> int:
        # Plain int properties over noexcept getters in the bindings: an engine built without
        # WEIGHT_STREAMING reads 0, nothing raises. Anything else is a broken engine or binding.
        engine = self._live()
        try:
            value = getattr(engine, name)
        except Exception as exc:
            raise EngineError(f"{self.name}: reading TensorRT's {name} raised {type(exc).__name__}: {exc} "
                              f"({self._logger.messages.take() or 'no log'})") from exc
        if not is_int(value, low=0):
            raise EngineError(f"{self.name}: TensorRT reports {name} = {value!r}, not a byte count")
        return int(value)

    @property
    def applied_budget(self) -> int | None:
        """The budget read back from TensorRT by the last configure (None: not streamable/configured)."""
        return self._applied_budget

    @property
    def budget_source(self) -> str | None:
        """The ``source`` given to the last configure (e.g. "load-time", "baked", "automatic")."""
        return self._budget_source

    def configure(self, budget: int | None, source: str) -> None:
        """Apply a weight-streaming budget, then (re)create the execution context.

        ``budget`` None = TensorRT's automatic budget (retried with 0 if it does not
        take); an int is clamped to the streamable size. On an engine without
        streamable weights nothing is set and ``applied_budget`` is None.
        """
        if budget is not None and not is_int(budget, low=0):
            raise BudgetError(f"{self.name}: {source} budget must be an int >= 0 or None, got {budget!r}")
        budget = None if budget is None else int(budget)
        engine = self._live()
        self._cuda.set_device(self.device)
        self._drop_context()
        streamable = self.streamable_weights_size
        applied: int | None = None
        if streamable > 0:
            if budget is None:
                automatic = int(engine.get_weight_streaming_automatic_budget())
                applied = self._set_budget(automatic, retry_with_zero=True)
            else:
                applied = self._set_budget(min(budget, streamable), retry_with_zero=False)
        elif budget is not None:
            _log.warning("%s: %s budget %d ignored: the engine has no streamable weights", self.name, source, budget)
        context = self._create_context()
        if context is None:
            raise EngineError(f"{self.name}: could not create an execution context on device {self.device} "
                              f"(budget {applied}): {self._logger.messages.take() or 'no log'}")
        self._context = context
        self._active_profile = 0
        self._applied_budget, self._budget_source = applied, source
        for spec in self._inputs:
            if -1 not in spec.shape:
                self._set_shape(spec.name, spec.shape)
        self._shapes_set = all(-1 not in spec.shape for spec in self._inputs)

    # -- activation memory -----------------------------------------------------------
    @property
    def activation_bytes(self) -> int:
        """Device bytes of activation memory a context needs (the largest over the profiles)."""
        return self._streaming_property("device_memory_size_v2")

    @property
    def closed(self) -> bool:
        return self._engine is None

    @property
    def has_context(self) -> bool:
        return self._context is not None

    def _create_context(self) -> Any:
        """A context with TensorRT's own activation memory, or, with a shared scratch, the scratch's."""
        strategy = getattr(self._trt, "ExecutionContextAllocationStrategy", None)
        if self.scratch is None or strategy is None:
            return self._engine.create_execution_context()
        context = self._engine.create_execution_context(strategy.USER_MANAGED)
        if context is not None:
            self._context = context
            try:
                ptr, size = self.scratch.reserve(self)
                self.bind_activation_memory(ptr, size)
            except BaseException:
                self._drop_context()
                raise
        return context

    def bind_activation_memory(self, ptr: int, size: int) -> None:
        """Point the live context at ``size`` bytes of activation memory at ``ptr``."""
        if self._context is None or size == 0:
            return
        self._logger.messages.take()
        self._context.set_device_memory(ptr, size)
        scratch_mod.check_bound(self, self._logger.messages.take())

    def _set_budget(self, value: int, *, retry_with_zero: bool) -> int:
        """Set and read back ``value``; for the automatic budget, fall back to 0 once."""
        got = self._try_budget(value)
        if got == value:
            return value
        error = self._logger.messages.take() or "no log"
        what = f"budget {value}"
        if retry_with_zero and value != 0:
            _log.warning("%s: automatic budget %d did not take (%s); retrying with 0", self.name, value, error)
            got = self._try_budget(0)
            if got == 0:
                return 0
            error = f"{error}; then {self._logger.messages.take() or 'no log'}"
            what = f"automatic budget {value} nor the fallback 0"
        raise EngineError(f"{self.name}: TensorRT did not accept weight-streaming {what} "
                          f"(reads back {got}): {error}")

    def _try_budget(self, value: int) -> int:
        self._engine.weight_streaming_budget_v2 = value
        return int(self._engine.weight_streaming_budget_v2)

    # -- shapes ------------------------------------------------------------------------
    def check_inputs(self, shapes_dtypes: Sequence[tuple[Sequence[int], str]]) -> None:
        """InputError naming the binding unless each (shape, dtype) fits its input."""
        key = tuple((tuple(shape), dtype) for shape, dtype in shapes_dtypes)
        if key == self._checked:  # the same as the last accepted: the same verdict and profile
            return
        if len(shapes_dtypes) != len(self._inputs):
            raise InputError(f"{self.name}: expected {len(self._inputs)} inputs {self.input_names}, "
                             f"got {len(shapes_dtypes)}")
        for spec, (shape, dtype) in zip(self._inputs, shapes_dtypes, strict=True):
            shape = tuple(shape)
            if dtype != spec.dtype:
                raise InputError(f"{self.name}: input {spec.name!r} must be {spec.dtype}, got {dtype}")
            if len(shape) != len(spec.shape):
                raise InputError(f"{self.name}: input {spec.name!r} must have rank {len(spec.shape)} "
                                 f"(shape {spec.shape}), got shape {shape}")
            if len(spec.profiles) < 2 and not profiles_mod.within(shape, spec.min_shape, spec.max_shape):
                raise InputError(f"{self.name}: input {spec.name!r} shape {shape} is outside the engine's "
                                 f"optimization profile [{spec.min_shape}, {spec.max_shape}]")
        if any(len(spec.profiles) > 1 for spec in self._inputs):
            self._wanted_profile = profiles_mod.pick_profile(self.name, self.profiles, {
                spec.name: tuple(s) for spec, (s, _) in zip(self._inputs, shapes_dtypes, strict=True)})
        self._checked = key

    def infer_output_shapes(self, input_shapes: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
        """Set the input shapes; return every output's shape, in ``output_names`` order.

        Shapes the context already holds (the last call's, on the same context and profile) are not set again.
        """
        context = self._ready()
        key = tuple(tuple(shape) for shape in input_shapes)
        if self._shapes_set and self._inferred is not None and self._inferred[0] == key:
            return list(self._inferred[1])
        if len(input_shapes) != len(self._inputs):
            raise InputError(f"{self.name}: expected {len(self._inputs)} input shapes, got {len(input_shapes)}")
        self._cuda.set_device(self.device)
        self._shapes_set = False
        self._inferred = None
        for spec, shape in zip(self._inputs, input_shapes, strict=True):
            self._set_shape(spec.name, tuple(shape))
        try:
            missing = context.infer_shapes()
        except RuntimeError as exc:
            raise EngineError(f"{self.name}: TensorRT shape inference failed: {exc}") from exc
        if missing:
            raise EngineError(f"{self.name}: TensorRT shape inference left {list(missing)} unspecified")
        shapes = [tuple(int(d) for d in context.get_tensor_shape(name)) for name in self.output_names]
        self._allocators.ensure(self._trt, context, [n for n, s in zip(self.output_names, shapes, strict=True)
                                                     if min(s, default=0) < 0])
        self._shapes_set = True
        self._inferred = (key, shapes)
        return list(shapes)

    def _set_shape(self, name: str, shape: tuple[int, ...]) -> None:
        if not self._context.set_input_shape(name, shape):
            raise InputError(f"{self.name}: TensorRT refused shape {shape} for input {name!r}: "
                             f"{self._logger.messages.take() or 'outside the optimization profile'}")

    # -- running -------------------------------------------------------------------------
    def execute(self, input_ptrs: Sequence[int], output_ptrs: Sequence[int], stream: int,
                capacities: Sequence[int] | None = None) -> None:
        """Bind device addresses (inputs, outputs in name order) and enqueue on ``stream``;
        ``capacities``: bytes planned at each output (needed for data-dependent outputs)."""
        context = self._ready()
        if len(input_ptrs) != len(self.input_names) or len(output_ptrs) != len(self.output_names):
            raise InputError(f"{self.name}: execute needs {len(self.input_names)} input and "
                             f"{len(self.output_names)} output addresses, got {len(input_ptrs)} and {len(output_ptrs)}")
        if not self._shapes_set:
            raise EngineError(f"{self.name}: dynamic input shapes are not set; call infer_output_shapes first")
        self._cuda.set_device(self.device)
        ptrs = [int(p) for p in (*input_ptrs, *output_ptrs)]
        if ptrs != self._bound:  # planned arenas keep their addresses: bind only what changed
            self._bound = []  # a refusal below leaves nothing half-remembered
            for name, ptr in zip([*self.input_names, *self.output_names], ptrs, strict=True):
                if not context.set_tensor_address(name, ptr):
                    raise EngineError(f"{self.name}: TensorRT refused address {ptr:#x} for {name!r}: "
                                      f"{self._logger.messages.take() or 'no log'}")
            self._bound = ptrs
        if self._allocators.names:
            if int(self._cuda.call("cuStreamIsCapturing", int(stream))):
                raise EngineError(self._allocators.capture_refusal())
            self._allocators.plan(self.output_names, output_ptrs, capacities)
        ok = context.execute_async_v3(int(stream))
        self._allocators.check(self._logger.messages)
        if not ok:
            raise EngineError(f"{self.name}: execute_async_v3 failed on device {self.device}: "
                              f"{self._logger.messages.take() or 'no log'}")

    @property
    def data_dependent(self) -> tuple[str, ...]:
        """Outputs whose shape only the run decides (known after ``infer_output_shapes``)."""
        return self._allocators.names

    def reported_shape(self, name: str) -> tuple[int, ...]:
        """The shape TensorRT reported for data-dependent output ``name`` in the last ``execute``."""
        return self._allocators.reported(name)

    def enqueue(self, ptrs: list[int], stream: int) -> None:
        """The hot path of :meth:`execute` for a caller that validated once: ``ptrs`` (inputs
        then outputs, ints) against the shapes already set; binds only when ``ptrs`` changed."""
        context = self._context
        if context is None or not self._shapes_set or self._allocators.names:
            self.execute(ptrs[: len(self.input_names)], ptrs[len(self.input_names):], stream)
            return
        self._cuda.set_device(self.device)
        if ptrs != self._bound:
            self._bound = []
            for name, ptr in zip(self._io_names, ptrs, strict=True):
                if not context.set_tensor_address(name, ptr):
                    raise EngineError(f"{self.name}: TensorRT refused address {ptr:#x} for {name!r}: "
                                      f"{self._logger.messages.take() or 'no log'}")
            self._bound = list(ptrs)
        if not context.execute_async_v3(stream):
            raise EngineError(f"{self.name}: execute_async_v3 failed on device {self.device}: "
                              f"{self._logger.messages.take() or 'no log'}")

    # -- lifetime ----------------------------------------------------------------------------
    def _live(self) -> Any:
        if self._engine is None:
            raise EngineError(f"{self.name} is closed")
        return self._engine

    def _ready(self) -> Any:
        """The execution context, configured with the automatic budget if nobody configured it."""
        self._live()
        if self._context is None:
            self.configure(None, "automatic")
        return self._context

    def _drop_context(self) -> None:
        self._context = None  # TensorRT destroys it here (the engine keeps no other reference)
        self._shapes_set = False
        self._inferred = None
        self._bound = []
        self._allocators.clear()  # they belonged to that context

    def close(self) -> None:
        """Release the execution context, then the engine (idempotent)."""
        if self._engine is None:
            return
        try:
            self._cuda.set_device(self.device)
        finally:
            self._drop_context()
            self._engine = None
            self._runtime = None

    def __enter__(self) -> TensorRTEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._engine is None else f"budget={self._applied_budget}"
        return f"TensorRTEngine({self.name!r}, device={self.device}, {state})"


_dims = profiles_mod.dims  # a TensorRT Dims as a tuple (None: invalid); kept here for callers of this module


def _nbytes(data: Any) -> int:
    try:
        return memoryview(data).nbytes
    except TypeError:
        return -1


# pyrt.engine.Engine, the name before TensorRTEngine, still imports (with a DeprecationWarning).
__getattr__ = renamed(__name__, {"Engine": "TensorRTEngine"}, globals(), note=" (pyrt.llm.Engine is the LLM engine)")
