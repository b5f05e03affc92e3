"""What the benchmark scripts share: peak RSS, child processes, Markdown tables, RESULTS.md.

The scripts run as ``python benchmarks/bench_x.py``, which puts this folder on
``sys.path``: they ``import _common``. A child started with ``python -c`` in the
repository root imports ``benchmarks._common``.

>>> markdown_table(["a", "bb"], [["1", "2"]]).splitlines()[1]
'|---|----|'
"""

from __future__ import annotations

import json
import os
import platform
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "RESULTS.md"


def peak_rss_mib() -> float:
    """This process's peak RSS so far (``ru_maxrss``, KiB on Linux) in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_peak() -> bool:
    """Reset the peak RSS (and so ``ru_maxrss``) to the current RSS; False where that is not possible.

    Linux: writing 5 to ``/proc/self/clear_refs`` does it, so an import-time spike
    (torch) does not hide the measured work's own peak.
    """
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def rss_mib() -> float:
    """This process's RSS now (``VmRSS``) in MiB; 0.0 where /proc is missing."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def stream_build(trt: Any, builder: Any, network: Any, config: Any, out: str) -> dict:
    """Build ``network`` into file ``out`` through an ``IStreamWriter`` (TensorRT-RTX never holds the engine
    whole): the engine's bytes, the build's wall time, RSS before it and its peak (reset before the build)."""
    with open(out, "wb") as f:

        class Writer(trt.IStreamWriter):
            def __init__(self) -> None:
                super().__init__()
                self.size = 0

            def write(self, data: bytes) -> int:
                f.write(data)
                self.size += len(data)
                return len(data)

        writer = Writer()
        base, reset = rss_mib(), reset_peak()
        start = time.perf_counter()
        if not builder.build_serialized_network_to_stream(network, config, writer):
            raise SystemExit("TensorRT-RTX failed to build the floor network")
        wall = time.perf_counter() - start
    return {"engine": writer.size, "file_size": writer.size, "wall_s": wall, "peak_mib": peak_rss_mib(),
            "base_mib": base, "reset": reset}


def run_json(cmd: list[str], what: str, *, timeout: float | None = None) -> dict:
    """Run ``cmd`` in the repository root; its last line of output is a JSON object, returned."""
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def markdown_table(head: list[str], body: list[list[str]]) -> str:
    """A Markdown table with its columns padded to their widest cell."""
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body, strict=True)]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"  # noqa: E731
    return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, body)])


def command_line() -> str:
    """How this script was started, relative to the repository root."""
    exe = Path(sys.executable)
    exe_text = os.path.relpath(exe, ROOT) if exe.is_relative_to(ROOT) else "python"
    return " ".join([exe_text, os.path.relpath(Path(sys.argv[0]).resolve(), ROOT), *sys.argv[1:]])


def machine() -> str:
    """Architecture, CPU count and Python version."""
    return f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def write_results(bench: str, heading: str, text: str) -> None:
    """Put ``text`` between ``bench``'s markers in RESULTS.md.

    The old block is replaced; without one, the block goes first under ``## heading``,
    or into a new ``## heading`` section at the end.
    """
    begin, end = f"<!-- {bench}:begin -->", f"<!-- {bench}:end -->"
    block = f"{begin}\n{text}\n{end}"
    current = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    if begin in current and end in current:
        current = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: block, current, flags=re.S)
    elif f"## {heading}\n" in current:
        current = current.replace(f"## {heading}\n", f"## {heading}\n\n{block}\n", 1)
    else:
        current = current.rstrip("\n") + f"\n\n## {heading}\n\n{block}\n"
    RESULTS.write_text(current)
