"""pyrt's own host time per TensorRT delegate call, above the CUDA and TensorRT seams.

A hand-built program chains N delegates on cuda:0 (``relu`` reference engines on
a 4-element tensor, device arenas between them, host input and output); it
runs on the simulated GPU with engine launches that do nothing, so what a
forward costs is pyrt's Python (binding, staging, streams, events, copies
enqueued) plus the simulated driver's. Every driver call goes through a timing
proxy, and its time is subtracted: the table reports pyrt's own time per
forward and per delegate call. N = 1 and N = 16 separate the per-run cost
(input and output copies, stream setup) from the per-delegate cost (slope).

    .venv/bin/python benchmarks/bench_host_overhead.py            # update RESULTS.md
    .venv/bin/python benchmarks/bench_host_overhead.py --no-write --forwards 2000

Goal (issue 10): <= 10 us per delegate call in eager mode on this 2-core machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import ROOT, command_line, machine, markdown_table, write_results

sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from tests.gpu_programs import chain_program  # noqa: E402


class TimedDriver:
    """A proxy of the simulated driver that adds up the time spent inside its calls."""

    def __init__(self, driver: Any) -> None:
        self._driver = driver
        self.seconds = 0.0
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._driver, name)
        if not callable(target) or not name.startswith("cu"):
            return target
        return self.wrap(target)

    def wrap(self, target: Any) -> Any:
        def timed(*args: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return target(*args)
            finally:
                self.seconds += time.perf_counter() - t0
                self.calls += 1

        return timed


def _program(n: int, directory: Path, prebuilt: Path | None) -> Path:
    if prebuilt is not None:
        return prebuilt / f"chain{n}.pte"
    return chain_program(directory / f"chain{n}.pte", n)


def measure_gpu(n: int, forwards: int, samples: int, path: Path, graphs: bool) -> dict[str, float]:
    """The real CUDA driver (a GPU), engines that do nothing: pyrt's time and the driver's, apart."""
    from cuda.bindings import driver

    from pyrt.cuda import Cuda
    from pyrt.program import Program
    from pyrt.testing import fake_tensorrt
    from pyrt.testing.gpu_reference import reference_tensorrt

    proxy = TimedDriver(driver)
    cuda = Cuda(proxy)
    trt = reference_tensorrt(cuda)
    context = fake_tensorrt.FakeExecutionContext
    saved = context.execute_async_v3
    context.execute_async_v3 = lambda self, stream: True  # type: ignore[method-assign]  # an empty engine
    x = np.linspace(-1, 1, 4, dtype=np.float32)
    try:
        with Program(path, trt=trt, devices=cuda, cuda_graphs=graphs) as prog:
            return _time_forwards(prog, x, proxy, forwards, samples)
    finally:
        context.execute_async_v3 = saved  # type: ignore[method-assign]


def measure(n: int, forwards: int, samples: int, path: Path, graphs: bool) -> dict[str, float]:
    from pyrt.testing import fake_tensorrt, simulated_gpus

    x = np.linspace(-1, 1, 4, dtype=np.float32)
    context = fake_tensorrt.FakeExecutionContext
    names = ("execute_async_v3", "set_tensor_address", "set_input_shape", "infer_shapes", "get_tensor_shape")
    saved = {name: getattr(context, name) for name in names}
    with simulated_gpus(1) as sim:
        sim.driver.launch = lambda stream, work, what: True  # engines that do nothing: no compute cost
        proxy = TimedDriver(sim.driver)
        for name, fn in saved.items():  # the fake TensorRT's own Python is the seam's cost too
            setattr(context, name, proxy.wrap(fn))
        try:
            return _run(path, proxy, sim, x, forwards, samples, graphs)
        finally:
            for name, fn in saved.items():
                setattr(context, name, fn)


def _run(path: Path, proxy: TimedDriver, sim: Any, x: np.ndarray, forwards: int, samples: int,
         graphs: bool) -> dict[str, float]:
    from pyrt import cuda as cuda_seam
    from pyrt.program import Program

    with cuda_seam.use_driver(proxy), Program(path, trt=sim.tensorrt, cuda_graphs=graphs) as prog:
        return _time_forwards(prog, x, proxy, forwards, samples)


def _time_forwards(prog: Any, x: np.ndarray, proxy: TimedDriver, forwards: int, samples: int) -> dict[str, float]:
    """Median pyrt time per forward (the seam's time taken out), the seam's time, and its calls."""
    for _ in range(50):
        prog(x)
    per_forward, seam = [], []
    for _ in range(samples):
        proxy.seconds, proxy.calls = 0.0, 0
        t0 = time.perf_counter()
        for _ in range(forwards):
            prog(x)
        total = time.perf_counter() - t0
        per_forward.append((total - proxy.seconds) / forwards)
        seam.append(proxy.seconds / forwards)
    return {"pyrt_us": statistics.median(per_forward) * 1e6, "seam_us": statistics.median(seam) * 1e6,
            "driver_calls": proxy.calls / forwards}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--forwards", type=int, default=2000, help="forwards per sample")
    parser.add_argument("--samples", type=int, default=7)
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    parser.add_argument("--gpu", action="store_true",
                        help="the real CUDA driver and GPU (engines that do nothing) instead of the simulated one")
    parser.add_argument("--programs", type=Path, help="chain1.pte and chain16.pte made beforehand (no ExecuTorch)")
    args = parser.parse_args()
    fn = measure_gpu if args.gpu else measure
    with tempfile.TemporaryDirectory() as tmp:
        rows = {(mode, n): fn(n, args.forwards, args.samples, _program(n, Path(tmp), args.programs),
                              mode == "cuda graphs")
                for mode in ("eager", "cuda graphs") for n in (1, 16)}
    slope = (rows["eager", 16]["pyrt_us"] - rows["eager", 1]["pyrt_us"]) / 15
    body = [[mode, str(n), f"{r['pyrt_us']:.1f}", f"{r['pyrt_us'] / n:.1f}", f"{r['seam_us']:.1f}",
             f"{r['driver_calls']:.0f}"] for (mode, n), r in rows.items()]
    seam = "real CUDA driver" if args.gpu else "simulated seams"
    table = markdown_table(["mode", "delegates", "pyrt us / forward", "pyrt us / delegate",
                            f"{seam} us / forward", f"{seam} calls / forward"], body)
    text = (f"`{command_line()}` ({machine()}; medians of {args.samples} samples of {args.forwards} forwards; "
            f"N engines in a chain; with CUDA graphs the N-2 middle engines (device memory only) replay as one "
            f"graph, the first and last copy from and to the host eagerly)\n\n{table}\n\n"
            f"Per additional delegate call (slope from 1 to 16): **{slope:.1f} us** of "
            f"pyrt's own Python (goal <= 10 us). Time inside the seams (the {seam}'s calls"
            f"{'' if args.gpu else ' and the fake TensorRT context'}) is measured through timing wrappers and "
            f"excluded{'; engines are empty (execute_async_v3 returns at once)' if args.gpu else ''}.")
    print(text)
    if not args.no_write:
        write_results("bench_host_overhead_gpu" if args.gpu else "bench_host_overhead", "Runtime", text)


if __name__ == "__main__":
    main()
