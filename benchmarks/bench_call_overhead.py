"""Per-call cost of a torch out-variant from Python vs a numpy ufunc on views of the same memory.

Why ``pyrt/kernels/small_numpy_fastpath.py`` exists: on the tiny tensors of small models the
call, not the arithmetic, is the cost. Each row times one call on the same tensors
(numpy views share the torch tensors' memory), best of ``--repeat`` rounds of
``--number`` calls, threads pinned to 1.

    python benchmarks/bench_call_overhead.py [--number 50000] [--repeat 5] [--no-write]
"""

from __future__ import annotations

import argparse
import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import sys  # noqa: E402
import timeit  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command_line, machine, markdown_table, write_results  # noqa: E402


def cases() -> list[tuple[str, str, str, dict[str, Any]]]:
    """(label, torch statement, numpy statement, namespace) per operation."""
    torch.manual_seed(0)
    a, b, c = torch.randn(1, 16), torch.randn(1, 16), torch.empty(1, 16)
    bias, w, o = torch.randn(64), torch.randn(64, 16).t(), torch.empty(1, 64)
    h, m = torch.randn(1, 8, 64), torch.empty(1, 8, 1)
    x, W, y = torch.randn(8, 64), torch.randn(64, 64), torch.empty(8, 64)
    ns: dict[str, Any] = {"torch": torch, "np": np, "a": a, "b": b, "c": c, "bias": bias, "w": w, "o": o,
                          "h": h, "m": m, "x": x, "W": W, "y": y}
    ns.update({f"{k}n": v.numpy() for k, v in list(ns.items()) if isinstance(v, torch.Tensor)})
    return [
        ("mul (1, 16)", "torch.mul(a, b, out=c)", "np.multiply(an, bn, cn)", ns),
        ("add (1, 16)", "torch.add(a, b, out=c)", "np.add(an, bn, cn)", ns),
        ("tanh (1, 16)", "torch.tanh(a, out=c)", "np.tanh(an, cn)", ns),
        ("sigmoid (1, 16)", "torch.sigmoid(a, out=c)",
         "np.negative(an, cn); np.exp(cn, cn); np.add(cn, 1.0, cn); np.divide(1.0, cn, cn)", ns),
        ("addmm (1, 16) @ (16, 64)", "torch.addmm(bias, a, w, out=o)", "np.dot(an, wn, on); np.add(on, biasn, on)", ns),
        ("mm (8, 64) @ (64, 64)", "torch.mm(x, W, out=y)", "np.dot(xn, Wn, yn)", ns),
        ("mean (1, 8, 64) over -1", "torch.mean(h, [-1], True, out=m)",
         "np.add.reduce(hn, (2,), None, mn, True); np.divide(mn, 64, mn)", ns),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--number", type=int, default=50000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for label, t_stmt, n_stmt, ns in cases():
        t = min(timeit.repeat(t_stmt, globals=ns, number=args.number, repeat=args.repeat)) / args.number
        n = min(timeit.repeat(n_stmt, globals=ns, number=args.number, repeat=args.repeat)) / args.number
        rows.append([label, f"{t * 1e9:,.0f} ns", f"{n * 1e9:,.0f} ns", f"{t / n:.1f}x"])
    text = "\n".join([
        "### One kernel call: torch out= vs numpy ufuncs on the same memory",
        "",
        f"Command: `{command_line()}` (best of {args.repeat} x {args.number} calls; {machine()}, "
        f"torch {torch.__version__}, numpy {np.__version__}, 1 thread). Numpy's sigmoid is four ufuncs "
        "(pyrt leaves sigmoid on torch); addmm is `dot` then the bias added in place.",
        "",
        markdown_table(["operation", "torch out=", "numpy", "torch / numpy"], rows),
    ])
    print(text)
    if not args.no_write:
        write_results("bench_call_overhead", "Kernel calls", text)


if __name__ == "__main__":
    main()
