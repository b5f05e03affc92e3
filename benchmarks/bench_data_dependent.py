"""Data-dependent post-processing: split engines (before issue 24) vs one engine (after).

The model is issue 24's ``masked_select`` between two ``Linear`` layers
(``pyrt.testing.datadep_models``, "masked_select_mlp", input 4 x 8). "split" is how pyrt
exported it before: ``masked_select`` in ExecuTorch between two engines (reproduced with
``torch_executed_ops=["aten.masked_select.default"]``); "one engine" is today's default:
the whole model in one engine whose output TensorRT sizes through pyrt's output allocator.
Both run on the simulated GPU (``pyrt.sim``) with numpy host input and output; the
reference engines compute real results. Per forward it counts the CUDA driver calls
(host->device and device->host copies, stream synchronisations, all calls) through a
counting proxy of the simulated driver, the stream waits TensorRT does inside ``enqueueV3``
to learn a data-dependent size (the fake does the same), and TensorRT launches;
and it times forwards (median of samples). Threads are pinned to 1.

    .venv/bin/python benchmarks/bench_data_dependent.py             # update RESULTS.md
    .venv/bin/python benchmarks/bench_data_dependent.py --no-write
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from _common import ROOT, command_line, machine, markdown_table, write_results  # noqa: E402

sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

MODEL = "masked_select_mlp"
H2D = ("cuMemcpyHtoD", "cuMemcpyHtoDAsync")
D2H = ("cuMemcpyDtoH", "cuMemcpyDtoHAsync")
SYNC = ("cuStreamSynchronize", "cuEventSynchronize", "cuCtxSynchronize")


class CountingDriver:
    """A proxy of the simulated driver that counts its ``cu*`` calls by name."""

    def __init__(self, driver: Any) -> None:
        self._driver = driver
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._driver, name)
        if not callable(target) or not name.startswith("cu"):
            return target

        def counted(*args: Any) -> Any:
            self.calls[name] += 1
            return target(*args)

        setattr(self, name, counted)
        return counted


def export(directory: Path) -> dict[str, Path]:
    from pyrt.export import to_pte
    from pyrt.testing import datadep_models as dm

    model, x = dm.build(MODEL)
    paths = {"split (before)": directory / "split.pte", "one engine (after)": directory / "one.pte"}
    forced = {"split (before)": ["aten.masked_select.default"], "one engine (after)": []}
    for label, path in paths.items():
        summary = to_pte(model, path, (x,), builder="reference", progress=False, torch_executed_ops=forced[label])
        print(f"{label}: {len(summary.engines)} engine(s), fallback {dict(summary.fallback_ops) or 'none'}",
              file=sys.stderr)
    return paths


def measure(path: Path, forwards: int, samples: int) -> dict[str, Any]:
    from pyrt import cuda as cuda_seam
    from pyrt.runtime.program import Program
    from pyrt.sim import simulated_gpus
    from pyrt.testing import datadep_models as dm

    model, _ = dm.build(MODEL)
    x = dm.example(MODEL, "partial").numpy()
    want = model(torch.from_numpy(x)).detach().numpy()
    with simulated_gpus(1) as sim:
        raw = CountingDriver(sim.driver)  # every call, the fake TensorRT's own included
        sim.driver.cuStreamSynchronize = raw.cuStreamSynchronize  # what TensorRT waits for inside enqueueV3
        proxy = CountingDriver(sim.driver)  # pyrt's calls (through its CUDA seam)
        with cuda_seam.use_driver(proxy), Program(path) as prog:
            got = prog(x)
            if got.shape != want.shape or abs(got - want).max() > 1e-5:
                raise SystemExit(f"{path.name}: result differs from eager PyTorch")
            for _ in range(20):
                prog(x)
            proxy.calls.clear()
            raw.calls.clear()
            launches = sim.tensorrt.calls["execute_async_v3"]
            prog(x)
            per_run = dict(proxy.calls)
            inside = raw.calls["cuStreamSynchronize"] - per_run.get("cuStreamSynchronize", 0)
            launches = sim.tensorrt.calls["execute_async_v3"] - launches
            times = []
            for _ in range(samples):
                t0 = time.perf_counter()
                for _ in range(forwards):
                    prog(x)
                times.append((time.perf_counter() - t0) / forwards)
    return {"calls": per_run, "launches": launches, "inside": inside, "seconds": statistics.median(times)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--forwards", type=int, default=200)
    parser.add_argument("--samples", type=int, default=7)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="pyrt-bench-dd-") as tmp:
        paths = export(Path(tmp))
        rows, results = [], {}
        for label, path in paths.items():
            r = results[label] = measure(path, args.forwards, args.samples)
            c = r["calls"]
            rows.append([label, str(r["launches"]), str(sum(c.get(n, 0) for n in H2D)),
                         str(sum(c.get(n, 0) for n in D2H)), str(sum(c.get(n, 0) for n in SYNC)), str(r["inside"]),
                         str(sum(c.values())), f"{r['seconds'] * 1e6:,.0f} us"])
    before, after = results["split (before)"], results["one engine (after)"]
    ratio = sum(after["calls"].values()) / sum(before["calls"].values())
    rows.append(["after / before", "", "", "", "", "", f"{ratio:.2f}x", f"{after['seconds'] / before['seconds']:.2f}x"])
    table = markdown_table(["program", "TensorRT launches", "H2D copies", "D2H copies", "host syncs (pyrt)",
                            "syncs inside TensorRT", "driver calls (pyrt)", "wall time / forward"], rows)
    text = (f"### {MODEL}: split engines vs one engine with an output allocator\n\n"
            f"Command: `{command_line()}` ({machine()}, torch {torch.__version__}, 1 thread; simulated GPU; "
            f"per forward, after 20 warm-up forwards; wall time: median of {args.samples} x {args.forwards} "
            f"forwards, numpy in and out, input giving a partial result).\n\n{table}\n\n"
            "Split: engine 0's result comes back to the host (D2H copy, sync), `masked_select` runs in "
            "ExecuTorch, its result goes to engine 1 (H2D copy). One engine: one input copy, one launch, one "
            "output copy sized to what TensorRT reported; TensorRT waits once inside enqueueV3 to learn the size "
            "(the simulated TensorRT does the same wait). Wall time here is host Python (pyrt and the simulator), "
            "not a GPU measurement.")
    print(text)
    if not args.no_write:
        write_results("bench_data_dependent", "Data-dependent shapes", text)


if __name__ == "__main__":
    main()
