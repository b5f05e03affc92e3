"""``pyrt generate``'s start-up: a fresh process per sample, this tree against an earlier revision, beside the API.

A one-prompt ``pyrt generate`` is nearly all start-up (interpreter, imports, load), so each sample
times one whole fresh process, from just before it starts to its exit, and reads its CPU time
(user + sys, ``os.wait4``). The same command runs on:

* before: the ``pyrt`` package of ``--before REV`` (``git archive``, default 4500336: main before
  issue 46's start-up cut);
* after: this working tree's ``pyrt``;
* api: this tree, the same work through the Python API in ``python -c`` (the tokenizer as
  ``pyrt generate`` loads it, ``pyrt.Program``, ``pyrt.generate``): the floor the command line
  could reach, what no command-line change can cut.

Each in two bytecode states: cached (``PYTHONPYCACHEPREFIX`` in a temporary folder, filled by a
warm-up run: an installed package) and none (``PYTHONDONTWRITEBYTECODE=1`` and an empty prefix:
every module compiled, as in this machine's default environment). Variants run in turn, sample by
sample (interleaved). The file: the tiny random-init Llama of ``pyrt/testing/archs.py`` exported
with ``builder="portable"`` (no engines: it runs on a CPU), run with ``--kernels numpy``, and a
word-level transformers tokenizer (``tests/fixtures/llm_models.word_tokenizer``); 8 new tokens.
Threads: OMP/OpenBLAS/MKL = 1 in every child. Each child's printed text must agree.

    python benchmarks/bench_generate_startup.py [--samples 7] [--before 4500336] [--no-write]
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

from _common import ROOT, command_line, machine, markdown_table, write_results  # noqa: E402

sys.path.insert(0, str(ROOT))

PROMPT = "w5 w6 w7 w8 w9"
NEW_TOKENS = 8
API = """
import sys
import pyrt
from pyrt.serve.text import load_tokenizer
path, tok_dir, prompt, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
tok = load_tokenizer(tok_dir)
with pyrt.Program(path, kernels="numpy") as prog:
    result = pyrt.generate(prog, list(tok(prompt)["input_ids"]), max_new_tokens=n, eos_ids=[])
print(tok.decode(result.tokens, skip_special_tokens=True))
"""


def _files(folder: Path) -> tuple[Path, Path]:
    from pyrt.export import decoder_to_pte
    from pyrt.testing import archs
    from tests.fixtures.llm_models import word_tokenizer

    pte = folder / "llama-portable.pte"
    decoder_to_pte(archs.causal_lm("llama"), pte, max_seq_len=48, builder="portable", progress=False)
    return pte, word_tokenizer(folder / "tok")


def _before_tree(rev: str, folder: Path) -> Path:
    tree = folder / f"before-{rev}"
    tree.mkdir()
    archive = subprocess.run(["git", "archive", rev, "pyrt"], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


class Child:
    """One variant: its command, environment and timings."""

    def __init__(self, name: str, tree: Path, argv: list[str], cache: Path | None) -> None:
        self.name, self.argv = name, argv
        self.walls: list[float] = []
        self.cpus: list[float] = []
        env = {k: v for k, v in os.environ.items() if k not in ("PYRT_SIMULATED_GPUS", "PYTHONDONTWRITEBYTECODE")}
        env["PYTHONPATH"] = str(tree)
        env["PYTHONPYCACHEPREFIX"] = str(cache)
        if name.endswith("no pyc"):
            env["PYTHONDONTWRITEBYTECODE"] = "1"
        self.env = env

    def sample(self, cwd: Path) -> str:
        proc = subprocess.Popen(self.argv, env=self.env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        start = time.perf_counter()
        out, err = proc.communicate()
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"{self.name} failed ({proc.returncode}):\n{err[-3000:]}")
        self.walls.append(wall)
        self.cpus.append(_child_cpu())
        return out.strip().splitlines()[0] if out.strip() else ""


_CPU = [0.0]


def _child_cpu() -> float:
    """CPU seconds (user + sys) of the children reaped since the last call."""
    times = os.times()
    total = times.children_user + times.children_system
    spent, _CPU[0] = total - _CPU[0], total
    return spent


def _imports(child: Child, cwd: Path) -> int:
    """How many pyrt modules one run of ``child`` imports (``-X importtime``)."""
    argv = [child.argv[0], "-X", "importtime", *child.argv[1:]]
    proc = subprocess.run(argv, env=child.env, cwd=cwd, capture_output=True, text=True, check=True)
    names = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    return sum(1 for n in names if n == "pyrt" or n.startswith("pyrt."))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=7)
    ap.add_argument("--before", default="4500336", help="the revision to compare with (default 4500336)")
    ap.add_argument("--no-write", action="store_true", help="print the results only (RESULTS.md untouched)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="pyrt-genstart-") as tmp:
        folder = Path(tmp)
        pte, tok = _files(folder)
        before = _before_tree(args.before, folder)
        cli = [sys.executable, "-m", "pyrt", "generate", str(pte), "--kernels", "numpy", "--tokenizer", str(tok),
               "--prompt", PROMPT, "--max-new-tokens", str(NEW_TOKENS), "--eos-ids", ""]
        api = [sys.executable, "-c", API, str(pte), str(tok), PROMPT, str(NEW_TOKENS)]
        children = []
        for state in ("pyc", "no pyc"):
            for name, tree, argv in (("before", before, cli), ("after", ROOT, cli), ("api", ROOT, api)):
                cache = folder / f"cache-{name}-{state.replace(' ', '')}"
                cache.mkdir()
                children.append(Child(f"{name}, {state}", tree, argv, cache))
        load = os.getloadavg()[0]
        texts = {c.name: c.sample(folder) for c in children}  # warm-up: fills the bytecode caches (pyc)
        _child_cpu()
        for _ in range(args.samples):
            for child in children:
                texts[child.name] = child.sample(folder)
        counts = {c.name: _imports(c, folder) for c in children}
        load_end = os.getloadavg()[0]
    if len(set(texts.values())) != 1:
        raise SystemExit(f"the children printed different text: {texts}")
    text = _report(children, counts, args, load, load_end, next(iter(texts.values())))
    print(text)
    if not args.no_write:
        write_results("bench_generate_startup", "pyrt generate start-up", text)


def _report(children: list[Child], counts: dict[str, int], args: argparse.Namespace, load: float,
            load_end: float, text: str) -> str:
    by = {c.name: c for c in children}
    rows = []
    for c in children:
        state = c.name.split(", ")[1]
        base = by[f"before, {state}"]
        wall, cpu = statistics.median(c.walls), statistics.median(c.cpus)
        rows.append([c.name, f"{wall:.3f} s [{min(c.walls):.3f}-{max(c.walls):.3f}]", f"{cpu:.3f} s",
                     f"{wall / statistics.median(base.walls):.3f}x [{cpu / statistics.median(base.cpus):.3f}x]",
                     str(counts[c.name])])
    table = markdown_table(["variant", "wall (median [min-max])", "CPU (median)", "/ before (wall [CPU])",
                            "pyrt modules imported"], rows)
    text_line = (f"Command: `{command_line()}` ({machine()}; OMP/OpenBLAS/MKL threads 1 in every child; "
                 f"{args.samples} samples per variant after one warm-up each, variants in turn; load average (1 min) "
                 f"{load:.2f} at the start, {load_end:.2f} at the end). before = the `pyrt` of {args.before}, after "
                 f"= this tree, api = this tree through the Python API (`load_tokenizer`, `Program`, `pyrt.generate`"
                 f" in `python -c`); pyc = bytecode cached, no pyc = every module compiled. Every child printed "
                 f"{text!r}.")
    return f"{text_line}\n\n{table}"


if __name__ == "__main__":
    main()
