"""Long fuzz run of pyrt's .pte and .ptd readers and TR01 parser (not part of pytest).

Coverage-guided with atheris (libFuzzer) when it is installed, otherwise a
hypothesis-based mutation loop. Seeds are real files written by ExecuTorch
(tests/fixtures/pte.py), generated in a subprocess so the fuzzing process never
imports torch. Any exception that is not a PyrtError is a crash; libFuzzer also
flags hangs (-timeout) and memory blow-ups (-rss_limit_mb).

    .venv/bin/python tests/format/fuzz_reader.py --seconds 180               # .pte reader
    .venv/bin/python tests/format/fuzz_reader.py --seconds 60 --target blob  # TR01/TR02 parser
    .venv/bin/python tests/format/fuzz_reader.py --seconds 60 --target ptd   # .ptd (FlatTensor) reader
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SEED_SCRIPT = """
import sys
from pathlib import Path
from tests.fixtures import pte as ptefixtures
from pyrt.pte_reader import PteFile, iter_delegate_blobs
out = Path(sys.argv[1])
for name in ptefixtures.ALL:
    path = ptefixtures.build(name, out / "files")
    (out / "pte" / f"{name}.pte").write_bytes(path.read_bytes())
    with PteFile.open(path) as pte:
        for plan, i, d, blob in iter_delegate_blobs(pte):
            if d.id == "TensorRTBackend":
                (out / "blob" / f"{name}-{plan.name}-{i}.bin").write_bytes(bytes(blob))
    if path.with_suffix(".ptd").exists():
        (out / "ptd" / f"{name}.ptd").write_bytes(path.with_suffix(".ptd").read_bytes())
"""


def make_seeds(directory: Path) -> None:
    for sub in ("files", "pte", "blob", "ptd"):
        (directory / sub).mkdir(parents=True, exist_ok=True)
    if any((directory / "pte").iterdir()) and any((directory / "ptd").iterdir()):
        return
    subprocess.run([sys.executable, "-c", SEED_SCRIPT, str(directory)], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _targets():
    from pyrt.errors import PyrtError
    from pyrt.format.ptd_reader import PtdFile
    from pyrt.format.trt_blob import parse_blob
    from pyrt.pte_reader import PteFile
    from pyrt.tools.report import describe_ptd
    from tests.fixtures.pte import walk

    def pte_target(data: bytes) -> None:
        try:
            with PteFile.open(data) as pte:
                walk(pte)
        except PyrtError:
            pass

    def blob_target(data: bytes) -> None:
        try:
            blob = parse_blob(data)
            blob.inputs, blob.outputs, bytes(blob.engine[:1])
        except PyrtError:
            pass

    def ptd_target(data: bytes) -> None:
        try:
            with PtdFile.open(data) as ptd:
                for key in ptd.keys():
                    bytes(ptd.view(key)[:1])
                describe_ptd(ptd)
        except PyrtError:
            pass

    return {"pte": pte_target, "blob": blob_target, "ptd": ptd_target}


def run_atheris(target: str, corpus: Path, seconds: int, extra: list[str]) -> int:
    import atheris

    with atheris.instrument_imports(include=["pyrt"]):
        import pyrt.format.ptd_reader  # noqa: F401
        import pyrt.format.trt_blob  # noqa: F401
        import pyrt.pte_reader  # noqa: F401
        import pyrt.tools.report  # noqa: F401
    fn = _targets()[target]
    work = Path(tempfile.mkdtemp(prefix=f"pyrt-fuzz-{target}-"))
    argv = [sys.argv[0], str(work), str(corpus), f"-max_total_time={seconds}", "-timeout=10",
            "-rss_limit_mb=2048", "-max_len=16384", "-print_final_stats=1", *extra]
    atheris.Setup(argv, fn)
    atheris.Fuzz()  # exits the process; libFuzzer prints the run count and any crash
    return 0


def run_hypothesis(target: str, corpus: Path, seconds: int) -> int:
    import random
    import time

    fn = _targets()[target]
    seeds = [p.read_bytes() for p in sorted(corpus.iterdir())]
    rng = random.Random(0)
    deadline, cases = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 8)):
            pos = rng.randrange(len(data))
            choice = rng.random()
            if choice < 0.5:
                data[pos] = rng.randrange(256)
            elif choice < 0.8 and pos + 4 <= len(data):
                data[pos:pos + 4] = rng.choice([0xFFFFFFFF, 0x80000000, len(data), 0]).to_bytes(4, "little")
            else:
                del data[pos:]
                data = data or bytearray(b"\x00")
        fn(bytes(data))  # a non-PyrtError propagates: that is the crash report
        cases += 1
    print(f"random-mutation fuzz: {cases} cases, 0 crashes")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=180)
    parser.add_argument("--target", choices=("pte", "blob", "ptd"), default="pte")
    parser.add_argument("--seeds", type=Path, default=Path(tempfile.gettempdir()) / "pyrt-fuzz-seeds")
    parser.add_argument("--engine", choices=("auto", "atheris", "random"), default="auto")
    args, extra = parser.parse_known_args()
    make_seeds(args.seeds)
    corpus = args.seeds / args.target
    engine = args.engine
    if engine == "auto":
        try:
            import atheris  # noqa: F401
            engine = "atheris"
        except ImportError:
            engine = "random"
    print(f"fuzzing {args.target} with {engine} for {args.seconds}s from {corpus} "
          f"({len(os.listdir(corpus))} seeds)", flush=True)
    if engine == "atheris":
        return run_atheris(args.target, corpus, args.seconds, extra)
    return run_hypothesis(args.target, corpus, args.seconds)


if __name__ == "__main__":
    sys.exit(main())
