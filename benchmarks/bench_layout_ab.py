"""Two source trees of pyrt, A/B on the same files: load and run time, and bitwise-equal outputs.

Issue #19 asks that the layout change nothing: outputs bitwise equal, no slowdown beyond noise.
This compares two checkouts (e.g. the pre-split ``58ac7c4`` and main) on the real architectures
of ``benchmarks/bench_models.py``, each tree in its own fresh processes, rounds interleaved
(A, B, A, B, ...), threads pinned to 1. It needs only ``pyrt.Program`` in each tree (and torch
for the torch kernels), so it runs on a machine without ExecuTorch (a GPU machine, say) once
the files are made::

    python benchmarks/bench_layout_ab.py prepare DIR            # here: .pte files + inputs (.npz)
    python benchmarks/bench_layout_ab.py run DIR --tree before=/path/a --tree after=. --rounds 4

It prints, per model and kernel set, the median load and run time of each tree, the ratio
B/A, and whether every output of every tree hashes the same (sha256 of the bytes). Causal LMs
(``*.llm.pte``: a one-sequence file and a 4-slot file per family) are run through ``pyrt.generate``
instead: four prompts at once, greedy and seeded sampling; their row's hash is of the tokens, and
its run time that of the greedy call.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PINNED = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

# Runs inside a child process whose sys.path starts with one tree: only pyrt.Program is used.
CHILD = r'''
import hashlib, json, statistics, sys, time
from pathlib import Path
import numpy as np
import pyrt
folder, samples, kernel_sets = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(",")
torch = None
if "torch" in kernel_sets:
    import torch
    torch.set_num_threads(1)
out = {"pyrt": pyrt.__file__, "models": {}}
PROMPTS = [[5, 6, 7, 8, 9], [11, 12], list(range(20, 40)), [3]]
for pte in sorted(folder.glob("*.llm.pte")):  # generation: greedy and seeded sampling, several prompts at once
    for kernels in kernel_sets:
        t0 = time.perf_counter()
        prog = pyrt.Program(str(pte), kernels=kernels)
        load = time.perf_counter() - t0
        runs, tokens = [], []
        for _ in range(max(1, samples // 3)):
            t0 = time.perf_counter()
            greedy = pyrt.generate(prog, PROMPTS, max_new_tokens=16, eos_ids=[])
            runs.append(time.perf_counter() - t0)
        sampled = pyrt.generate(prog, PROMPTS, max_new_tokens=16, do_sample=True, temperature=1.3, top_k=20,
                                top_p=0.9, seed=[1, 2, 3, 4], eos_ids=[])
        tokens = [r.tokens for r in greedy + sampled]
        digest = hashlib.sha256(json.dumps(tokens).encode()).hexdigest()
        prog.close()
        key = f"{pte.name[:-len('.llm.pte')]}-generate/{kernels}"
        out["models"][key] = {"load": load, "run": statistics.median(runs), "sha256": digest}
for pte in sorted(p for p in folder.glob("*.pte") if not p.name.endswith(".llm.pte")):
    arrays = np.load(pte.with_suffix(".npz"))
    inputs = [arrays[f"arg{i}"] for i in range(len(arrays.files))]
    for kernels in kernel_sets:
        args = [torch.from_numpy(x) for x in inputs] if kernels == "torch" else inputs
        loads, runs = [], []
        for _ in range(samples):
            t0 = time.perf_counter()
            prog = pyrt.Program(str(pte), kernels=kernels)
            loads.append(time.perf_counter() - t0)
            prog.close()
        prog = pyrt.Program(str(pte), kernels=kernels)
        result = prog(*args)
        for _ in range(samples):
            t0 = time.perf_counter()
            for _ in range(5):
                prog(*args)
            runs.append((time.perf_counter() - t0) / 5)
        flat = result if isinstance(result, (list, tuple)) else [result]
        digest = hashlib.sha256()
        for r in flat:
            a = r.numpy() if hasattr(r, "numpy") and not isinstance(r, np.ndarray) else np.asarray(r)
            digest.update(np.ascontiguousarray(a).tobytes())
        prog.close()
        out["models"][f"{pte.stem}/{kernels}"] = {"load": statistics.median(loads), "run": statistics.median(runs),
                                                 "sha256": digest.hexdigest()}
print("RESULT " + json.dumps(out))
'''


LLMS = ("llama", "gpt2", "qwen2")  # generation files: a one-sequence file and a 4-slot file of each


def prepare(folder: Path, models: list[str] | None, llms: list[str] | None) -> None:
    import numpy as np

    sys.path.insert(0, str(ROOT))
    from pyrt.export import decoder_to_pte
    from pyrt.testing.archs import RUNTIME, causal_lm, export_pte

    folder.mkdir(parents=True, exist_ok=True)
    for name in models or list(RUNTIME):
        inputs = export_pte(name, folder / f"{name}.pte")
        np.savez(folder / f"{name}.npz", **{f"arg{i}": x.numpy() for i, x in enumerate(inputs)})
        print("wrote", folder / f"{name}.pte", flush=True)
    for name in LLMS if llms is None else llms:
        for tag, options in (("", {}), ("-slots", {"max_batch_size": 4, "max_tokens_per_step": 16})):
            path = folder / f"{name}{tag}.llm.pte"
            decoder_to_pte(causal_lm(name), path, max_seq_len=48, builder="portable", progress=False, **options)
            print("wrote", path, flush=True)


def measure(tree: Path, folder: Path, samples: int, kernels: str) -> dict:
    env = {**os.environ, **PINNED, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, "-c", CHILD, str(folder.resolve()), str(samples), kernels]
    proc = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, timeout=1800)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise SystemExit(f"{tree}: rc {proc.returncode}\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def run(folder: Path, trees: dict[str, Path], rounds: int, samples: int, kernels: str) -> None:
    got: dict[str, list[dict]] = {name: [] for name in trees}
    for r in range(rounds):
        for name, tree in trees.items():
            got[name].append(measure(tree, folder, samples, kernels))
            print(f"round {r + 1}: {name} done ({got[name][-1]['pyrt']})", file=sys.stderr, flush=True)
    names = list(trees)
    keys = sorted(got[names[0]][0]["models"])
    head = ["model/kernels"] + [f"{n} load ms" for n in names] + [f"{n} run ms" for n in names]
    head += [f"load {names[-1]}/{names[0]}", f"run {names[-1]}/{names[0]}", "outputs bitwise equal"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for key in keys:
        load = {n: statistics.median(g["models"][key]["load"] for g in got[n]) for n in names}
        runt = {n: statistics.median(g["models"][key]["run"] for g in got[n]) for n in names}
        digests = {g["models"][key]["sha256"] for n in names for g in got[n]}
        cells = [key] + [f"{load[n] * 1e3:.2f}" for n in names] + [f"{runt[n] * 1e3:.3f}" for n in names]
        cells += [f"{load[names[-1]] / load[names[0]]:.2f}x", f"{runt[names[-1]] / runt[names[0]]:.2f}x",
                  "yes" if len(digests) == 1 else f"NO ({len(digests)} digests)"]
        print("| " + " | ".join(cells) + " |")
    print(f"\n{rounds} rounds x {samples} samples per tree, medians of the per-round medians; "
          f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, threads pinned to 1.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="export the models and save their inputs")
    p.add_argument("dir", type=Path)
    p.add_argument("--models", help="comma-separated names (default: all of pyrt.testing.archs.RUNTIME)")
    p.add_argument("--llms", help=f"comma-separated causal LMs to generate with (default: {','.join(LLMS)}; '': none)")
    r = sub.add_parser("run", help="measure the trees, interleaved")
    r.add_argument("dir", type=Path)
    r.add_argument("--tree", action="append", required=True, metavar="NAME=PATH", help="first is the baseline")
    r.add_argument("--rounds", type=int, default=4)
    r.add_argument("--samples", type=int, default=9)
    r.add_argument("--kernels", default="numpy,torch")
    args = parser.parse_args(argv)
    if args.cmd == "prepare":
        prepare(args.dir, args.models.split(",") if args.models else None,
                None if args.llms is None else [n for n in args.llms.split(",") if n])
    else:
        trees = {t.split("=", 1)[0]: Path(t.split("=", 1)[1]).resolve() for t in args.tree}
        run(args.dir, trees, args.rounds, args.samples, args.kernels)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
