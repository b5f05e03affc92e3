"""Mutation test: every ordering, synchronisation and keep-alive statement in pyrt is needed.

The statements are found, not listed: :mod:`tests.device.ordering_statements` walks pyrt's AST for
every statement that records or waits for an event, synchronises a stream or event, keeps
host memory alive for a queued copy, records a stream for a foreign tensor, or chooses the
stream a buffer is freed on. Each becomes a mutant (the statement deleted, or an ``if``'s
condition made False) in a copy of the package, and the ordering tests of its module
(:data:`TESTS`) run against that copy in a subprocess: they must fail. A surviving mutant
means the asynchronous fake GPU (or the tests) can no longer see the bug that statement
prevents on a real GPU; a new ordering statement that no test needs fails this suite.
:data:`EXEMPT` names the statements that are not mutants, each with its reason; an
exemption that no longer matches a statement fails too. :data:`REPLACEMENTS` adds mutants
that change a statement instead of deleting it (a copy skipped, the wrong stream chosen).
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.device.ordering_statements import Statement, statements
from tests.fixtures import gpu_programs

ROOT = Path(__file__).resolve().parents[2]

DEVICE_CONTEXT = "pyrt/runtime/device_context.py"
OUTPUTS = "pyrt/runtime/outputs.py"
GRAPH_FORWARD = "pyrt/runtime/graph_forward.py"
SERVE_OPENAI = "tests/serve/test_serve_openai.py"

# The test modules that must fail for a mutant of each file (default: the general path's ordering tests).
TESTS = {GRAPH_FORWARD: ("tests/runtime/test_graph_forward.py",),
         "pyrt/runtime/state_rows.py": ("tests/device/test_state_row_ordering.py",),
         "pyrt/device/memory.py": ("tests/runtime/test_graph_forward.py", "tests/device/test_async_ordering.py"),
         # asyncio waits of the serving batcher
         "pyrt/serve/batch_queue.py": ("tests/serve/test_serve_batch_queue.py",),
         # threading waits of a generation: without them a result is read before it exists (the engine's own
         # tests, on a stand-in program: no export in the mutant's run)
         "pyrt/llm/loop.py": ("tests/llm/test_engine.py",),
         # a generation's handle waiting on its outbox: without the wait nothing takes the updates (it never ends)
         "pyrt/llm/stream.py": ("tests/llm/test_stream.py",),
         # the replica's generation engine: the event loop's waits for tokens, the event stream's wait for its
         # sender or a disconnect
         "pyrt/serve/llm_host.py": (SERVE_OPENAI,),
         "pyrt/serve/generation_call.py": (SERVE_OPENAI,),
         "pyrt/serve/events.py": (SERVE_OPENAI,),
         # the replica's timeouts and run thread
         "pyrt/serve/limits.py": ("tests/serve/test_serve_limits.py",)}
DEFAULT_TESTS = ("tests/device/test_async_ordering.py",)

# "file: first line of the statement" -> why it is not a mutant.
EXEMPT = {
    "pyrt/runtime/state_rows.py: stream.wait(event)":
        "runs queue their work on the pyrt stream the copy uses, so that stream orders them already; kept for a "
        "run on a torch caller's stream, which the simulated GPU cannot make (test_state_row_ordering.py "
        "catches the record that orders the next run after the copy)",
    "pyrt/device/cuda_seam.py: current().synchronize(index)":
        "pyrt.cuda.synchronize, the seam's public helper: the statements calling it are the mutants",
    "pyrt/device/streams.py: end.synchronize()":
        "Event.elapsed_ms waits for its end event before reading a time: timing, and without it the driver "
        "answers CUDA_ERROR_NOT_READY (an error), never a wrong order",
    "pyrt/device/tensorrt_seam.py: self.messages.record(getattr(severity, \"name\", str(severity)), msg)":
        "a TensorRT log message, not an event",
    "pyrt/format/values.py: fields = order(unpack(data, pos) + zeros)": "the reader's field order, not an event",
    "pyrt/runtime/profile.py: e0.record(stream)": "profiler timing events: they time instructions, order nothing",
    "pyrt/runtime/profile.py: e1.record(stream)": "profiler timing events: they time instructions, order nothing",
    "pyrt/tools/bench.py: self._start.record(self.stream)": "benchmark timing events, order nothing",
    "pyrt/tools/bench.py: self._end.record(self.stream)": "benchmark timing events, order nothing",
    "pyrt/memory/interop.py: x.record_stream(torch.cuda.ExternalStream(reader, device=x.device))":
        "torch's caching allocator exists only with CUDA torch on a real GPU: tests/device/test_gpu_torch_inputs.py "
        "(marked gpu) fails without it (seen on an H100: the input's block reused, the read wrong)",
    "pyrt/device/memory.py: self._free_on = free_on":
        "the constructor keeps its argument; the free that uses it (free_async) is the mutant",
    "pyrt/memory/tensors.py: self.keepalive = keepalive": "the constructor keeps its argument (no copy is queued)",
    "pyrt/memory/tensors.py: self.keepalive = None": "the constructor's initial value (no copy is queued)",
    "pyrt/runtime/run_state.py: self.keepalive: list[Any] = []":
        "creates the run's keep-alive list; the statement that fills it is the mutant",
    DEVICE_CONTEXT + ": self._keep: list[Any] = []  # private host copies read by this run's queued copies":
        "creates the keep-alive list; the statement that fills it is the mutant",
    "pyrt/serve/command.py: while not stop.wait(0.5):":
        "a threading.Event the serve command waits on, not a CUDA event",
    "pyrt/serve/metrics.py: while not self._stop.wait(every_s):":
        "the metrics thread's pause between flushes (a threading.Event), not a CUDA event",
    "pyrt/llm/gen_bench.py: torch.cuda.synchronize()":
        "the host-link bandwidth measurement's clock reads (torch, real GPUs only): timing, orders no result",
    "pyrt/serve/command.py: lifetime.record(owner)  # what a later pyrt serve may end if this one and its watchdog "
    "are killed": "writes pyrt serve's run-state file (the processes a later run may end), not an event; "
    "tests/serve/test_serve_stop.py::test_the_next_pyrt_serve_ends_what_a_killed_one_left needs it",
    "pyrt/serve/command.py: lifetime.record(owner)  # the replicas too (the watchdog records them again every few "
    "seconds)": "writes pyrt serve's run-state file again once the replicas run, not an event",
    "pyrt/serve/lifetime.py: record(owner)": "the watchdog refreshing the run-state file, not an event; "
    "tests/serve/test_serve_lifetime.py::test_the_watchdog_records_its_owner_s_processes_... needs it",
    "pyrt/runtime/device_context.py: self._keep = []":
        "drops the host copies after their copies' events were waited for: deleting it holds memory longer, "
        "it orders nothing",
}

# (file, "exact statement text => replacement", what a GPU does with the replacement): changes, not deletions.
REPLACEMENTS = [
    (DEVICE_CONTEXT, "private = np.array(src, copy=True, order=\"C\") => private = src",
     "an asynchronous copy reads arena memory that a host kernel has overwritten meanwhile"),
    (OUTPUTS, "alloc = seam.alloc_async(t.nbytes, stream, state.ctx.ready_handle(t.device))"
     " => alloc = seam.alloc_async(t.nbytes, stream)",
     "without a stream, a device output the caller uses on the legacy stream is freed on pyrt's stream"),
    (DEVICE_CONTEXT, "return 0 if device in self._own_used else int(self.stream(device).handle) => return 0",
     "a dropped device output is freed on the legacy stream, unordered with the caller's stream that still uses it"),
    (OUTPUTS, "alloc = seam.alloc_async(t.nbytes, stream, state.ctx.ready_handle(t.device))"
     " => alloc = seam.alloc(max(t.nbytes, 1), t.device)",
     "dropping a device output frees it with cuMemFree, which synchronises the device"),
    (GRAPH_FORWARD, "if self.static: => if True:", "an output the caller holds is overwritten by the next replay"),
    (GRAPH_FORWARD, "free_on = 0 if own else handle  # the legacy stream where pyrt used its own => free_on = 0",
     "a dropped output is freed on the legacy stream, unordered with the caller's stream that still uses it"),
    (GRAPH_FORWARD, "free_on = 0 if own else handle  # the legacy stream where pyrt used its own"
     " => free_on = handle",
     "without a stream, an output the caller uses on the legacy stream is freed on pyrt's stream"),
    ("pyrt/device/memory.py", "self._cuda.free_async(self.ptr, self.device, self._free_on)"
     " => self._cuda.free_memory(self.ptr, self.device)",
     "dropping an output frees it with cuMemFree, which synchronises the device"),
]

# A mutant that hangs (a wait deleted from a loop) fails its tests by this per-test limit (pytest-timeout).
MUTANT_TIMEOUT_S = 240

FOUND = statements(ROOT)
MUTANTS = [s for s in FOUND if s.key not in EXEMPT]


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
    assert len(hits) == 1, f"{rel}: statement {statement!r} found {len(hits)} times, not once: update REPLACEMENTS"
    indent = lines[hits[0]][: len(lines[hits[0]]) - len(lines[hits[0]].lstrip())]
    lines[hits[0]] = f"{indent}{replacement or 'pass'}  # mutant of {statement!r}\n"
    path.write_text("".join(lines))


@pytest.mark.mutants
def test_unmutated_tree_passes(prebuilt: Path, tmp_path: Path) -> None:
    """The harness itself: the copied tree passes every module's ordering tests unchanged."""
    tree = _copy_tree(tmp_path)
    assert _run(tree, prebuilt, "tests/device/test_async_ordering.py",
                "tests/runtime/test_graph_forward.py").returncode == 0


def test_discovery_finds_the_ordering_statements() -> None:
    """Every exemption still names a statement, and the statements known to matter are found."""
    keys = {s.key for s in FOUND}
    assert not set(EXEMPT) - keys, f"exemptions that match no statement any more: {sorted(set(EXEMPT) - keys)}"
    for known in (f"{DEVICE_CONTEXT}: s.wait(event)", f"{DEVICE_CONTEXT}: event.synchronize()",
                  "pyrt/runtime/inputs.py: stream.synchronize()  # the host reads the copy next",
                  "pyrt/device/memory.py: self._cuda.free_async(self.ptr, self.device, self._free_on)",
                  "pyrt/runtime/graph_forward.py: if (r := record(ev_in, 0))[0] or (r := wait(raw, ev_in, 0))[0]:"):
        assert known in keys, known
    assert len(MUTANTS) >= 20


@pytest.mark.mutants
@pytest.mark.parametrize("statement", MUTANTS, ids=[f"{s.rel}:{s.lineno}" for s in MUTANTS])
def test_removing_an_ordering_statement_is_caught(statement: Statement, prebuilt: Path, tmp_path: Path) -> None:
    tree = _copy_tree(tmp_path)
    path = tree / statement.rel
    path.write_text(statement.mutate(path.read_text(encoding="utf-8")), encoding="utf-8")
    result = _run(tree, prebuilt, *TESTS.get(statement.rel, DEFAULT_TESTS))
    assert result.returncode != 0, (f"mutant survived: {statement.key} (line {statement.lineno}) can be removed "
                                    f"and {TESTS.get(statement.rel, DEFAULT_TESTS)} still pass; add a test that "
                                    f"needs it or an exemption with its reason\n{result.stdout[-2000:]}")


@pytest.mark.mutants
@pytest.mark.parametrize(("rel", "statement", "hazard"), REPLACEMENTS,
                         ids=[f"{m[0]}:{m[1][:40]}" for m in REPLACEMENTS])
def test_changing_a_statement_is_caught(rel: str, statement: str, hazard: str, prebuilt: Path,
                                        tmp_path: Path) -> None:
    tree = _copy_tree(tmp_path)
    _mutate(tree, rel, statement)
    result = _run(tree, prebuilt, *TESTS.get(rel, DEFAULT_TESTS))
    assert result.returncode != 0, f"mutant survived ({hazard}): {statement!r} in {rel}\n{result.stdout[-2000:]}"


def _copy_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "pyrt", tree / "pyrt", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "tests", tree / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    return tree


# pytest plugins a mutant's run does without (each costs a second of every run's start-up)
UNUSED_PLUGINS = ("hypothesispytest", "hydra_pytest", "kgb", "anyio", "xdist", "xdist.looponfail")


@functools.cache
def _serve_files() -> Path:
    """The generation routes' tests' files (tests/fixtures/llm_serve.py), made once for every mutant that runs them."""
    from tests.fixtures import llm_serve

    directory = Path(tempfile.mkdtemp(prefix="pyrt-mutants-llm-"))
    atexit.register(shutil.rmtree, directory, True)
    env = {**os.environ, llm_serve.PREBUILT_ENV: str(directory)}
    subprocess.run([sys.executable, "-c", "from tests.fixtures import llm_serve as S; S.slot_file('portable'); "
                    "S.tokenizer_dir()"], cwd=ROOT, env=env, check=True, timeout=600)
    return directory


def _run(tree: Path, prebuilt: Path, *tests: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree), "PYRT_PREBUILT_PTE": str(prebuilt), "PYTHONDONTWRITEBYTECODE": "1"}
    if SERVE_OPENAI in tests:
        env["PYRT_PREBUILT_LLM_SERVE"] = str(_serve_files())
    plugins = [arg for name in UNUSED_PLUGINS for arg in ("-p", f"no:{name}")]
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *plugins, "-o", "addopts=",
         "--timeout", str(MUTANT_TIMEOUT_S), "--rootdir", str(tree), *(str(tree / t) for t in tests)],
        cwd=tree, env=env, capture_output=True, text=True, timeout=600)
