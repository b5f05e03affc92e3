"""What the profiling seam costs: per-call time with profiling off, before and after the seam, and on.

Two small programs are exported once with ExecuTorch 1.5.1 (``one_op``: x + 1
on a 4x4 float32; ``elementwise``: add, mul, relu, sub, sigmoid). Each is run
with pyrt's numpy kernels, numpy in and out, in three ways, each in its own
child process, the processes taking turns round by round so that drift on a
shared machine hits them alike:

- ``base``: pyrt as of ``--base`` (default: main before the seam), from ``git archive``;
- ``off``: this checkout, no profiler (the seam's only cost: one ``observer is None`` check and
  one extra call frame per run; the instruction loop is the same code);
- ``on``: this checkout inside ``Program.profile()`` (host timing of every instruction).

Python function calls per run are counted exactly (``sys.setprofile``), and a last figure
isolates the seam in one process: ``MethodRunner.__call__`` (with the check) against
``MethodRunner._call`` (without it), best of alternating samples.

    .venv/bin/python benchmarks/bench_profile.py                   # update RESULTS.md
    .venv/bin/python benchmarks/bench_profile.py --rounds 3 --no-write
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from _common import ROOT, command_line, machine, markdown_table, run_json, write_results

BASE_REF = "67e8f96"  # main before the observer seam
CHILD = r"""
import json, sys, time
import numpy as np
import pyrt
path, mode, number, samples = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
x = np.ones((4, 4), np.float32)


def per_call(fn):
    t0 = time.perf_counter_ns()
    for _ in range(number):
        fn()
    return (time.perf_counter_ns() - t0) / number / 1000


with pyrt.Program(path, kernels="numpy") as prog:
    ctx = prog.profile() if mode == "on" else None
    if ctx is not None:
        ctx.start()
    run = lambda: prog(x)
    for _ in range(500):
        run()
    out = []
    for _ in range(samples):
        out.append(per_call(run))
        if ctx is not None:  # keep the recorded spans from growing without bound
            ctx.spans.clear(); ctx.runs.clear()
    calls = [0]

    def count(frame, event, arg):
        if event == "call":
            calls[0] += 1

    sys.setprofile(count)
    for _ in range(10):
        run()
    sys.setprofile(None)
    seam = None
    if mode == "off":
        runner = prog._runners["forward"]
        fns = {"with": lambda: runner((x,)), "without": lambda: runner._call((x,), None)}
        seam = {k: [] for k in fns}
        for i in range(samples):
            for k in (("with", "without") if i % 2 == 0 else ("without", "with")):  # alternate the order
                seam[k].append(per_call(fns[k]))
print(json.dumps({"us": out, "seam": seam, "calls": calls[0] / 10, "pyrt": pyrt.__file__}))
"""


def export(directory: Path) -> dict[str, Path]:
    import torch
    from executorch.exir import to_edge
    from torch.export import export as torch_export

    class OneOp(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1

    class Elementwise(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.sigmoid(torch.relu((x + x) * x) - x)

    paths = {}
    for name, model in (("one_op", OneOp()), ("elementwise", Elementwise())):
        program = to_edge(torch_export(model, (torch.ones(4, 4),))).to_executorch()
        paths[name] = directory / f"{name}.pte"
        paths[name].write_bytes(program.buffer)
    return paths


def checkout(ref: str, directory: Path) -> Path:
    """``pyrt/`` as of ``ref`` under ``directory`` (git archive)."""
    archive = directory / "base.tar"
    with open(archive, "wb") as fh:
        subprocess.run(["git", "-C", str(ROOT), "archive", ref, "pyrt"], stdout=fh, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(directory / "base", filter="data")
    return directory / "base"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default=BASE_REF, help="git ref without the seam")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--samples", type=int, default=40, help="samples per process")
    ap.add_argument("--number", type=int, default=250, help="calls per sample")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        programs = export(tmp_path)
        roots = {"base": checkout(args.base, tmp_path), "off": ROOT, "on": ROOT}
        results: dict[str, dict[str, list[float]]] = {name: {m: [] for m in roots} for name in programs}
        frames: dict[str, dict[str, float]] = {name: {} for name in programs}
        seam: dict[str, dict[str, list[float]]] = {name: {"with": [], "without": []} for name in programs}
        for _ in range(args.rounds):
            for name, path in programs.items():
                for mode, root in roots.items():
                    cmd = [sys.executable, "-P", "-c", CHILD, str(path), mode, str(args.number), str(args.samples)]
                    env_cmd = ["env", f"PYTHONPATH={root}", *cmd]
                    data = run_json(env_cmd, f"{name} {mode}")
                    assert data["pyrt"].startswith(str(root)), data["pyrt"]
                    results[name][mode] += data["us"]
                    frames[name][mode] = data["calls"]
                    if data["seam"]:
                        for k, v in data["seam"].items():
                            seam[name][k] += v
    head = ["program", "Python calls/run: base, off, on", "base µs/call", "off µs/call", "on µs/call",
            "seam: __call__ - _call, one process"]
    body = []
    for name in programs:
        best = {m: min(v) for m, v in results[name].items()}
        med = {m: statistics.median(v) for m, v in results[name].items()}
        w, wo = min(seam[name]["with"]), min(seam[name]["without"])
        f = frames[name]
        body.append([name, f"{f['base']:g}, {f['off']:g}, {f['on']:g}",
                     *(f"{best[m]:.2f} ({med[m]:.2f})" for m in ("base", "off", "on")),
                     f"{(w - wo) * 1000:+.0f} ns ({(w / wo - 1) * 100:+.1f}%)"])
    table = markdown_table(head, body)
    text = (f"### Profiling off and on: time per `Program.__call__` (numpy kernels, 4x4 float32)\n\n"
            f"`{command_line()}` ({machine()}; base = `{args.base}`; {args.rounds} rounds x {args.samples} "
            f"samples x {args.number} calls; times: best sample, median in brackets; load average "
            f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after)\n\n{table}\n\n"
            "Python calls per run are counted with `sys.setprofile` (deterministic): profiling off adds one "
            "frame per run (`MethodRunner._call`) and none per instruction. Times across processes carry the "
            "machine's noise (a shared, loaded 2-core machine here); the last column isolates the seam in one "
            "process (best of alternating samples): one `observer is None` check and one call per run.")
    print(text)
    if not args.no_write:
        write_results("bench_profile", "Profiling", text)


if __name__ == "__main__":
    main()
