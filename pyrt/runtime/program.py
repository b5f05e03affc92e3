"""``pyrt.Program``: load an ExecuTorch ``.pte`` once, run its methods many times.

>>> import numpy as np, pyrt
>>> with pyrt.Program("model.pte") as prog:                       # doctest: +SKIP
...     prog.method_names
...     y = prog(np.ones((2, 3), np.float32))                     # numpy in -> numpy out
...     y = prog.run(x_torch, method="forward")                   # torch in -> torch out
...     prog.set_budget("50%")                                    # between runs
...     [(w.method, w.streamable_bytes, w.budget, w.source) for w in prog.weight_streaming]

Loading validates the whole file, resolves every operator to a kernel
(``UnsupportedOperatorError`` names the operator and method; only operators
ExecuTorch's own runtime defines are resolved, see :mod:`pyrt.kernels`),
checks the host memory the file declares against :mod:`pyrt.format.limits`
(``PteFormatError`` / ``ResourceError`` naming the arena or tensor), checks that
every CUDA device the program needs exists (``DeviceError`` listing the
devices present, before anything is allocated), deserializes TensorRT engines
(TensorRT is imported only when the program has ``TensorRTBackend``
delegates), applies weight-streaming budgets, then allocates each method's
memory-planned arenas once. ``kernels="numpy"`` (or ``$PYRT_KERNELS=numpy``)
runs non-delegated operators with the numpy core set even where torch is installed.

A .pte is untrusted input: whatever is wrong with it, or with the inputs a
method is called with, is raised as a :class:`~pyrt.errors.PyrtError`
subclass naming the value and where it came from.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyrt.cuda as cuda_seam
from pyrt.device.scratch import ScratchInfo
from pyrt.errors import BudgetError, InputError, ProgramClosedError
from pyrt.format.limits import check_host_memory
from pyrt.format.ptd_reader import ExternalData
from pyrt.kernels.registry import ENV_VAR, choose_library, library
from pyrt.memory.host import host_backend
from pyrt.pte_reader import PteFile
from pyrt.runtime.delegates import apply_budgets, load_engines
from pyrt.runtime.device_context import DeviceContext
from pyrt.runtime.executor import MethodRunner
from pyrt.runtime.graph_forward import check_graph_outputs
from pyrt.runtime.load_plan import MethodLoadPlan, plan_load
from pyrt.runtime.memory_plan import (
    DEFAULT_HEADROOM,
    EngineMemory,
    MemoryPlan,
    check_arenas,
    check_headroom,
    close_engines,
    device_arenas,
    engine_memory,
    graph_reserve,
    plan_memory,
    scratches,
)
from pyrt.runtime.plan import MethodPlan, finish_method
from pyrt.runtime.profile import Profiler
from pyrt.streaming import LoadBudget, parse_budget, parse_load_budget

if TYPE_CHECKING:
    from pyrt.runtime.profile import Profiler


@dataclass(frozen=True)
class WeightStreamingInfo:
    """Weight streaming of one engine: ``budget`` is what TensorRT reads back (None: not streamable).

    ``source`` is "load-time", "baked", "automatic" or "none" (nothing streamable).
    """

    index: int
    method: str
    delegate_index: int
    device: int
    streamable_bytes: int
    budget: int | None
    source: str
    scratch_bytes: int


class Program:
    """A loaded ``.pte`` program; a context manager (``close()`` releases engines, memory and the file).

    ``data``: the ``.ptd`` file(s) holding the program's external weights (a path, bytes, or a
    list of them); external tensors resolve by key, zero-copy over each file's read-only
    mapping, checked against the entry's dtype, sizes and byte count.
    ``budget``: weight-streaming budget for every TensorRT engine (see
    :mod:`pyrt.streaming`: bytes as a total split across engines, "50%", 0.5,
    "auto", or ``{engine_index: value}``), or "fit": one plan per device
    (:mod:`pyrt.runtime.memory_plan`) giving the weights what the GPU has left beside the
    arenas, shared activations, streaming scratch, CUDA-graph reserve and ``headroom``
    (bytes or a share of the GPU, default 5%); ``Program.memory_plan`` shows it; ``device_map``: ``{0: 1}`` or
    ``{"cuda:0": "cuda:1"}`` remapping the devices the file names; ``trt``:
    a TensorRT module or one of "tensorrt", "tensorrt_rtx", "tensorrt_lean"
    (default: the first that imports); ``kernels``: "torch", "numpy" or None (auto);
    ``devices``: the GPUs to run on, passed explicitly: a :class:`pyrt.cuda.Cuda`, or
    what :func:`pyrt.sim.simulated_gpus` yields (its fake TensorRT too, unless ``trt``
    is given); None: the process's CUDA driver. The program keeps what it was loaded
    with; later changes of the process default do not reach it. ``cuda_graphs``: replay
    each run of device-only work (static engines reading and writing one device's
    memory) as a CUDA graph after it was captured on the second run (see :mod:`pyrt.runtime.cuda_graphs`);
    set_budget captures again. A method that is wholly such work, with inputs and outputs
    planned in device memory, called with device tensors, runs as input copies and one graph
    launch with no host synchronisation (:mod:`pyrt.runtime.graph_forward`); ``graph_outputs``: "copy"
    (default: fresh stream-ordered device buffers the caller owns, freed on drop with no sync on
    the stream they are ready on; see :mod:`pyrt.runtime.graph_forward`) or "static" (views of the method's output
    buffers that its next run overwrites, as torch's CUDA graphs hand out).
    ``share_activations``: engines of one method on one device share one activation area sized to
    the largest (``Program.activation_memory`` reports it); False gives each its own (TensorRT's default).
    ``fold``: run each method's pure kernel calls on constant data once at load instead
    of on every run (weight transposes, rotary tables, static masks; see :mod:`pyrt.runtime.fold`):
    faster runs for a slower load and at most 64 MiB of private memory per method.
    ``fold=False`` loads faster and runs every instruction as the file says.

    ``mmap``: a path is mapped read-only by default, and constants (and engine
    bytes until TensorRT has deserialized them) are views of that mapping, as
    with ExecuTorch's mmap loader. **Truncating or rewriting the file in place
    while the Program is open can kill the process with SIGBUS** (a signal, not
    an exception). Replace files atomically (write elsewhere, then rename), or
    pass ``mmap=False`` to read the file into private memory (its size in RAM,
    checked against the memory available first), which no change to the file
    can affect.

    Threads: a Program may be shared between threads. Runs of one method take
    turns on that method's lock (every run reuses the method's memory-planned
    buffers), so concurrent calls of one method are serialised, not parallel:
    load one Program per thread for parallel throughput. Different methods
    have their own lock, memory and execution contexts and may run at the same
    time. :meth:`set_budget` and :meth:`close` wait for runs in flight; a run
    still waiting when the program is closed raises ProgramClosedError.

    >>> from pyrt.sim import simulated_gpus
    >>> with simulated_gpus(1) as sim:                            # doctest: +SKIP
    ...     prog = Program("model.pte", devices=sim)
    """

    def __init__(self, path: str | os.PathLike[str] | bytes | memoryview, *, data: Any = None, budget: Any = None,
                 device_map: Mapping[Any, Any] | None = None, trt: Any = None, kernels: str | None = None,
                 devices: Any = None, cuda_graphs: bool = False, graph_outputs: str = "copy",
                 mmap: bool = True, fold: bool = True, share_activations: bool = True, headroom: Any = None) -> None:
        self._closed = True  # until loaded: __del__ and close() of a half-built Program do nothing twice
        self._runners: dict[str, MethodRunner] = {}
        self._plans: list[MethodPlan] = []
        self._contexts: list[Any] = []
        self._delegates: list[Any] = []
        self._data: Any = None
        self._extensions: dict[str, Any] = {}
        self._extensions_lock = threading.Lock()
        self._runs: dict[str, int] = {}  # method -> runs started (what pyrt.llm's prefix caching checks)
        check_graph_outputs(graph_outputs)
        if not isinstance(fold, bool):
            raise InputError(f"fold={fold!r} must be True (fold constant kernel calls at load) or False")
        if not isinstance(share_activations, bool):
            raise InputError(f"share_activations={share_activations!r} must be True or False")
        self._share = share_activations
        self._headroom = DEFAULT_HEADROOM if headroom is None else headroom
        check_headroom(self._headroom)
        self._plan: MemoryPlan | None = None
        self._facts: list[EngineMemory] = []
        self._measured: dict[int, tuple[int, int]] = {}  # device -> (free, total) once the engines loaded
        self._engine_bytes: dict[int, int] = {}  # device -> bytes deserializing the engines took
        if not isinstance(mmap, bool):
            raise InputError(f"mmap={mmap!r} must be True (map the file) or False (read it into private memory)")
        self._pte = PteFile.open(path, mmap=mmap)
        self.source = self._pte.source
        self.devices = devices  # what it was loaded on (None: the process's CUDA driver); a draft opens on these too
        try:
            if data is not None:
                self._data = ExternalData.open(data)
                self._pte.attach_data(self._data)
            if devices is not None and trt is None:
                trt = getattr(devices, "tensorrt", None)
            load_budget = parse_load_budget(budget, source="load-time budget")  # named before any device work
            self._load(load_budget, device_map, trt, kernels, devices, cuda_graphs, graph_outputs, fold)
        except BaseException:
            self._release()
            raise
        self._closed = False

    def _load(self, budget: LoadBudget, device_map: Mapping[Any, Any] | None, trt: Any, kernels: str | None,
              devices: Any = None, cuda_graphs: bool = False, graph_outputs: str = "copy",
              fold: bool = True) -> None:
        """Plan each method's load, then load the engines -> plan the memory -> apply ``budget`` -> make contexts."""
        xplans = self._pte.program.execution_plan
        prim = library("prim")
        needs_lib = any(prim.lookup(op) is None for p in xplans for op in p.operators)
        explicit = kernels or os.environ.get(ENV_VAR)
        lib_name = choose_library(kernels) if needs_lib or explicit not in (None, "", "auto") else None
        libraries = [prim] + ([library(lib_name)] if needs_lib and lib_name else [])
        self.kernels = lib_name or "numpy"
        host = host_backend(self.kernels)
        load_plans = [plan_load(p, libraries, device_map) for p in xplans]
        check_host_memory(self.source, [item for load_plan in load_plans for item in load_plan.host_bytes])

        self._cuda = cuda_seam.resolve(getattr(devices, "cuda", devices))  # kept: runs never look it up again
        cuda = self._check_devices(load_plans, self._cuda)
        self._delegates = [d for load_plan in load_plans for d in load_plan.delegates]
        self._arenas, self._graphs = device_arenas(load_plans), graph_reserve(load_plans, cuda_graphs)
        used = sorted({d for load_plan in load_plans for d in load_plan.devices()})
        before = {dev: cuda.mem_info(dev) for dev in used} if cuda else {}
        check_arenas(self._arenas, before, self.source)  # before any engine is deserialized
        load_engines(self._delegates, trt=trt, cuda=cuda, share_activations=self._share)
        self._measured = {dev: cuda.mem_info(dev) for dev in before}
        self._engine_bytes = {dev: max(0, before[dev][0] - self._measured[dev][0]) for dev in before}
        self._facts = engine_memory(self._delegates)
        self._plan = plan_memory(self._facts, self._measured, arenas=self._arenas, graphs=self._graphs,
                                 headroom=self._headroom, fit=budget.kind == "fit", source=self.source)
        apply_budgets(self._delegates, budget, source="load-time budget", planned=self._plan.budgets)
        for load_plan in load_plans:
            ctx = None
            if load_plan.devices():
                ctx = DeviceContext(cuda, load_plan.devices())
                self._contexts.append(ctx)
            plan = finish_method(load_plan, host, cuda, ctx, fold=fold)
            self._plans.append(plan)
            self._runners[plan.name] = MethodRunner(plan, default_kind=host.name, devices=ctx, cuda=self._cuda,
                                                   cuda_graphs=cuda_graphs, graph_outputs=graph_outputs)

    @staticmethod
    def _check_devices(load_plans: Sequence[MethodLoadPlan], cuda: Any) -> Any:
        needed = sorted({d for load_plan in load_plans for d in load_plan.devices()})
        if not needed:
            return None
        for d in needed:
            users = [load_plan.name for load_plan in load_plans if d in load_plan.devices()]
            cuda.require_device(d, purpose=f"method {', '.join(map(repr, users))}")
        return cuda

    # -- running -----------------------------------------------------------------------------
    @property
    def cuda(self) -> Any:
        """The CUDA seam (:class:`pyrt.cuda.Cuda`) this program was loaded with."""
        self._check_open()
        return self._cuda

    @property
    def method_names(self) -> tuple[str, ...]:
        """Names of the program's methods, in file order."""
        self._check_open()
        return tuple(self._runners)

    def run(self, *inputs: Any, method: str = "forward", stream: Any = None) -> Any:
        """Run ``method`` on ``inputs``; outputs come back in the kind of the inputs.

        ``stream``: a pyrt.cuda.Stream, torch.cuda.Stream, object with
        ``__cuda_stream__`` or int handle for engine work (default: torch's current
        stream for torch CUDA inputs, else a pyrt stream per device).
        """
        self._check_open()
        runner = self._runners.get(method)
        if runner is None:
            raise InputError(f"{self.source}: no method {method!r}; methods are {list(self._runners)}")
        self._runs[method] = self._runs.get(method, 0) + 1
        return runner(inputs, stream)

    def runs(self, method: str = "forward") -> int:
        """How many runs of ``method`` were started on this Program (from any caller): ``pyrt.llm`` forgets what its
        KV-cache slots hold when a run it did not make could have written them."""
        return self._runs.get(method, 0)

    def state_sizes(self, method: str = "forward") -> tuple[int, ...]:
        """The first dimensions of ``method``'s state tensors, the memory its runs keep (an LLM file's KV caches;
        :mod:`pyrt.runtime.state_rows`); () where the file exposes none (state inside an opaque engine)."""
        return self._runner_of(method).state_sizes()

    def copy_state_rows(self, method: str, size: int, runs: Sequence[tuple[int, int, int]]) -> int:
        """In ``method``'s state tensors of first dimension ``size``, rows ``src .. src + count - 1`` copied to
        ``dst ..`` for each ``(src, dst, count)`` of ``runs``, ordered after the method's last run and before its
        next (on device: queued on its stream, no host synchronisation); how many tensors it copied in. Not a run
        (:meth:`runs` does not count it)."""
        return self._runner_of(method).copy_state_rows(size, runs)

    def _runner_of(self, method: str) -> MethodRunner:
        self._check_open()
        runner = self._runners.get(method)
        if runner is None:
            raise InputError(f"{self.source}: no method {method!r}; methods are {list(self._runners)}")
        return runner

    def __call__(self, *inputs: Any, stream: Any = None) -> Any:
        """``program(*inputs)`` runs ``forward``."""
        self._check_open()
        runner = self._runners.get("forward")
        if runner is None:  # the error names the methods there are
            return self.run(*inputs, method="forward", stream=stream)
        self._runs["forward"] = self._runs.get("forward", 0) + 1
        return runner(inputs, stream)

    def profile(self, *, device_time: bool = True) -> Profiler:
        """A :class:`pyrt.runtime.profile.Profiler` recording the runs made inside ``with prog.profile() as prof:``.

        ``device_time``: CUDA timing events around device work (when the program has any).
        """
        self._check_open()

        xplans = {p.name: p for p in self._pte.program.execution_plan}
        return Profiler(self._runners.values(), xplans, self.weight_streaming, device_time=device_time,
                        source=self.source)

    # -- weight streaming ----------------------------------------------------------------------
    @property
    def weight_streaming(self) -> list[WeightStreamingInfo]:
        """Per engine: streamable bytes, applied budget, where it came from, scratch memory."""
        self._check_open()
        return [
            WeightStreamingInfo(d.global_index, d.method, d.index, d.device, d.engine.streamable_weights_size,
                                d.engine.applied_budget, d.resolved.source if d.resolved else "automatic",
                                d.engine.weight_streaming_scratch_memory_size)
            for d in self._delegates
        ]

    @property
    def activation_memory(self) -> list[ScratchInfo]:
        """Per group of engines sharing activation memory (one method on one device): bytes held, bytes
        one area per engine would hold, and the saving. Empty with ``share_activations=False``."""
        self._check_open()
        return [s.info() for s in scratches(self._delegates)]

    @property
    def memory_plan(self) -> MemoryPlan:
        """Per device: weights resident (the budgets TensorRT read back) and streamed, shared activations,
        streaming scratch, arenas, graphs and headroom (:mod:`pyrt.runtime.memory_plan`); ``.table()``,
        ``.explain()``."""
        self._check_open()
        assert self._plan is not None
        return self._plan.with_budgets({d.global_index: d.engine.applied_budget for d in self._delegates},
                                       self._facts)

    @property
    def optimization_profiles(self) -> dict[str, list[dict[str, tuple[tuple[int, ...], tuple[int, ...]]]]]:
        """Per engine ("method/delegateN"): each optimization profile's (min, max) per dynamic input."""
        self._check_open()
        return {d.name: d.engine.profiles for d in self._delegates}

    def plan_memory(self, *, gpu_memory: Any = None, headroom: Any = None) -> MemoryPlan:
        """The ``budget="fit"`` plan of this program (nothing is applied): on its devices as measured at
        load, or on GPUs of ``gpu_memory`` bytes each ("24GiB") holding nothing else."""
        self._check_open()
        measured = self._measured
        if gpu_memory is not None:
            spec = parse_budget(gpu_memory, source="gpu_memory")
            if spec is None or spec.kind != "bytes":
                raise BudgetError(f"gpu_memory={gpu_memory!r} must be a byte count such as '24GiB'")
            total = int(spec.value or 0)
            measured = {dev: (max(0, total - self._engine_bytes.get(dev, 0)), total) for dev in measured}
        return plan_memory(self._facts, measured, arenas=self._arenas, graphs=self._graphs,
                           headroom=self._headroom if headroom is None else headroom, source=self.source)

    def set_budget(self, budget: Any, *, headroom: Any = None) -> None:
        """Apply a new weight-streaming budget between runs (None: back to baked / automatic).

        ``"fit"`` applies :meth:`plan_memory` (with ``headroom`` if given). The budget is validated
        before any engine is touched; each engine's execution context is destroyed and recreated with
        no run in flight.
        """
        self._check_open()
        parsed = parse_load_budget(budget, source="set_budget")
        planned = None
        if parsed.kind == "fit":
            if headroom is not None:
                check_headroom(headroom)
                self._headroom = headroom
            planned = self.plan_memory().budgets
        with self._no_runs():
            self._check_open()  # closed while waiting for runs to finish
            for runner in self._runners.values():  # graphs hold the old contexts' work: capture again
                runner.reset_graphs()
            apply_budgets(self._delegates, parsed, source="set_budget", planned=planned)
            if planned is not None:
                self._plan = self.plan_memory()

    # -- what applications keep with it -----------------------------------------------------------
    def extension(self, key: str, make: Callable[[], Any]) -> Any:
        """The object kept with this program under ``key``: ``make()``'s result, made on the first call.

        One per key for the program's lifetime, whichever thread asks first; one with a ``close()`` is closed
        first when the program closes. ``pyrt.llm`` keeps the program's engine cores here (their KV-cache slots
        with them), so every engine and ``pyrt.generate`` call on it shares one.
        """
        self._check_open()
        with self._extensions_lock:
            if key not in self._extensions:
                self._extensions[key] = make()
            return self._extensions[key]

    # -- lifetime -------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ProgramClosedError(f"{self.source}: the program was closed")

    @contextlib.contextmanager
    def _no_runs(self) -> Iterator[None]:
        """Hold every method's lock: runs in flight finish first, new ones wait (always in the same order)."""
        locks = [r._lock for r in self._runners.values()]
        for lock in locks:
            lock.acquire()
        try:
            yield
        finally:
            for lock in reversed(locks):
                lock.release()

    def close(self) -> None:
        """Release engines, device memory, arenas and the file mapping (idempotent).

        Runs in flight in other threads finish first; runs that start or wait afterwards
        raise ProgramClosedError.
        """
        if self._closed:
            return
        with self._extensions_lock:
            extensions = list(self._extensions.values())
        for extension in extensions:  # what applications keep with it stop first (pyrt.llm's engine cores)
            stop = getattr(extension, "close", None)
            if callable(stop):
                stop()
        self._closed = True
        with self._no_runs():
            for runner in self._runners.values():
                runner.closed = True
            self._release()

    def _release(self) -> None:
        for runner in self._runners.values():
            runner.reset_graphs()
        self._runners.clear()
        self._extensions.clear()
        close_engines(self._delegates)
        for plan in self._plans:
            plan.close()
        for ctx in self._contexts:
            ctx.close()
        self._plans.clear()
        self._contexts.clear()
        pte = getattr(self, "_pte", None)
        if pte is not None:
            pte.close()
        data = getattr(self, "_data", None)
        if data is not None:
            data.close()
            self._data = None

    def __del__(self) -> None:  # a safety net; call close() (or use ``with``) to release deterministically
        try:
            self.close()
        except Exception:  # interpreter shutdown: the CUDA seam may already be gone
            pass

    def __enter__(self) -> Program:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"methods={list(self._runners)}"
        return f"pyrt.Program({self.source!r}, {state})"
