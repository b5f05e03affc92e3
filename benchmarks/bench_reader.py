"""Open a .pte and reach every delegate blob: pyrt vs ExecuTorch's Python and C++ loaders.

Files: ExecuTorch writes a small program with two TensorRTBackend delegates
(tests/fixtures/pte.py); its segment table is then rewritten with ExecuTorch's
serializer so each delegate blob is a real TR01/TR02 blob of 1 MB, 100 MB or
~1.1 GB (engine bytes streamed to disk). Files are cached in --cache.

Each measurement runs in a fresh subprocess: imports first, then
``ru_maxrss`` (peak RSS) is read before and after the timed work, with the file
already in the page cache. Work per implementation:

- pyrt: ``PteFile.open(path)`` and every delegate blob's first and last byte;
- ExecuTorch Python: ``deserialize_pte_binary(file bytes)`` and every
  restored blob's first and last byte;
- ExecuTorch C++: ``Runtime.get().load_program(path)`` (its Python API does not
  hand out delegate blobs, so this is program load only: a lower bound).

    .venv/bin/python benchmarks/bench_reader.py                 # all sizes, 5 runs, update RESULTS.md
    .venv/bin/python benchmarks/bench_reader.py --sizes 1MB --runs 3 --no-write
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _common import RESULTS, ROOT, command_line, machine, markdown_table, run_json, write_results

SIZES = {"1MB": 1_000_000, "100MB": 100_000_000, "1.1GB": 1_100_000_000}
IMPLS = ("pyrt", "executorch-python", "executorch-cpp")

# -- the measured work (runs in a child process) ---------------------------------------------------------

CHILD = r"""
import gc, json, sys, time
from benchmarks._common import peak_rss_mib, reset_peak
impl, path = sys.argv[1], sys.argv[2]

if impl == "pyrt":
    from pyrt.pte_reader import PteFile, iter_delegate_blobs
    def work():
        pte = PteFile.open(path)
        touched = 0
        for *_, blob in iter_delegate_blobs(pte):
            touched += blob[0] + blob[-1]
            del blob
        return pte, touched
elif impl == "executorch-python":
    from executorch.exir._serialize._program import deserialize_pte_binary
    def work():
        with open(path, "rb") as fh:
            restored = deserialize_pte_binary(fh.read())
        program = restored.program
        touched = 0
        for plan in program.execution_plan:
            for d in plan.delegates:
                blob = program.backend_delegate_data[d.processed.index].data
                touched += blob[0] + blob[-1]
        return restored, touched
else:
    from executorch.runtime import Runtime
    runtime = Runtime.get()
    def work():
        return runtime.load_program(path), 0

gc.collect()
peak_reset = reset_peak()
before = peak_rss_mib()
t0 = time.perf_counter()
keep, touched = work()
elapsed = time.perf_counter() - t0
after = peak_rss_mib()
print(json.dumps({"seconds": elapsed, "rss_growth_mib": after - before, "touched": touched,
                  "peak_reset": peak_reset}))
"""


def measure(impl: str, path: Path) -> dict:
    return run_json([sys.executable, "-c", CHILD, impl, str(path)], f"{impl} on {path.name}", timeout=900)


# -- files ------------------------------------------------------------------------------------------------


def build_file(cache: Path, label: str, blob_size: int) -> Path:
    """A delegated ExecuTorch program whose two delegate blobs are ``blob_size`` bytes each (cached)."""
    sys.path.insert(0, str(ROOT))
    from pyrt.pte_reader import PteFile
    from tests.fixtures import pte as ptefixtures

    path = cache / f"bench-{label}.pte"
    if path.exists():
        return path
    small = ptefixtures.build("delegated_segments", cache)
    data = small.read_bytes()
    eh, program = ptefixtures.raw_program(data)
    with PteFile.open(small) as pte:
        delegate_segments = {d.index: d.spec("engine_tag").decode() for d in pte.program.method("forward").delegates}
    placements, offset = [], 0
    for i, seg in enumerate(program.segments):
        raw = data[eh.segment_base_offset + seg.offset:][:seg.size]
        if i in delegate_segments:
            engine_size = int.from_bytes(raw[16:24], "little")  # TR01 header: u64 engine_size at 16
            header_len = len(raw) - engine_size
            size, writer = ptefixtures.big_blob_writer(raw, blob_size - header_len, delegate_segments[i])
        else:
            size, writer = len(raw), ptefixtures.bytes_writer(raw)
        placements.append((offset, size, writer))
        offset = (offset + size + 127) // 128 * 128
    return ptefixtures.write_relocated(path, program, placements)


def warm(path: Path) -> None:
    with open(path, "rb") as fh:
        while fh.read(1 << 24):
            pass


# -- report -----------------------------------------------------------------------------------------------


def table(rows: list[dict]) -> str:
    head = ["blob size (x2)", "file size", "implementation", "time median (min-max)", "peak RSS growth",
            "vs C++ load"]
    cpp = {r["label"]: r["median"] for r in rows if r["impl"] == "executorch-cpp"}
    body = []
    for r in rows:
        ratio = r["median"] / cpp[r["label"]] if cpp.get(r["label"]) else float("nan")
        body.append([r["label"], f"{r['file_size'] / 1e6:,.1f} MB", r["impl"],
                     f"{r['median'] * 1e3:,.2f} ms ({r['min'] * 1e3:,.2f}-{r['max'] * 1e3:,.2f})",
                     f"{r['rss_mib']:,.1f} MiB", f"{ratio:.2f}x"])
    return markdown_table(head, body)


def verdict(rows: list[dict]) -> str:
    ours = [r for r in rows if r["impl"] == "pyrt"]
    cpp = {r["label"]: r["median"] for r in rows if r["impl"] == "executorch-cpp"}
    if not ours:
        return ""
    ratios = [r["median"] / cpp[r["label"]] for r in ours if r["label"] in cpp]
    rss = max(r["rss_mib"] for r in ours)
    times = [r["median"] * 1e3 for r in ours]
    parts = [f"pyrt median {min(times):.2f}-{max(times):.2f} ms across blob sizes",
             f"peak RSS growth <= {rss:.1f} MiB ({'met' if rss * 1.048576 <= 50 else 'NOT met'})"]
    if ratios:
        parts.insert(1, f"{min(ratios):.2f}-{max(ratios):.2f}x the C++ load "
                        f"({'met' if max(ratios) <= 2 else 'NOT met'} for every size)")
    return "Result: " + "; ".join(parts) + "."


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS))
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "pyrt-bench-reader")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)

    rows = []
    for label in args.sizes:
        t0 = time.perf_counter()
        path = build_file(args.cache, label, SIZES[label])
        print(f"{path} ({path.stat().st_size:,} bytes, ready in {time.perf_counter() - t0:.1f}s)", flush=True)
        warm(path)
        for impl in args.impls:
            runs = [measure(impl, path) for _ in range(args.runs)]
            secs = [r["seconds"] for r in runs]
            rows.append({"label": label, "file_size": path.stat().st_size, "impl": impl,
                         "median": statistics.median(secs), "min": min(secs), "max": max(secs),
                         "rss_mib": statistics.median(r["rss_growth_mib"] for r in runs)})
            print(f"  {impl:18s} {rows[-1]['median'] * 1e3:10.2f} ms  {rows[-1]['rss_mib']:8.1f} MiB", flush=True)

    text = "\n".join([
        "### Open a .pte and reach every delegate blob (first + last byte)",
        "",
        f"Command: `{command_line()}` ({args.runs} runs per cell, one fresh subprocess each; {machine()}; "
        f"file in page cache). Peak RSS growth = `ru_maxrss` after - before the timed work; imports happen first "
        "and the peak is then reset (`/proc/self/clear_refs` = 5) so it starts at the current RSS. "
        "ExecuTorch C++ = `Runtime.get().load_program(path)` only (its Python API exposes no delegate blobs).",
        "",
        table(rows),
        "",
        "Targets for pyrt: time <= 2x the C++ loader, RSS growth <= 50 MB, flat in blob size.",
        verdict(rows),
    ])
    print("\n" + text)
    if not args.no_write:
        write_results("bench_reader", "Reader", text)
        print(f"\nwrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
