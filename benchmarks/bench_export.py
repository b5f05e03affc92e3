"""Peak RSS and wall time of exporting a program with two >= 1 GiB engines: pyrt vs ExecuTorch.

Both sides run the same pipeline (``pyrt.export.to_pte`` with ``builder="reference"``,
so the two engines are byte-for-byte the same) and differ only in who serializes:

* ``pyrt``: ``writer="pyrt"``: engines are spilled to files as they are built, the
  delegate blobs reach ExecuTorch as stubs, and pyrt streams the real blobs from disk
  into ExecuTorch's own file layout (``serialize_pte_binary``);
* ``executorch``: ``writer="executorch"``: ``TensorRTBackend.preprocess`` returns each
  whole blob as ``bytes`` (what ExecuTorch's API requires) and
  ``ExecutorchProgramManager.write_to_file`` writes them.

The model's two big weights are ``torch.empty`` tensors that are never written (except a
marker at each end), so they cost no memory until read: the numbers measure the export
machinery, not the model (``--resident-weights`` fills them, adding their size to both).
Every measurement is a fresh subprocess reporting its own ``ru_maxrss`` and, after the
imports, the peak growth (``/proc/self/clear_refs`` = 5 resets the peak). The two output
files are compared by SHA-256.

    .venv/bin/python benchmarks/bench_export.py                  # 2 x 1 GiB, 1 run each, update RESULTS.md
    .venv/bin/python benchmarks/bench_export.py --gib 1.5 --runs 3 --no-write
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

from _common import machine, markdown_table, peak_rss_mib, reset_peak, run_json, write_results

TARGET = 1.2  # pyrt's peak RSS <= 1.2 x the largest single engine


def child(writer: str, out: str, weight_bytes: int, resident: bool) -> None:
    import executorch.exir  # noqa: F401
    import torch
    from torch import nn

    import pyrt.export
    from pyrt.export.api import to_pte  # import everything export needs before the baseline

    class TwoBig(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            for name in ("a", "b"):
                w = torch.ones(weight_bytes // 4) if resident else torch.empty(weight_bytes // 4)
                w[0], w[-1] = 1.5, 2.5
                self.register_parameter(name, nn.Parameter(w, requires_grad=False))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.sigmoid(x + self.a[:4])  # sigmoid is forced to ExecuTorch: two engines
            return y * self.b[-4:]

    model = TwoBig()
    import_peak = peak_rss_mib()
    reset = reset_peak()
    base = peak_rss_mib()
    start = time.perf_counter()
    summary = to_pte(model, out, (torch.zeros(4),), builder="reference", writer=writer,
                     torch_executed_ops=["aten.sigmoid.default"], progress=False)
    wall = time.perf_counter() - start
    peak = peak_rss_mib()
    print(json.dumps({"writer": writer, "wall_s": wall, "peak_mib": max(peak, import_peak),
                      "growth_mib": peak - base if reset else None, "base_mib": base,
                      "engines": [e.size for e in summary.engines], "file_size": summary.file_size}))
    del pyrt


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(16 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def measure(writer: str, out: Path, weight_bytes: int, resident: bool) -> dict:
    cmd = [sys.executable, __file__, "--child", writer, "--out", str(out), "--weight-bytes", str(weight_bytes)]
    if resident:
        cmd.append("--resident-weights")
    return run_json(cmd, f"{writer} run")


def table(rows: list[dict], largest: int) -> str:
    gib = 1 << 30
    head = ["writer", "weights", "wall time", "peak RSS", "peak / largest engine", "RSS growth after imports"]
    body = [[r["writer"], r["weights"], f"{r['wall_s']:.1f} s", f"{r['peak_mib']:,.0f} MiB",
             f"{r['peak_mib'] * (1 << 20) / largest:.2f}x",
             "n/a" if r["growth_mib"] is None else f"{r['growth_mib']:,.0f} MiB"] for r in rows]
    return (markdown_table(head, body)
            + f"\n\nEngines: {', '.join(f'{e / gib:.3f} GiB' for e in rows[0]['engines'])} "
            f"(file {rows[0]['file_size'] / gib:.3f} GiB); for each kind of weights both writers wrote "
            "the same file (SHA-256 compared).")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=1.0, help="weight (and so engine) size per engine, GiB")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--resident-weights", action="store_true", help="also measure with the weights in memory")
    parser.add_argument("--no-write", action="store_true", help="do not update benchmarks/RESULTS.md")
    parser.add_argument("--dir", default=None, help="where to write the .pte files (default: a temp dir)")
    parser.add_argument("--child", choices=("pyrt", "executorch"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--weight-bytes", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.out, args.weight_bytes, args.resident_weights)
        return
    weight_bytes = int(args.gib * (1 << 30)) // 4 * 4
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-export-") as tmp:
        for resident in (False, True) if args.resident_weights else (False,):
            for writer in ("pyrt", "executorch"):
                runs = []
                for _ in range(args.runs):
                    out = Path(tmp) / f"{writer}.pte"
                    runs.append(measure(writer, out, weight_bytes, resident))
                    runs[-1]["sha256"] = sha256(out)
                    out.unlink()
                best = min(runs, key=lambda r: r["wall_s"])
                best["peak_mib"] = max(r["peak_mib"] for r in runs)
                best["weights"] = "resident" if resident else "untouched"
                rows.append(best)
                print(json.dumps(best), flush=True)
    for weights in {r["weights"] for r in rows}:
        if len({r["sha256"] for r in rows if r["weights"] == weights}) != 1:
            raise SystemExit(f"pyrt and ExecuTorch wrote different files ({weights} weights)")
    largest = max(rows[0]["engines"])
    pyrt_rows = [r for r in rows if r["writer"] == "pyrt" and r["weights"] == "untouched"]
    verdict = "met" if all(r["peak_mib"] * (1 << 20) <= TARGET * largest for r in pyrt_rows) else "NOT met"
    flags = [f"--gib {args.gib}" if args.gib != 1.0 else "", f"--runs {args.runs}" if args.runs != 1 else "",
             "--resident-weights" if args.resident_weights else ""]
    cmd = "`" + " ".join(["benchmarks/bench_export.py", *filter(None, flags)]).join((".venv/bin/python ", "")) + "`"
    text = (f"### Export two {args.gib:g} GiB engines to one .pte\n\n"
            f"Command: {cmd} ({machine()}; "
            f"one fresh subprocess per measurement, best wall time of {args.runs}, worst peak). Peak RSS = the "
            "child's `ru_maxrss` (imports and model included); growth = peak after the imports minus RSS then "
            "(peak reset through `/proc/self/clear_refs`). Weights `untouched` are `torch.empty` pages never "
            "written, so the model itself costs no memory and the numbers are the export's own.\n\n"
            + table(rows, largest)
            + f"\n\nTarget for pyrt: peak RSS <= {TARGET}x the largest engine ({TARGET * largest / (1 << 20):,.0f} MiB)"
            f" with untouched weights: {verdict}.\n\n"
            "With `resident` weights the model's own weights are in memory before export starts, for both "
            "writers alike. The reference builder streams each engine to disk; a TensorRT builder does too "
            "(`build_serialized_network_to_stream`: benchmarks/bench_build_memory.py), and one without a stream "
            "writer returns one engine in memory (`IHostMemory`), which pyrt spills and drops before the next build.")
    print(text)
    if not args.no_write:
        write_results("bench_export", "Export", text)


if __name__ == "__main__":
    main()
