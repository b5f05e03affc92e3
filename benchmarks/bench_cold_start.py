"""Cold start: a fresh process from its start to the first result, pyrt against ExecuTorch's Python runtime.

What a user of a command-line tool or a serverless function feels is not a warm load but
the whole process: interpreter start, imports, load, first run. Each sample is one fresh
``python -c`` child per implementation, taken in turn (interleaved); the parent times from
just before the child is started to the moment the child's first output line arrives,
and the child's peak RSS (``VmHWM`` in ``/proc/self/status``, read by the child as it prints:
``ru_maxrss`` from ``os.wait4`` would report the forking parent's size when that is larger).

* pyrt-numpy: ``import numpy, pyrt``, ``Program(path, kernels="numpy")``, one call with numpy
  arrays (the child reports whether torch got imported: it must not);
* pyrt-torch: ``import torch, pyrt``, ``Program(path, kernels="torch")``, one call with torch tensors;
* executorch: ``from executorch.runtime import Runtime``, ``load_program`` + ``load_method``,
  ``method.execute`` (ExecuTorch's Python runtime over its C++ runtime and portable kernels).

Every child reads the same inputs from ``.npy`` files and prints a checksum of its first
output; the checksums must agree. Models: the tiny random-init ``transformers`` configs of
``benchmarks/bench_models.py`` (``pyrt/testing/archs.py``). Threads: OMP/OpenBLAS/MKL = 1 in
every child's environment, ``torch.set_num_threads(1)`` in the torch children, ExecuTorch's
threadpool reset to 1.

Warm-load guard: in this (parent) process, ``bench_models``'s load functions (warm
``Program(path, kernels="torch")`` + ``close()`` against ExecuTorch's C++ ``load_program`` +
``load_method``), interleaved; goal: no model worse than 40x.

    python benchmarks/bench_cold_start.py [--samples 5] [--models gpt2,llama] [--no-write]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from _common import RESULTS, ROOT, command_line, machine, markdown_table, write_results  # noqa: E402

sys.path.insert(0, str(ROOT))

IMPLS = ("pyrt-numpy", "pyrt-torch", "executorch")
GOALS = {"pyrt-numpy": 0.1, "pyrt-torch": 0.4}  # cold start / ExecuTorch's
WARM_GOAL = 40.0  # warm load / ExecuTorch's C++ load

# One child per sample. argv: impl, program, input files. The first line printed is the result.
CHILD = r"""
import sys
impl, path, files = sys.argv[1], sys.argv[2], sys.argv[3:]
import numpy as np
arrays = [np.load(f) for f in files]
if impl == "pyrt-numpy":
    import pyrt
    with pyrt.Program(path, kernels="numpy") as prog:
        out = prog(*arrays)
    first = np.asarray(out[0] if isinstance(out, (list, tuple)) else out)
elif impl == "pyrt-torch":
    import torch
    torch.set_num_threads(1)
    import pyrt
    with pyrt.Program(path, kernels="torch") as prog:
        out = prog(*[torch.from_numpy(a) for a in arrays])
    first = (out[0] if isinstance(out, (list, tuple)) else out).numpy()
else:
    import torch
    torch.set_num_threads(1)
    from executorch.runtime import Runtime
    from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool
    _unsafe_reset_threadpool(1)
    method = Runtime.get().load_program(path).load_method("forward")
    first = method.execute([torch.from_numpy(a) for a in arrays])[0].numpy()
with open("/proc/self/status") as fh:  # VmHWM: this process's peak RSS (ru_maxrss would count the parent's,
    hwm = next(int(l.split()[1]) for l in fh if l.startswith("VmHWM:"))  # fork's pages before exec)
print(repr(float(np.asarray(first, dtype=np.float64).sum())), "torch" in sys.modules, hwm, flush=True)
"""


def child_env() -> dict[str, str]:
    """The children's environment: threads pinned, this checkout first on the path."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def cold_sample(impl: str, path: Path, files: list[Path]) -> dict[str, Any]:
    """One fresh process: seconds to its first output line, its peak RSS (MiB), checksum, torch imported."""
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", CHILD, impl, str(path), *map(str, files)], cwd=ROOT,
                                env=child_env(), stdout=subprocess.PIPE, stderr=err, text=True)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        seconds = time.perf_counter() - t0
        proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0 or not line.strip():
            err.seek(0)
            raise SystemExit(f"{impl} on {path.name} failed ({proc.returncode}):\n{err.read().decode()[-4000:]}")
    checksum, torch_imported, hwm_kib = line.split()
    return {"s": seconds, "cpu": usage.ru_utime + usage.ru_stime, "rss": int(hwm_kib) / 1024,
            "sum": float(checksum), "torch": torch_imported == "True"}


def cold(path: Path, files: list[Path], samples: int) -> dict[str, dict[str, Any]]:
    """Median seconds and peak RSS per implementation over ``samples`` rounds taken in turn."""
    runs: dict[str, list[dict[str, Any]]] = {impl: [] for impl in IMPLS}
    for _ in range(samples):
        for impl in IMPLS:
            runs[impl].append(cold_sample(impl, path, files))
    sums = {impl: r[0]["sum"] for impl, r in runs.items()}
    ref = sums["executorch"]
    for impl, value in sums.items():
        if abs(value - ref) > 1e-3 * max(1.0, abs(ref)):
            raise SystemExit(f"{path.name}: {impl}'s first output sums to {value}, ExecuTorch's to {ref}")
    if any(r["torch"] for r in runs["pyrt-numpy"]):
        raise SystemExit(f"{path.name}: the pyrt-numpy child imported torch")
    return {impl: {key: statistics.median(r[key] for r in rs) for key in ("s", "cpu", "rss")}
            | {"min": min(r["s"] for r in rs), "max": max(r["s"] for r in rs)} for impl, rs in runs.items()}


def prepare(name: str, folder: Path) -> tuple[Path, list[Path]]:
    """Export model ``name`` (as bench_models does) and save its inputs as .npy files."""
    import numpy as np

    from pyrt.testing.archs import export_pte

    path = folder / f"{name}.pte"
    inputs = export_pte(name, path)
    files = []
    for i, x in enumerate(inputs):
        files.append(folder / f"{name}-input{i}.npy")
        np.save(files[-1], x.numpy())
    return path, files


def warm_load(path: Path, samples: int) -> dict[str, float]:
    """bench_models's warm load: pyrt (torch kernels, folding) and ExecuTorch's C++ load, interleaved.

    Median wall time; the best sample's wall time (``min-`` keys) and the median of this
    thread's CPU time (``cpu-`` keys), which count less of the time other processes of a
    shared machine hold the core.
    """
    from bench_models import interleaved, load_fns

    fns = load_fns(path)
    fns = {"pyrt": fns["pyrt"], "executorch": fns["executorch"]}
    best = interleaved(fns, samples, 3, summary=min)
    cpu = interleaved(fns, samples, 3, clock=time.thread_time)
    return (interleaved(fns, samples, 3) | {f"min-{k}": v for k, v in best.items()}
            | {f"cpu-{k}": v for k, v in cpu.items()})


def report(rows: list[list[str]], worst: dict[str, float], args: argparse.Namespace, versions: str) -> str:
    head = ["model", "pyrt-numpy", "pyrt-torch", "ExecuTorch (Python runtime)", "numpy / ET (CPU)",
            "torch / ET (CPU)", "warm load pyrt / ET C++ (best, CPU)"]

    def verdict(key: str, goal: float) -> str:
        wall, cpu = worst[key], worst[f"cpu-{key}"]
        best = f", {worst['min-' + key]:.2f}x best wall" if f"min-{key}" in worst else ""
        return (f"worst {wall:.3f}x median wall{best}, {cpu:.3f}x median CPU: "
                f"{'met' if max(wall, cpu) <= goal else 'met on CPU time, NOT on wall' if cpu <= goal else 'NOT met'}")

    return "\n".join([
        "### Cold start: fresh process to first output, against ExecuTorch's Python runtime",
        "",
        f"Command: `{command_line()}` ({args.samples} samples per cell, one fresh process each, implementations "
        f"in turn; {machine()}, {versions}; OMP/OpenBLAS/MKL threads 1 in every child, `torch.set_num_threads(1)`, "
        "ExecuTorch threadpool 1). Cells: median wall time from just before the child starts to its first output "
        "line (imports, load, first run with the model's example inputs from .npy files), min-max in brackets; "
        "median CPU time of the child (user + sys from `os.wait4`, the whole process); median peak RSS (the "
        "child's `VmHWM` at its first output). pyrt-numpy = `Program(path, kernels=\"numpy\")` with numpy arrays "
        "(torch never imported, checked per child); pyrt-torch = `kernels=\"torch\"` with torch tensors; "
        "ExecuTorch = `executorch.runtime` `load_program` + `load_method` + `execute`. The three first outputs "
        "agree. Ratios: wall medians, CPU medians in brackets. Warm load = `bench_models`'s load "
        "(`Program(path, kernels=\"torch\")` + `close()` vs `load_program` + `load_method`, "
        f"{args.warm_samples} interleaved samples of 3 in the parent; median wall, then in brackets the best "
        "sample's wall and the median of the thread's CPU time). Load average (1 min) at the start and end: "
        f"{args.load_before:.1f} / {os.getloadavg()[0]:.1f} (the CPU times count less of other processes' use "
        "of the cores than wall times do). Tiny random-init configs (`pyrt/testing/archs.py`).",
        "",
        markdown_table(head, rows),
        "",
        f"Goals: pyrt-numpy <= {GOALS['pyrt-numpy']}x ExecuTorch's cold start on every model: "
        f"{verdict('pyrt-numpy', GOALS['pyrt-numpy'])}; pyrt-torch <= {GOALS['pyrt-torch']}x: "
        f"{verdict('pyrt-torch', GOALS['pyrt-torch'])}; warm load <= {WARM_GOAL:.0f}x ExecuTorch's C++ load: "
        f"{verdict('warm', WARM_GOAL)}.",
    ])


def cell(c: dict[str, Any]) -> str:
    return f"{c['s']:.3f} s ({c['min']:.2f}-{c['max']:.2f}), CPU {c['cpu']:.2f} s, {c['rss']:.0f} MiB"


def main() -> int:
    from pyrt.testing.archs import RUNTIME

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--models", default=",".join(RUNTIME))
    parser.add_argument("--warm-samples", type=int, default=21, help="samples of the warm-load guard (cheap)")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "pyrt-bench-cold")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args()
    args.load_before = os.getloadavg()[0]

    import importlib.metadata

    import torch
    from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool

    torch.set_num_threads(1)
    _unsafe_reset_threadpool(1)
    args.dir.mkdir(parents=True, exist_ok=True)
    rows: list[list[str]] = []
    worst: dict[str, float] = {}
    for name in args.models.split(","):
        path, files = prepare(name, args.dir)
        c = cold(path, files, args.samples)
        w = warm_load(path, args.warm_samples)
        ratios = {impl: c[impl]["s"] / c["executorch"]["s"] for impl in GOALS}
        ratios |= {f"cpu-{impl}": c[impl]["cpu"] / c["executorch"]["cpu"] for impl in GOALS}
        ratios |= {"warm": w["pyrt"] / w["executorch"], "cpu-warm": w["cpu-pyrt"] / w["cpu-executorch"],
                   "min-warm": w["min-pyrt"] / w["min-executorch"]}
        for key, value in ratios.items():
            worst[key] = max(worst.get(key, 0.0), value)
        rows.append([name, cell(c["pyrt-numpy"]), cell(c["pyrt-torch"]), cell(c["executorch"]),
                     f"{ratios['pyrt-numpy']:.3f}x ({ratios['cpu-pyrt-numpy']:.3f}x)",
                     f"{ratios['pyrt-torch']:.3f}x ({ratios['cpu-pyrt-torch']:.3f}x)",
                     f"{w['pyrt'] * 1e3:.2f} / {w['executorch'] * 1e3:.2f} ms = {ratios['warm']:.1f}x "
                     f"({ratios['min-warm']:.1f}x, {ratios['cpu-warm']:.1f}x)"])
        print(" | ".join(rows[-1]), flush=True)
    versions = (f"torch {torch.__version__}, executorch {importlib.metadata.version('executorch')}, "
                f"numpy {importlib.metadata.version('numpy')}")
    text = report(rows, worst, args, versions)
    print("\n" + text)
    if not args.no_write:
        write_results("bench_cold_start", "Cold start", text)
        print(f"\nwrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
