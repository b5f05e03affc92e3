"""pyrt's own host time per TensorRT delegate call, above the CUDA and TensorRT seams.

A hand-built program chains N delegates on cuda:0 (``relu`` reference engines on
a 4-element tensor, device arenas between them, host input and output); it
runs on the simulated GPU with engine launches that do nothing, so what a
forward costs is pyrt's Python (binding, staging, streams, events, copies
enqueued) plus the simulated driver's. Every driver call goes through a timing
proxy, and its time is subtracted: the table reports pyrt's own time per
forward and per delegate call. N = 1 and N = 16 separate the per-run cost
(input and output copies, stream setup) from the per-delegate cost (slope).
The timing proxy's own Python per call (measured on a no-op at start) is
taken out too. A second column times the same forwards with every seam call
stubbed (answered at once with its last real result), nothing subtracted.

Two kinds of program: "host" takes a numpy input and gives a numpy output
(with CUDA graphs only the middle engines replay as a graph); "device" plans
its input and output in cuda:0 memory too and is called with a pyrt
DeviceTensor and a caller stream, so with CUDA graphs the whole forward is
input copy + one graph launch (``pyrt.runtime.graph_forward``): "copy" hands back a
fresh device buffer per forward, "static" a view of the planned output buffer
that the next forward overwrites (``Program(graph_outputs="static")``).

    .venv/bin/python benchmarks/bench_host_overhead.py            # update RESULTS.md
    .venv/bin/python benchmarks/bench_host_overhead.py --no-write --forwards 2000

Goals (issue 10): <= 10 us per delegate call in eager mode, <= 5 us per forward with CUDA graphs,
on this 2-core machine.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import ROOT, command_line, machine, markdown_table, write_results

sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from tests.fixtures.gpu_programs import chain_program  # noqa: E402


class TimedDriver:
    """A proxy of the simulated driver that adds up the time spent inside its calls."""

    def __init__(self, driver: Any, clock: Any = time.perf_counter) -> None:
        self._driver = driver
        self.clock = clock
        self.seconds = 0.0
        self.calls = 0
        self.stub = False  # True: every wrapped call returns its last real result at once (see ``wrap``)

    def overhead(self, rounds: int = 100_000, repeats: int = 9) -> float:
        """Seconds per call that the proxy adds outside its timed window, over a direct call of a no-op
        (the median of ``repeats`` measurements)."""
        def noop(*args: Any) -> tuple[int]:
            return (0,)

        wrapped = self.wrap(noop)
        found = []
        saved = self.seconds, self.calls
        for _ in range(repeats):
            before = self.seconds
            t0 = self.clock()
            for _ in range(rounds):
                wrapped(1, 2)
            inside = self.seconds - before
            t1 = self.clock()
            for _ in range(rounds):
                noop(1, 2)
            direct = self.clock() - t1
            found.append(((t1 - t0) - inside - direct) / rounds)
        self.seconds, self.calls = saved
        return max(statistics.median(found), 0.0)

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._driver, name)
        if not callable(target) or not name.startswith("cu"):
            return target
        wrapped = self.wrap(target)
        setattr(self, name, wrapped)  # found directly from now on: the lookup costs no more than the driver's
        return wrapped

    def wrap(self, target: Any) -> Any:
        """``target`` timed; with ``stub`` set, a call returns ``target``'s last result without calling it
        (nothing timed or subtracted: the stub's own Python is billed to pyrt)."""
        clock = self.clock
        last: list[Any] = [None]

        def timed(*args: Any) -> Any:
            if self.stub:
                return last[0]
            t0 = clock()
            try:
                last[0] = result = target(*args)
                return result
            finally:
                self.seconds += clock() - t0
                self.calls += 1

        return timed


def _program(n: int, directory: Path, prebuilt: Path | None, io: str) -> Path:
    name = f"chain{n}.pte" if io == "host" else f"chain{n}_device_io.pte"
    if prebuilt is not None:
        return prebuilt / name
    return chain_program(directory / name, n, device_io=io == "device")


class Case:
    """One row: the program's I/O ("host" or "device"), CUDA graphs or not, and the graph output policy."""

    def __init__(self, io: str, graphs: bool, outputs: str = "copy") -> None:
        self.io, self.graphs, self.outputs = io, graphs, outputs

    @property
    def mode(self) -> str:
        if not self.graphs:
            return "eager"
        return "cuda graphs" if self.io == "host" else f"cuda graphs, {self.outputs} outputs"

    def program(self, path: Path, trt: Any, cuda: Any) -> Any:
        from pyrt.runtime.program import Program

        return Program(path, trt=trt, devices=cuda, cuda_graphs=self.graphs, graph_outputs=self.outputs)

    def call(self, prog: Any, cuda: Any) -> tuple[Any, dict[str, Any]]:
        """The forward's input and keyword arguments: numpy, or a device tensor and a caller stream."""
        x = np.linspace(-1, 1, 4, dtype=np.float32)
        if self.io == "host":
            return x, {}
        from pyrt.format.dtypes import ScalarType
        from pyrt.memory.tensors import OwnedDeviceTensor

        alloc = cuda.alloc(x.nbytes, 0)
        cuda.memcpy_htod(alloc, x)
        return OwnedDeviceTensor(alloc, 0, ScalarType.FLOAT, (4,), 4), {"stream": cuda.stream(0)}


CLOCKS = {"thread": time.thread_time, "wall": time.perf_counter}
_OVERHEAD: dict[Any, float] = {}
CASES = (Case("host", False), Case("host", True), Case("device", False), Case("device", True, "copy"),
         Case("device", True, "static"))


def measure_gpu(n: int, forwards: int, samples: int, path: Path, case: Case, clock: str) -> dict[str, float]:
    """The real CUDA driver (a GPU), engines that do nothing: pyrt's time and the driver's, apart."""
    from cuda.bindings import driver

    from pyrt.cuda import Cuda
    from pyrt.sim import fake_tensorrt
    from pyrt.sim.gpu_reference import reference_tensorrt

    proxy = TimedDriver(driver, CLOCKS[clock])
    cuda = Cuda(proxy)
    trt = reference_tensorrt(cuda)
    context = fake_tensorrt.FakeExecutionContext
    saved = context.execute_async_v3
    context.execute_async_v3 = lambda self, stream_handle: True  # type: ignore[method-assign]  # an empty engine
    try:
        with case.program(path, trt, cuda) as prog:
            return _time_forwards(prog, case, cuda, proxy, forwards, samples)
    finally:
        context.execute_async_v3 = saved  # type: ignore[method-assign]


def measure(n: int, forwards: int, samples: int, path: Path, case: Case, clock: str) -> dict[str, float]:
    from pyrt.sim import fake_tensorrt, simulated_gpus

    context = fake_tensorrt.FakeExecutionContext
    names = ("execute_async_v3", "set_tensor_address", "set_input_shape", "infer_shapes", "get_tensor_shape")
    saved = {name: getattr(context, name) for name in names}
    with simulated_gpus(1) as sim:
        sim.driver.launch = lambda stream, work, what: True  # engines that do nothing: no compute cost
        proxy = TimedDriver(sim.driver, CLOCKS[clock])
        for name, fn in saved.items():  # the fake TensorRT's own Python is the seam's cost too
            setattr(context, name, proxy.wrap(fn))
        try:
            return _run(path, proxy, sim, case, forwards, samples)
        finally:
            for name, fn in saved.items():
                setattr(context, name, fn)


def _run(path: Path, proxy: TimedDriver, sim: Any, case: Case, forwards: int, samples: int) -> dict[str, float]:
    from pyrt import cuda as cuda_seam

    with cuda_seam.use_driver(proxy) as cuda, case.program(path, sim.tensorrt, cuda) as prog:
        return _time_forwards(prog, case, cuda, proxy, forwards, samples)


def _time_forwards(prog: Any, case: Case, cuda: Any, proxy: TimedDriver, forwards: int,
                   samples: int) -> dict[str, float]:
    """Median pyrt time per forward (the seam's time and the proxy's own taken out), the seam's time, its calls."""
    x, kwargs = case.call(prog, cuda)
    overhead = _OVERHEAD.get(proxy.clock)
    if overhead is None:  # once per clock: every row subtracts the same
        overhead = _OVERHEAD[proxy.clock] = proxy.overhead()
    for _ in range(50):
        prog(x, **kwargs)
    per_forward, seam = [], []
    for _ in range(samples):
        cuda.synchronize(0)  # the simulated streams' queues start empty
        gc.collect()
        gc.disable()  # as timeit does: a collection would bill pyrt for the simulator's garbage
        proxy.seconds, proxy.calls = 0.0, 0
        t0 = proxy.clock()
        for _ in range(forwards):
            prog(x, **kwargs)
        total = proxy.clock() - t0
        gc.enable()
        per_forward.append((total - proxy.seconds - proxy.calls * overhead) / forwards)
        seam.append(proxy.seconds / forwards)
    cuda.synchronize(0)
    calls = proxy.calls / forwards
    stubbed = []  # the same forwards with every seam call answered by its stub (see TimedDriver.wrap)
    proxy.stub = True
    try:
        for _ in range(samples):
            gc.collect()
            gc.disable()
            t0 = proxy.clock()
            for _ in range(forwards):
                prog(x, **kwargs)
            stubbed.append((proxy.clock() - t0) / forwards)
            gc.enable()
    finally:
        proxy.stub = False
    cuda.synchronize(0)
    return {"pyrt_us": statistics.median(per_forward) * 1e6, "seam_us": statistics.median(seam) * 1e6,
            "driver_calls": calls, "proxy_us": overhead * 1e6, "stub_us": statistics.median(stubbed) * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--forwards", type=int, default=2000, help="forwards per sample")
    parser.add_argument("--samples", type=int, default=7)
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    parser.add_argument("--gpu", action="store_true",
                        help="the real CUDA driver and GPU (engines that do nothing) instead of the simulated one")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="thread",
                        help="thread: this thread's CPU time (other processes on the machine do not count); wall")
    parser.add_argument("--programs", type=Path, help="chain1.pte and chain16.pte made beforehand (no ExecuTorch)")
    args = parser.parse_args()
    fn = measure_gpu if args.gpu else measure
    with tempfile.TemporaryDirectory() as tmp:
        fn(1, args.forwards, 1, _program(1, Path(tmp), args.programs, "host"), CASES[0], args.clock)  # warm-up
        rows = {(case.io, case.mode, n): fn(n, args.forwards, args.samples,
                                            _program(n, Path(tmp), args.programs, case.io), case, args.clock)
                for case in CASES for n in (1, 16)}
    slope = (rows["host", "eager", 16]["pyrt_us"] - rows["host", "eager", 1]["pyrt_us"]) / 15
    body = [[io, mode, str(n), f"{r['pyrt_us']:.1f}", f"{r['pyrt_us'] / n:.1f}", f"{r['stub_us']:.1f}",
             f"{r['seam_us']:.1f}", f"{r['driver_calls']:.0f}"] for (io, mode, n), r in rows.items()]
    seam = "real CUDA driver" if args.gpu else "simulated seams"
    table = markdown_table(["I/O", "mode", "delegates", "pyrt us / forward", "pyrt us / delegate",
                            "pyrt us / forward, stubbed seams", f"{seam} us / forward", f"{seam} calls / forward"],
                           body)
    graphed = [r["pyrt_us"] for (io, mode, _), r in rows.items() if io == "device" and mode.startswith("cuda")]
    stubbed: dict[str, list[float]] = {}  # graph mode -> stubbed us per forward, N = 1 and 16
    for (io, mode, _), r in rows.items():
        if io == "device" and mode.startswith("cuda"):
            stubbed.setdefault(mode.removeprefix("cuda graphs, "), []).append(r["stub_us"])
    proxy = statistics.median(r["proxy_us"] for r in rows.values())
    text = (f"`{command_line()}` ({machine()}; medians of {args.samples} samples of {args.forwards} forwards, "
            f"{'CPU time of the thread' if args.clock == 'thread' else 'wall-clock time'}; "
            f"N engines in a chain. Host I/O: numpy in and out; with CUDA graphs the N-2 middle engines "
            f"(device memory only) replay as one graph, the first and last copy from and to the host eagerly. "
            f"Device I/O: the input and output are planned in device memory, the caller passes a pyrt "
            f"DeviceTensor and a stream; with CUDA graphs a forward is the input copy and one graph launch, "
            f"with a fresh output buffer (copy) or the planned one (static))\n\n{table}\n\n"
            f"Per additional delegate call (slope from 1 to 16, host I/O, eager): **{slope:.1f} us** of "
            f"pyrt's own Python (goal <= 10 us). Per forward with CUDA graphs and device I/O: "
            f"**{min(graphed):.1f}-{max(graphed):.1f} us** (goal <= 5 us); stubbed seams: "
            + ", ".join(f"{mode} {min(v):.1f}-{max(v):.1f} us" for mode, v in stubbed.items()) +
            f". Time inside the seams (the {seam}'s calls"
            f"{'' if args.gpu else ' and the fake TensorRT context'}) is measured through timing wrappers and "
            f"excluded, and so is the wrappers' own cost ({proxy:.2f} us per call, measured on a no-op). The stubbed "
            f"column is a second method with nothing subtracted: the same forwards again, every seam call answered "
            f"at once by its wrapper with that call's last real result, the wrapper's own Python billed to pyrt. "
            f"The two bracket pyrt's own time: the subtraction also bills pyrt for what the simulator's heavy Python "
            f"does to caches around each call, the stubs leave caches warmer than real driver calls would. The garbage "
            f"collector is off while timing, as in timeit"
            f"{'; engines are empty (execute_async_v3 returns at once)' if args.gpu else ''}.")
    print(text)
    if not args.no_write:
        write_results("bench_host_overhead_gpu" if args.gpu else "bench_host_overhead", "Runtime", text)


if __name__ == "__main__":
    main()
