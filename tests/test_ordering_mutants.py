"""Mutation test: every ordering, synchronisation and keep-alive statement is needed.

Each mutant removes one statement from a copy of the pyrt package and runs
tests/test_async_ordering.py against that copy in a subprocess; the module must
fail. A surviving mutant means the simulated GPU (or the ordering tests) can no
longer see the bug that statement prevents on a real GPU. The statements are
matched by their exact source text, so a refactor that moves one must update
the list here (the test fails if a statement is not found exactly once).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import gpu_programs

ROOT = Path(__file__).resolve().parents[1]

DELEGATES = "pyrt/runtime/delegates.py"
INPUTS = "pyrt/runtime/inputs.py"
OUTPUTS = "pyrt/runtime/outputs.py"
GRAPH_FORWARD = "pyrt/runtime/graph_forward.py"

# (file, exact statement text (one line, stripped), what a GPU does without it)
MUTANTS = [
    (DELEGATES, "ctx.order(src.device, device)",
     "a peer copy into an engine reads its source before the other device has written it"),
    (DELEGATES, "ctx.order(device, dst.device)",
     "a peer copy out of an engine runs before the engine on the other device has finished"),
    (DELEGATES, "stream.synchronize()  # host kernels read it next",
     "host code reads an engine's host output before the copy has run"),
    (DELEGATES, "self._order_streams(self._own[device], self.cuda.borrowed_stream(0, device))",
     "a caller without a stream reads a device output before pyrt's stream has written it"),
    (DELEGATES, "self._keep.append(private)  # read by a queued copy: freed only after its event",
     "an asynchronous copy reads a host buffer after it was freed"),
    (DELEGATES, "private = np.array(src, copy=True, order=\"C\") => private = src",
     "an asynchronous copy reads arena memory that a host kernel has overwritten meanwhile"),
    (DELEGATES, "s.wait(event)",
     "a run writes an arena that the previous run's work on another stream has not read yet"),
    (DELEGATES, "event.synchronize()",
     "a host copy is freed while the copy that reads it may still be queued"),
    (INPUTS, "stream.synchronize()  # the host reads the copy next",
     "a device input meant for a host tensor is read before its copy has run"),
    (OUTPUTS, "stream.synchronize()  # the caller gets the host copy next",
     "a host caller gets a device output before its copy has run"),
    (INPUTS, "state.ctx.wait_for(dev.stream, dev.device, stream)  # the producer first, then the copy out",
     "a device input meant for a host tensor is copied before the producer's stream has written it"),
    (INPUTS, "state.ctx.wait_for(dev.stream, dev.device, stream)  # the producer first, then the copy in",
     "a device input is copied into its arena before the producer's stream has written it"),
    ("pyrt/kernels/prim_kernels.py", "stream.synchronize()  # host kernels read it next",
     "a host kernel reads an et_copy device->host result before the copy has run"),
    (OUTPUTS, "alloc = seam.alloc_async(t.nbytes, stream, state.ctx.ready_handle(t.device))"
     " => alloc = seam.alloc_async(t.nbytes, stream)",
     "without a stream, a device output the caller uses on the legacy stream is freed on pyrt's stream"),
    (DELEGATES, "return 0 if device in self._own_used else int(self.stream(device).handle) => return 0",
     "a dropped device output is freed on the legacy stream, unordered with the caller's stream that still uses it"),
    (OUTPUTS, "alloc = seam.alloc_async(t.nbytes, stream, state.ctx.ready_handle(t.device))"
     " => alloc = seam.alloc(max(t.nbytes, 1), t.device)",
     "dropping a device output frees it with cuMemFree, which synchronises the device"),
]

# The same for a whole-method graph replay (pyrt.runtime.graph_forward), caught by tests/test_graph_forward.py.
GRAPH_MUTANTS = [
    (GRAPH_FORWARD, "if producer is not None and producer != handle:  # the producer's queued work first"
     " => if False:", "an input is copied in before the producer's stream has written it"),
    (GRAPH_FORWARD, "if last and (last is not self._ends or handle != self._end_handle): => if False:",
     "a replay on another stream overwrites planned buffers the last run's work still reads"),
    (GRAPH_FORWARD, "if own and (r := wait(0, ev_end, 0))[0]:  # results ready on the legacy "
     "stream => if False:", "a caller with no stream uses outputs on the legacy stream before they are written"),
    (GRAPH_FORWARD, "if self.static: => if True:",
     "an output the caller holds is overwritten by the next replay"),
    (GRAPH_FORWARD, "free_on = 0 if own else handle  # the legacy stream where pyrt used its own"
     " => free_on = 0",
     "a dropped output is freed on the legacy stream, unordered with the caller's stream that still uses it"),
    (GRAPH_FORWARD, "free_on = 0 if own else handle  # the legacy stream where pyrt used its own"
     " => free_on = handle",
     "without a stream, an output the caller uses on the legacy stream is freed on pyrt's stream"),
    ("pyrt/device/memory.py", "self._cuda.free_async(self.ptr, self.device, self._free_on)"
     " => self._cuda.free_memory(self.ptr, self.device)",
     "dropping an output frees it with cuMemFree, which synchronises the device"),
]


@pytest.fixture(scope="module")
def prebuilt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ordering tests' programs, built once and shared with every mutant's run."""
    existing = gpu_programs.prebuilt_dir()
    if existing is not None:
        return existing
    pytest.importorskip("torch")
    pytest.importorskip("executorch")
    directory = tmp_path_factory.mktemp("mutant-programs")
    gpu_programs.build_all(directory)
    return directory


def _mutate(tree: Path, rel: str, statement: str) -> None:
    """Remove ``statement`` (or, written ``"old => new"``, replace it with ``new``)."""
    statement, _, replacement = statement.partition(" => ")
    path = tree / rel
    lines = path.read_text().splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if line.strip() == statement]
    assert len(hits) == 1, f"{rel}: statement {statement!r} found {len(hits)} times, not once: update MUTANTS"
    indent = lines[hits[0]][: len(lines[hits[0]]) - len(lines[hits[0]].lstrip())]
    lines[hits[0]] = f"{indent}{replacement or 'pass'}  # mutant of {statement!r}\n"
    path.write_text("".join(lines))


def test_unmutated_tree_passes(prebuilt: Path, tmp_path: Path) -> None:
    """The harness itself: the copied tree passes the ordering tests unchanged."""
    tree = _copy_tree(tmp_path)
    assert _run(tree, prebuilt).returncode == 0
    assert _run(tree, prebuilt, "test_graph_forward.py").returncode == 0


@pytest.mark.parametrize(("rel", "statement", "hazard"), MUTANTS, ids=[f"{m[0]}:{m[1][:40]}" for m in MUTANTS])
def test_removing_a_statement_is_caught(rel: str, statement: str, hazard: str, prebuilt: Path,
                                        tmp_path: Path) -> None:
    tree = _copy_tree(tmp_path)
    _mutate(tree, rel, statement)
    result = _run(tree, prebuilt)
    assert result.returncode != 0, f"mutant survived ({hazard}): removing {statement!r} from {rel}\n" \
                                   f"{result.stdout[-2000:]}"


@pytest.mark.parametrize(("rel", "statement", "hazard"), GRAPH_MUTANTS,
                         ids=[f"{m[0]}:{m[1][:40]}" for m in GRAPH_MUTANTS])
def test_removing_a_graph_replay_statement_is_caught(rel: str, statement: str, hazard: str, prebuilt: Path,
                                                     tmp_path: Path) -> None:
    tree = _copy_tree(tmp_path)
    _mutate(tree, rel, statement)
    result = _run(tree, prebuilt, "test_graph_forward.py")
    assert result.returncode != 0, f"mutant survived ({hazard}): {statement!r} in {rel}\n{result.stdout[-2000:]}"


def _copy_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "pyrt", tree / "pyrt", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "tests", tree / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    return tree


def _run(tree: Path, prebuilt: Path, tests: str = "test_async_ordering.py") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree), "PYRT_PREBUILT_PTE": str(prebuilt), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
         "--rootdir", str(tree), str(tree / "tests" / tests)],
        cwd=tree, env=env, capture_output=True, text=True, timeout=600)
