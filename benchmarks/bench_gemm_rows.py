"""What a matrix product costs per row as the rows grow: the ceiling of batched decoding on this CPU.

A decode step of B sequences multiplies B rows by every weight matrix. Where one row's product is
bound by reading the weights, B rows cost about one row's time and batching is nearly free; where
the product is bound by arithmetic (or by packing the weights for each call), B rows cost more.
This times ``addmm`` for the linear layers of the small GPT-2 and Llama configs of
``benchmarks/bench_llm.py --batch`` (hidden 256) at 1, 8 and 16 rows, with the weights cold as in a
model's forward (``--copies`` distinct weight sets, more bytes than the last-level cache, cycled),
through torch (the BLAS pyrt's torch kernels and transformers both call) and numpy's BLAS.

    python benchmarks/bench_gemm_rows.py [--copies 48] [--no-write]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import functools  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _common import command_line, machine, markdown_table, write_results  # noqa: E402

SHAPES = {"gpt2 c_attn": (256, 768), "gpt2 c_fc": (256, 1024), "gpt2 mlp c_proj": (1024, 256),
          "llama mlp up": (256, 512), "lm head": (256, 2048)}
ROWS = (1, 8, 16)


def per_call_us(calls: list[Callable[[], object]], repeats: int = 20) -> float:
    """Microseconds per call, cycling through ``calls`` (one per weight copy), best of 3 rounds."""
    for call in calls:
        call()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(repeats):
            for call in calls:
                call()
        best = min(best, (time.perf_counter() - start) / (repeats * len(calls)) * 1e6)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=48, help="distinct weight sets cycled (default 48)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave benchmarks/RESULTS.md alone")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    rng = np.random.default_rng(0)
    rows = []
    for name, (k, n) in SHAPES.items():
        weights = [torch.from_numpy(rng.standard_normal((k, n), dtype=np.float32)) for _ in range(args.copies)]
        bias = torch.zeros(n)
        cells = []
        for library in ("torch", "numpy"):
            times = {}
            for m in ROWS:
                x, out = torch.randn(m, k), torch.empty(m, n)
                if library == "torch":
                    calls = [functools.partial(torch.addmm, bias, x, w, out=out) for w in weights]
                else:
                    calls = [functools.partial(np.matmul, x.numpy(), w.numpy(), out=out.numpy()) for w in weights]
                times[m] = per_call_us(calls)
            cells += [f"{times[1]:.0f}", f"{times[8]:.0f} ({times[8] / times[1]:.1f}x)",
                      f"{times[16]:.0f} ({times[16] / times[1]:.1f}x)"]
        rows.append([name, f"{k}x{n}", *cells])
        print(rows[-1], flush=True)
    head = ["layer", "K x N", "torch 1 row (us)", "torch 8 rows", "torch 16 rows", "numpy 1 row (us)", "numpy 8 rows",
            "numpy 16 rows"]
    text = "\n".join([
        f"`{command_line()}` ({machine()}; torch {torch.__version__}, numpy {np.__version__}; threads 1)", "",
        f"`addmm` (torch) / `matmul` (numpy) per call with the weights cold ({args.copies} copies cycled), best of "
        "3 rounds; in brackets the cost against one row:", "", markdown_table(head, rows)])
    print(text)
    if not args.no_write:
        write_results("bench_gemm_rows", "Matrix products by row count", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
