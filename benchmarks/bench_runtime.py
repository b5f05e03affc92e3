"""Run-time latency on the CPU: pyrt vs ExecuTorch's C++ runtime vs eager PyTorch.

Both programs are exported once with ExecuTorch 1.5.1 (no delegates); every
runtime then runs the *same* .pte file in the same process:

- ``elementwise``: 5 ops (add, mul, relu, sub, sigmoid) on two 4x4 float32 tensors;
- ``small_cnn``: conv-bn-relu-maxpool-conv-relu-mean-linear-softmax on 1x3x32x32.

Implementations: pyrt with torch kernels, pyrt with the numpy core set,
ExecuTorch's C++ runtime through ``executorch.runtime`` (portable kernels,
``method.execute``) and eager ``torch`` (``torch.no_grad``). Each sample times
``--number`` back-to-back calls with torch tensors in and out; implementations
take turns sample by sample so drift hits all of them alike; the table reports
medians of per-call time and ratios against ExecuTorch and eager torch.
torch runs single-threaded by default (``--threads``), like ExecuTorch's portable kernels.

    .venv/bin/python benchmarks/bench_runtime.py                    # update RESULTS.md
    .venv/bin/python benchmarks/bench_runtime.py --samples 5 --no-write
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import RESULTS, ROOT, command_line, machine, markdown_table, write_results

sys.path.insert(0, str(ROOT))
IMPLS = ("pyrt-torch", "pyrt-numpy", "executorch-cpp", "eager-torch")


def models() -> dict[str, tuple[Any, tuple[Any, ...], int]]:
    """name -> (module, example inputs, calls per sample)."""
    import torch

    class Elementwise(torch.nn.Module):
        def forward(self, x: Any, y: Any) -> Any:
            return torch.sigmoid(torch.relu((x + y) * x) - y)

    class SmallCNN(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1 = torch.nn.Conv2d(3, 16, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(16)
            self.c2 = torch.nn.Conv2d(16, 32, 3, stride=2)
            self.fc = torch.nn.Linear(32, 10)

        def forward(self, x: Any) -> Any:
            x = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.c1(x))), 2)
            x = torch.relu(self.c2(x)).mean(dim=(2, 3))
            return torch.softmax(self.fc(x), -1)

    torch.manual_seed(0)
    return {
        "elementwise": (Elementwise(), (torch.randn(4, 4), torch.randn(4, 4)), 2000),
        "small_cnn": (SmallCNN().eval(), (torch.randn(1, 3, 32, 32),), 100),
    }


def export(name: str, module: Any, inputs: tuple[Any, ...], directory: Path) -> Path:
    from executorch.exir import to_edge_transform_and_lower
    from torch.export import export as torch_export

    path = directory / f"{name}.pte"
    path.write_bytes(to_edge_transform_and_lower(torch_export(module, inputs)).to_executorch().buffer)
    return path


def runners(path: Path, module: Any) -> dict[str, Callable[..., Any]]:
    import torch
    from executorch.runtime import Runtime

    from pyrt.runtime.program import Program

    pyrt_torch = Program(path, kernels="torch")
    pyrt_numpy = Program(path, kernels="numpy")
    method = Runtime.get().load_program(str(path)).load_method("forward")

    def eager(*xs: Any) -> Any:
        with torch.no_grad():
            return module(*xs)

    return {"pyrt-torch": pyrt_torch, "pyrt-numpy": pyrt_numpy,
            "executorch-cpp": lambda *xs: method.execute(list(xs)), "eager-torch": eager}


def check_agreement(fns: dict[str, Callable[..., Any]], inputs: tuple[Any, ...]) -> None:
    import torch

    ref = fns["eager-torch"](*inputs)
    for name, fn in fns.items():
        out = fn(*inputs)
        out = out[0] if isinstance(out, (list, tuple)) else out
        if not torch.allclose(torch.as_tensor(out), ref, rtol=1e-4, atol=1e-5):
            raise SystemExit(f"{name} disagrees with eager torch")


def measure(fns: dict[str, Callable[..., Any]], inputs: tuple[Any, ...], number: int,
            samples: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():  # warm up
        for _ in range(max(number // 10, 3)):
            fn(*inputs)
    for _ in range(samples):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(number):
                fn(*inputs)
            times[name].append((time.perf_counter() - t0) / number)
    return times


def fmt_us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f} us"


def table(rows: list[dict[str, Any]]) -> str:
    head = ["program", "implementation", "median per call", "min-max of samples", "vs ExecuTorch C++",
            "vs eager torch"]
    body = [[r["program"], r["impl"], fmt_us(r["median"]), f"{fmt_us(r['min'])}-{fmt_us(r['max'])}",
             f"{r['vs_et']:.2f}x", f"{r['vs_eager']:.2f}x"] for r in rows]
    return markdown_table(head, body)


def verdict(rows: list[dict[str, Any]]) -> str:
    get = {(r["program"], r["impl"]): r for r in rows}
    parts = []
    cnn = get.get(("small_cnn", "pyrt-torch"))
    if cnn:
        parts.append(f"small CNN pyrt-torch = {cnn['vs_eager']:.2f}x eager torch "
                     f"({'met' if cnn['vs_eager'] <= 1.2 else 'NOT met'}: target <= 1.2x)")
    ew = get.get(("elementwise", "pyrt-torch"))
    if ew:
        parts.append(f"5-op elementwise pyrt-torch = {ew['vs_et']:.2f}x ExecuTorch C++ ({fmt_us(ew['median'])}; "
                     f"{'met' if ew['vs_et'] <= 3 else 'NOT met'}: target <= 3x)")
    return "Result: " + "; ".join(parts) + "."


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=15, help="timed samples per implementation")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply calls per sample")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch.set_num_threads (0: torch's default). Default 1: ExecuTorch's portable "
                             "kernels are single-threaded, and idle OpenMP workers on a shared box add noise")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "pyrt-bench-runtime")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args()
    import importlib.metadata

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    args.dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, (module, inputs, number) in models().items():
        path = export(name, module, inputs, args.dir)
        fns = runners(path, module)
        check_agreement(fns, inputs)
        n = max(int(number * args.scale), 1)
        times = measure(fns, inputs, n, args.samples)
        et, eager = statistics.median(times["executorch-cpp"]), statistics.median(times["eager-torch"])
        for impl in IMPLS:
            med = statistics.median(times[impl])
            rows.append({"program": name, "impl": impl, "median": med, "min": min(times[impl]),
                         "max": max(times[impl]), "vs_et": med / et, "vs_eager": med / eager})
            print(f"{name:12s} {impl:15s} {fmt_us(med):>12s}  {med / et:6.2f}x ET  {med / eager:6.2f}x eager",
                  flush=True)
        fns["pyrt-torch"].close()
        fns["pyrt-numpy"].close()

    et_version = importlib.metadata.version("executorch")
    versions = f"torch {torch.__version__} ({torch.get_num_threads()} threads), executorch {et_version}"
    text = "\n".join([
        "### Latency per call on the CPU, same .pte files (torch tensors in and out)",
        "",
        f"Command: `{command_line()}` ({args.samples} samples per cell, implementations interleaved; "
        f"{machine()}, {versions}). "
        "ExecuTorch C++ = `executorch.runtime` `method.execute` (portable kernels); pyrt-numpy = "
        "`Program(path, kernels=\"numpy\")`; eager torch under `torch.no_grad()`. The machine may be shared: "
        "absolute times drift between runs, ratios compare samples taken side by side.",
        "",
        table(rows),
        "",
        verdict(rows),
    ])
    print("\n" + text)
    if not args.no_write:
        write_results("bench_runtime", "Runtime", text)
        print(f"\nwrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
