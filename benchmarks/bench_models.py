"""Load and run time of real architectures: pyrt against ExecuTorch's runtime, one thread each.

Models: tiny random-init ``transformers`` configs (``pyrt.testing.archs.RUNTIME``: GPT-2, BERT,
Llama, ViT, ResNet, Swin, Wav2Vec2, an LSTM) plus GPT-2 with a dynamic sequence dim.
Every number is a median over samples taken with the implementations interleaved.

* load: ``pyrt.Program(path, kernels="torch")`` + ``close()`` against
  ``Runtime.get().load_program(path)`` + ``load_method("forward")`` (freed on return);
* run: one call with torch tensors, pyrt-torch and pyrt-numpy against ``method.execute``;
* dynamic: GPT-2 exported with a dynamic sequence dim, run at the static model's length,
  against the static GPT-2 (pyrt-torch, and ExecuTorch for reference).

Threads: OMP/OpenBLAS/MKL = 1 (set before numpy or torch import), ``torch.set_num_threads(1)``,
ExecuTorch's threadpool reset to 1.

    python benchmarks/bench_models.py [--samples 15] [--models gpt2,bert] [--no-write]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import gc  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from _common import RESULTS, command_line, machine, markdown_table, write_results  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _median_time(fn: Callable[[], Any], inner: int, clock: Callable[[], float] = time.perf_counter) -> float:
    t0 = clock()
    for _ in range(inner):
        fn()
    return (clock() - t0) / inner


def interleaved(fns: dict[str, Callable[[], Any]], samples: int, inner: int,
                clock: Callable[[], float] = time.perf_counter,
                summary: Callable[[list[float]], float] = statistics.median) -> dict[str, float]:
    """Median (``summary``) seconds per call of each function (``clock``: wall), samples taken in turn."""
    for fn in fns.values():
        fn()  # warm up
    times: dict[str, list[float]] = {k: [] for k in fns}
    gc.disable()
    try:
        for _ in range(samples):
            for k, fn in fns.items():
                times[k].append(_median_time(fn, inner, clock))
    finally:
        gc.enable()
    return {k: summary(v) for k, v in times.items()}


def load_fns(path: Path) -> dict[str, Callable[[], Any]]:
    from executorch.runtime import Runtime

    import pyrt

    rt = Runtime.get()

    def pyrt_load() -> None:  # closed at once, as ExecuTorch's objects are freed at once
        pyrt.Program(path, kernels="torch").close()

    def pyrt_load_unfolded() -> None:
        pyrt.Program(path, kernels="torch", fold=False).close()

    def et_load() -> None:
        rt.load_program(str(path)).load_method("forward")

    return {"pyrt": pyrt_load, "pyrt-unfolded": pyrt_load_unfolded, "executorch": et_load}


def run_fns(path: Path, inputs: tuple[Any, ...]) -> tuple[dict[str, Callable[[], Any]], list[Any]]:
    from executorch.runtime import Runtime

    import pyrt

    method = Runtime.get().load_program(str(path)).load_method("forward")
    pt = pyrt.Program(path, kernels="torch")
    pn = pyrt.Program(path, kernels="numpy")
    pu = pyrt.Program(path, kernels="torch", fold=False)
    np_inputs = [x.numpy() for x in inputs]
    fns = {
        "executorch": lambda: method.execute(list(inputs)),
        "pyrt-torch": lambda: pt(*inputs),
        "pyrt-numpy": lambda: pn(*np_inputs),
        "pyrt-torch-unfolded": lambda: pu(*inputs),
    }
    return fns, [pt, pn, pu, method]


def main() -> int:
    from pyrt.testing.archs import RUNTIME, export_pte

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=15)
    parser.add_argument("--models", default=",".join(RUNTIME))
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "pyrt-bench-models")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args()

    import importlib.metadata

    import torch
    from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool

    torch.set_num_threads(1)
    _unsafe_reset_threadpool(1)
    args.dir.mkdir(parents=True, exist_ok=True)
    rows, notes = [], []
    worst: dict[str, float] = {}
    for name in args.models.split(","):
        path = args.dir / f"{name}.pte"
        inputs = export_pte(name, path)
        load = interleaved(load_fns(path), args.samples, 3)
        fns, keep = run_fns(path, inputs)
        run = interleaved(fns, args.samples, 5)
        for p in keep[:3]:
            p.close()
        lr, rr = load["pyrt"] / load["executorch"], run["pyrt-torch"] / run["executorch"]
        lu, ru = load["pyrt-unfolded"] / load["executorch"], run["pyrt-torch-unfolded"] / run["executorch"]
        for key, value in (("load", lr), ("run", rr), ("load-unfolded", lu), ("run-unfolded", ru)):
            worst[key] = max(worst.get(key, 0.0), value)
        rows.append([name, f"{load['pyrt'] * 1e3:.2f} ms", f"{load['pyrt-unfolded'] * 1e3:.2f} ms",
                     f"{load['executorch'] * 1e3:.2f} ms", f"{lr:.2f}x / {lu:.2f}x",
                     f"{run['pyrt-torch'] * 1e3:.3f} ms", f"{run['pyrt-torch-unfolded'] * 1e3:.3f} ms",
                     f"{run['pyrt-numpy'] * 1e3:.3f} ms", f"{run['executorch'] * 1e3:.3f} ms",
                     f"{rr:.2f}x / {ru:.2f}x"])
        print(" | ".join(rows[-1]), flush=True)
    if "gpt2" in args.models.split(","):
        dyn = args.dir / "gpt2-dyn.pte"
        inputs = export_pte("gpt2", dyn, dynamic_seq=True)
        static_fns, keep_s = run_fns(args.dir / "gpt2.pte", inputs)
        dyn_fns, keep_d = run_fns(dyn, inputs)
        t = interleaved({"static": static_fns["pyrt-torch"], "dynamic": dyn_fns["pyrt-torch"],
                         "et-static": static_fns["executorch"], "et-dynamic": dyn_fns["executorch"]},
                        args.samples, 5)
        for p in (*keep_s[:3], *keep_d[:3]):
            p.close()
        notes.append(f"GPT-2 with a dynamic sequence dim (bound 16) run at length {inputs[0].shape[1]}: pyrt-torch "
                     f"{t['dynamic'] * 1e3:.3f} ms vs {t['static'] * 1e3:.3f} ms static = "
                     f"{t['dynamic'] / t['static']:.2f}x (target <= 1.1x); ExecuTorch {t['et-dynamic'] * 1e3:.3f} ms "
                     f"vs {t['et-static'] * 1e3:.3f} ms = {t['et-dynamic'] / t['et-static']:.2f}x.")
        print(notes[-1])
    versions = (f"torch {torch.__version__} ({torch.get_num_threads()} thread), "
                f"executorch {importlib.metadata.version('executorch')} (threadpool 1)")
    head = ["model", "pyrt load", "pyrt load, fold=False", "ET load", "load ratio (fold / False)", "pyrt-torch run",
            "pyrt-torch run, fold=False", "pyrt-numpy run", "ET run", "run ratio (fold / False)"]
    text = "\n".join([
        "### Real architectures: load and run against ExecuTorch's runtime",
        "",
        f"Command: `{command_line()}` ({args.samples} samples per cell, implementations interleaved, medians; "
        f"{machine()}, {versions}, OMP/OpenBLAS/MKL threads 1). Load = `Program(path, kernels=\"torch\")` vs "
        "`load_program` + `load_method`; `fold=False`: the same without load-time folding (`pyrt/runtime/fold.py`); "
        "run = one call, torch tensors in (numpy for pyrt-numpy). Ratios are pyrt-torch / ExecuTorch. "
        "Tiny random-init configs (`pyrt/testing/archs.py`).",
        "",
        markdown_table(head, rows),
        "",
        *notes,
        "",
        f"Worst load ratio {worst['load']:.2f}x, {worst['load-unfolded']:.2f}x with fold=False (target <= 5x); "
        f"worst run ratio {worst['run']:.2f}x, {worst['run-unfolded']:.2f}x with fold=False (target <= 1.2x).",
    ])
    print("\n" + text)
    if not args.no_write:
        write_results("bench_models", "Real models", text)
        print(f"\nwrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
