"""``pyrt run | bench | profile | inspect --graph`` as real subprocesses, checked against the Python API.

CPU programs come from ExecuTorch (``portable``: methods ``forward`` and
``dyn``); reference-engine programs from ``pyrt.export.to_pte`` run under
``PYRT_SIMULATED_GPUS=2`` in the child and ``simulated_gpus(2)`` here. Plot
and trace files are checked for validity (PNG header and size, trace schema),
never for pixels or timings.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pyrt.errors import BudgetError, InputError
from pyrt.format.method_io import InputSpec
from pyrt.runtime.program import Program
from pyrt.sim import simulated_gpus
from pyrt.tools.bench import PLOT_DPI, PLOT_SIZE, parse_sweep
from pyrt.tools.inputs import assemble, parse_shape_arg, summarize

ROOT = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def cli(*args: Any, gpus: int | None = None, env: dict[str, str] | None = None,
        **kw: Any) -> subprocess.CompletedProcess:
    """``python -m pyrt ARGS`` importing this checkout's pyrt; ``gpus``: PYRT_SIMULATED_GPUS."""
    environ = {k: v for k, v in os.environ.items() if k not in ("PYRT_SIMULATED_GPUS", "NO_COLOR", "PYRT_DEBUG")}
    environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    if gpus is not None:
        environ["PYRT_SIMULATED_GPUS"] = str(gpus)
    environ.update(env or {})
    if "stdout" not in kw and "stderr" not in kw:
        kw["capture_output"] = True
    return subprocess.run([sys.executable, "-m", "pyrt", *map(str, args)], cwd=ROOT, env=environ, text=True,
                          timeout=300, **kw)


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc


def failed(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """The error message of a run that must fail with status 1, no traceback, naming ``needles``."""
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert proc.stderr.startswith("pyrt: error: ") and "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, (needle, proc.stderr)
    return proc.stderr


def check_trace(trace: dict[str, Any]) -> dict[tuple[int, int], str]:
    """Chrome trace (JSON object format) schema; returns (pid, tid) -> track name."""
    assert isinstance(trace["traceEvents"], list) and trace["traceEvents"]
    processes: dict[int, str] = {}
    tracks: dict[tuple[int, int], str] = {}
    for e in trace["traceEvents"]:
        assert e["ph"] in ("X", "M"), e
        assert isinstance(e["name"], str) and isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name", "process_sort_index"), e
            if e["name"] == "process_name":
                processes[e["pid"]] = e["args"]["name"]
            elif e["name"] == "thread_name":
                tracks[(e["pid"], e["tid"])] = e["args"]["name"]
            continue
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
        assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
        assert isinstance(e.get("cat", ""), str) and isinstance(e.get("args", {}), dict), e
        assert (e["pid"], e["tid"]) in tracks and e["pid"] in processes, e  # named before use
    json.dumps(trace, allow_nan=False)  # strict JSON: Perfetto rejects NaN
    return {k: f"{processes[k[0]]}/{v}" for k, v in tracks.items()}


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR", data[:16]
    return struct.unpack(">II", data[16:24])


def instructions(summary: dict[str, Any]) -> list[tuple]:
    return [(r["method"], r["chain"], r["pc"], r["kind"], r["name"], r["calls"]) for r in summary["instructions"]]


# -- conventions ---------------------------------------------------------------------------------------


def test_help_has_examples_and_usage_errors_exit_2() -> None:
    for args in ((), ("run",), ("bench",), ("profile",), ("inspect",)):
        proc = ok(cli(*args, "--help"))
        assert proc.stdout.startswith("usage: pyrt") and "examples:" in proc.stdout
    for args in (("run",), ("bench", "m.pte", "--iters", "3", "--seconds", "1"), ("frobnicate",),
                 ("run", "m.pte", "--device-map", "nonsense"), ("run", "m.pte", "--shape", "0=2,a")):
        proc = cli(*args)
        assert proc.returncode == 2 and "usage: pyrt" in proc.stderr and "Traceback" not in proc.stderr, args


def test_errors_exit_1_with_the_typed_message_and_debug_shows_the_traceback(tmp_path: Path) -> None:
    missing = tmp_path / "missing.pte"
    failed(cli("run", missing, "--random"), str(missing))
    proc = cli("run", missing, "--random", "--debug")
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "PteFormatError" in proc.stderr
    failed(cli("inspect", missing, gpus="two"), "PYRT_SIMULATED_GPUS='two'")


def test_broken_pipe_is_quiet(portable_pte: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "pyrt", "inspect", "--json", str(portable_pte)], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first write, like `| head` finishing early
    with proc.stderr:
        err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert err == ""


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
def test_colour_only_on_a_terminal_and_never_with_no_color(tmp_path: Path) -> None:
    def stderr_on_tty(extra: dict[str, str]) -> str:
        master, slave = os.openpty()
        try:
            proc = cli("inspect", tmp_path / "nope.pte", stderr=slave, stdout=subprocess.DEVNULL,
                       env={"TERM": "xterm", **extra})
            os.close(slave)
            slave = -1
            chunks = []
            while True:
                try:
                    chunk = os.read(master, 4096)
                except OSError:
                    break
                if not chunk:
                    break
                chunks.append(chunk)
            assert proc.returncode == 1
            return b"".join(chunks).decode()
        finally:
            os.close(master)
            if slave >= 0:
                os.close(slave)

    assert "\x1b[" in stderr_on_tty({})
    plain = stderr_on_tty({"NO_COLOR": "1"})
    assert "\x1b[" not in plain and plain.startswith("pyrt: error:")
    assert "\x1b[" not in cli("inspect", tmp_path / "nope.pte").stderr  # a pipe is not a terminal


# -- pyrt run ------------------------------------------------------------------------------------------


def test_run_random_json_matches_the_api(portable_pte: Path, tmp_path: Path) -> None:
    out = tmp_path / "dyn.npz"
    proc = ok(cli("run", portable_pte, "--method", "dyn", "--random", "--seed", "3", "--shape", "input0=5,3",
                  "--kernels", "numpy", "--save", out, "--json"))
    info = json.loads(proc.stdout)
    saved = np.load(out)
    x = saved["input0"]
    assert x.shape == (5, 3) and x.dtype == np.float32
    assert info["inputs"] == [{"position": 0, "kind": "Tensor", "origin": "random", "seed": 3, "dtype": "float32",
                               "shape": [5, 3], "declared": [16, 3], "dynamic": True}]
    with Program(portable_pte, kernels="numpy") as prog:
        y = prog.run(x, method="dyn")
    np.testing.assert_array_equal(saved["output0"], y)
    assert info["outputs"] == [{"position": 0, **summarize(y)}]
    assert info["weight_streaming"] == [] and info["kernels"] == "numpy"
    again = json.loads(ok(cli("run", portable_pte, "--method", "dyn", "--input", out, "--kernels", "numpy",
                              "--json")).stdout)
    assert again["outputs"] == info["outputs"] and again["inputs"][0]["origin"] == "file"
    text = ok(cli("run", portable_pte, "--method", "dyn", "--random", "--kernels", "numpy")).stdout
    assert "float32[16, 3]" in text and "min " in text and "std " in text  # upper bound by default


def test_run_input_files_validated(portable_pte: Path, tmp_path: Path) -> None:
    x = np.linspace(-2, 2, 8, dtype=np.float32).reshape(2, 4)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "idx.npy", np.array([1, 3]))
    np.save(tmp_path / "x64.npy", x.astype(np.float64))
    np.save(tmp_path / "wide.npy", np.zeros((2, 5), np.float32))
    run = ("run", portable_pte, "--kernels", "numpy")
    info = json.loads(ok(cli(*run, "--input", f"0={tmp_path / 'x.npy'}", "--input", f"input1={tmp_path / 'idx.npy'}",
                             "--json")).stdout)
    with Program(portable_pte, kernels="numpy") as prog:
        expected = prog(x, np.array([1, 3]))
    assert info["outputs"] == [{"position": i, **summarize(y)} for i, y in enumerate(expected)]
    failed(cli(*run, "--input", f"0={tmp_path / 'x64.npy'}", "--random"), "input 0", "float64", "float32")
    failed(cli(*run, "--input", f"0={tmp_path / 'wide.npy'}", "--random"), "input 0", "[2, 5]", "[2, 4]")
    failed(cli(*run, "--input", f"0={tmp_path / 'x.npy'}"), "input 1", "--random")
    failed(cli(*run, "--input", f"7={tmp_path / 'x.npy'}"), "no input '7'")
    failed(cli(*run, "--input", tmp_path / "nope.npy"), "nope.npy")
    failed(cli(*run, "--method", "dyn", "--random", "--shape", "0=17,3"), "upper bound [16, 3]")
    failed(cli(*run, "--method", "nope", "--random"), "no method 'nope'", "'dyn', 'forward'")
    failed(cli(*run, "--random", "--budget", "lots"), "'lots'")


def test_inputs_helpers() -> None:
    spec = InputSpec(0, "Tensor", "int64", (4,), dynamic=True)
    with pytest.raises(InputError, match="exceeds the upper bound"):
        assemble([spec], {0: np.zeros(5, np.int64)}, method="m")
    scalar = InputSpec(1, "Int", value=3)
    origins: dict[int, str] = {}
    args = assemble([spec, scalar], {}, method="m", random=True, seed=0, shapes={0: (2,)}, origins=origins)
    assert args[0].shape == (2,) and set(args[0].tolist()) <= {0, 1} and args[1] == 3
    assert origins == {0: "random", 1: "constant"}
    assert parse_shape_arg("input2=1x3x8") == ("input2", (1, 3, 8))
    with pytest.raises(ValueError):
        parse_shape_arg("1,2,3")
    assert summarize(np.array([1.0, np.nan, np.inf]))["nan"] == 1
    assert summarize(np.array([1.0, np.nan, np.inf]))["max"] == 1.0


def test_sweep_parsing() -> None:
    assert parse_sweep("10%..100%") == [f"{p}%" for p in range(10, 101, 10)]
    assert parse_sweep("0%..100%:50%") == ["0", "50%", "100%"]
    assert parse_sweep("64MiB..256MiB:64MiB") == ["64MiB", "128MiB", "192MiB", "256MiB"]
    assert parse_sweep("30%..100%:30%") == ["30%", "60%", "90%", "100%"]  # STOP always included
    for bad in ("10%", "10%..1GiB", "50%..10%", "10%..100%:0%", "x%..10%", "1..2:0"):
        with pytest.raises(BudgetError, match="--sweep"):
            parse_sweep(bad)


# -- pyrt bench / profile on the CPU ---------------------------------------------------------------------


def test_bench_cpu_host_clock(portable_pte: Path) -> None:
    info = json.loads(ok(cli("bench", portable_pte, "--method", "dyn", "--kernels", "numpy", "--iters", "7",
                             "--warmup", "1", "--json")).stdout)
    assert info["clock"] == "host" and info["devices"] == []
    (row,) = info["rows"]
    assert row["iterations"] == 7 and row["warmup"] == 1 and row["budget"] is None and row["engines"] == []
    lat = row["latency_ms"]
    assert 0 < lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
    assert row["throughput_per_s"] > 0
    text = ok(cli("bench", portable_pte, "--method", "dyn", "--kernels", "numpy", "--iters", "2", "--no-progress"))
    assert "host clock" in text.stdout and "p99 ms" in text.stdout


def test_profile_cpu_matches_the_api(portable_pte: Path, tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    info = json.loads(ok(cli("profile", portable_pte, "--kernels", "numpy", "--warmup", "0", "--iters", "3",
                             "--trace", trace, "--json")).stdout)
    with Program(portable_pte, kernels="numpy") as prog:
        with prog.profile() as prof:
            for _ in range(3):
                prog(np.zeros((2, 4), np.float32), np.array([0, 1]))
        api = prof.summary()
    assert info["runs"] == 3 and info["clock"] == "host" and info["by_delegate"] == []
    assert instructions(info) == instructions(api) and len(api["instructions"]) > 5
    assert [(r["kind"], r["name"], r["calls"]) for r in sorted(info["by_operator"], key=lambda r: r["name"])] == \
        [(r["kind"], r["name"], r["calls"]) for r in sorted(api["by_operator"], key=lambda r: r["name"])]
    tracks = check_trace(json.loads(trace.read_text()))
    assert list(tracks.values()) == ["pyrt host/host thread 1"]  # no device: the host track only
    text = ok(cli("profile", portable_pte, "--method", "dyn", "--kernels", "numpy", "--iters", "1")).stdout
    assert "by operator" in text and "per instruction" in text and "aten::mul.out" in text


def test_profiling_leaves_the_plain_steps(portable_pte: Path) -> None:
    x = np.ones((3, 3), np.float32)
    with Program(portable_pte, kernels="numpy") as prog:
        runner = prog._runners["dyn"]
        plain = runner._steps
        with prog.profile() as prof:
            assert runner._steps is not plain and runner.observer is prof
            y = prog.run(x, method="dyn")
        assert runner._steps is plain and runner.observer is None
        np.testing.assert_array_equal(prog.run(x, method="dyn"), y)
        assert prof.summary()["runs"] == 1  # the run after the block was not recorded


def test_profiling_a_jumping_chain(tmp_path: Path) -> None:
    """torch.cond lowers to JumpFalseCall: the profiled run takes the same branches as the plain one."""
    pytest.importorskip("executorch")
    from tests.runtime.test_runtime import _export

    path = _export("cond", tmp_path)
    xs = [np.array([1.0, 2, 3], np.float32), np.array([-1.0, 2, -3], np.float32)]
    with Program(path, kernels="numpy") as prog:
        assert prog._runners["forward"].plan.has_jumps
        plain = [prog(x) for x in xs]
        with prog.profile() as prof:
            profiled = [prog(x) for x in xs]
        summary = prof.summary()
    for a, b in zip(plain, profiled, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(profiled[0], xs[0] * 2)
    np.testing.assert_array_equal(profiled[1], xs[1] - 1)
    calls = {r["name"]: r["calls"] for r in summary["by_operator"]}
    assert calls.get("aten::mul.out") == 1 and calls.get("aten::sub.out") == 1  # one branch per run
    assert "JumpFalseCall" not in {r["kind"] for r in summary["instructions"]}  # control flow is not a step


def test_timing_events_on_the_simulated_driver() -> None:
    """Event.elapsed_ms needs two recorded timing events, as cuEventElapsedTime does."""
    from pyrt.errors import DeviceError

    with simulated_gpus(1) as sim:
        cuda = sim.cuda
        with cuda.stream(0) as s, cuda.event(0, timing=True) as a, cuda.event(0, timing=True) as b, \
                cuda.event(0) as untimed:
            with pytest.raises(DeviceError, match="cuEventElapsedTime"):
                a.elapsed_ms(b)  # neither is recorded yet
            a.record(s)
            b.record(s)
            assert a.elapsed_ms(b) >= 0.0
            untimed.record(s)
            with pytest.raises(DeviceError, match="CUDA_ERROR_INVALID_HANDLE"):
                a.elapsed_ms(untimed)  # created with CU_EVENT_DISABLE_TIMING


# -- inspect --graph ------------------------------------------------------------------------------------


def test_inspect_graph_svg_and_dot_fallback(delegated_pte: Path, tmp_path: Path) -> None:
    dot = tmp_path / "g.dot"
    ok(cli("inspect", delegated_pte, "--graph", dot))
    text = dot.read_text()
    assert text.startswith("digraph pyrt {") and text.rstrip().endswith("}")
    assert "delegate 0: TensorRTBackend\\non cuda:0" in text and "fallback kernel on cpu" in text
    assert "cluster_m0" in text and "cluster_m1" in text  # one cluster per method
    no_dot = ok(cli("inspect", delegated_pte, "--graph", tmp_path / "n.svg", env={"PATH": str(tmp_path)}))
    assert "Graphviz 'dot' is not on PATH" in no_dot.stderr and no_dot.stdout  # the report is still printed
    assert (tmp_path / "n.dot").read_text() == text and not (tmp_path / "n.svg").exists()
    if shutil.which("dot") is None:
        pytest.skip("Graphviz is not installed: SVG rendering not checked")
    ok(cli("inspect", delegated_pte, "--graph", tmp_path / "g.svg", "--json"))
    svg = (tmp_path / "g.svg").read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg and "TensorRTBackend" in svg


# -- reference engines on simulated GPUs -------------------------------------------------------------------


@pytest.fixture(scope="module")
def graph_break(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two reference engines on cuda:0 and cuda:1 around aten::sin, streamable weights, dynamic batch."""
    pytest.importorskip("torch")
    pytest.importorskip("executorch")
    from tests.fixtures import gpu_programs

    return gpu_programs.build_all(tmp_path_factory.mktemp("cli-gpu"))["graph_break"]


def test_run_simulated_gpus_matches_the_api(graph_break: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.npz"
    info = json.loads(ok(cli("run", graph_break, "--random", "--seed", "1", "--kernels", "numpy", "--budget", "50%",
                             "--save", out, "--json", gpus=2)).stdout)
    saved = np.load(out)
    assert saved["input0"].shape == (8, 8)  # the dynamic batch at its upper bound
    with simulated_gpus(2), Program(graph_break, kernels="numpy", budget="50%") as prog:
        y = prog(saved["input0"])
        engines = [dict(vars(w)) for w in prog.weight_streaming]
    # The command never imports torch, so its reference engines compute with numpy; this process has torch,
    # and they compute with torch.ops.aten (pyrt.sim.refengine.backends, "auto"): float32 sums in
    # another order, equal within rounding (1.2e-7 seen), not bit for bit.
    np.testing.assert_allclose(saved["output0"], y, rtol=1e-5, atol=1e-6)
    assert info["weight_streaming"] == engines and [e["source"] for e in engines] == ["load-time"] * 2
    text = ok(cli("run", graph_break, "--random", "--kernels", "numpy", "--device-map", "cuda:1=cuda:0", gpus=1))
    assert "engine 1 (forward/delegate1, cuda:0)" in text.stdout
    failed(cli("run", graph_break, "--random", "--kernels", "numpy", gpus=1), "CUDA device 1 does not exist")


def test_bench_sweep_on_simulated_gpus_reads_budgets_back(graph_break: Path, tmp_path: Path) -> None:
    png = tmp_path / "curve.png"
    info = json.loads(ok(cli("bench", graph_break, "--kernels", "numpy", "--budget", "256", "--budget", "0=100,1=50%",
                             "--sweep", "0%..100%:50%", "--iters", "3", "--warmup", "1", "--plot", png, "--json",
                             gpus=2)).stdout)
    assert info["clock"] == "cuda-events" and info["devices"] == ["cuda:0 (Fake GPU 0)", "cuda:1 (Fake GPU 1)"]
    assert [r["budget"] for r in info["rows"]] == ["256", "0=100,1=50%", "0", "50%", "100%"]
    with simulated_gpus(2), Program(graph_break, kernels="numpy") as prog:
        for row in info["rows"]:
            prog.set_budget({0: "100", 1: "50%"} if "=" in row["budget"] else row["budget"])
            assert [(e["index"], e["budget"], e["source"]) for e in row["engines"]] == \
                [(w.index, w.budget, w.source) for w in prog.weight_streaming]
            assert row["applied_bytes"] == sum(w.budget for w in prog.weight_streaming)
            assert row["iterations"] == 3 and row["latency_ms"]["min"] <= row["latency_ms"]["max"]
    assert png_size(png) == (int(PLOT_SIZE[0] * PLOT_DPI), int(PLOT_SIZE[1] * PLOT_DPI))


def test_profile_on_simulated_gpus_has_a_track_per_stream(graph_break: Path, tmp_path: Path) -> None:
    trace_path = tmp_path / "trace.json"
    info = json.loads(ok(cli("profile", graph_break, "--kernels", "numpy", "--iters", "2", "--trace", trace_path,
                             "--json", gpus=2)).stdout)
    assert info["clock"] == "host+cuda-events" and info["runs"] == 2
    assert sorted((r["engine"], r["device"], r["calls"]) for r in info["by_delegate"]) == \
        [("forward/delegate0", 0, 2), ("forward/delegate1", 1, 2)]
    assert all(r["device_ms"] is not None for r in info["by_delegate"])
    copies = [r for r in info["instructions"] if r["name"].startswith("et_copy::")]
    assert len(copies) == 4 and all(r["device"] in (0, 1) and r["device_ms"] is not None for r in copies)
    with simulated_gpus(2), Program(graph_break, kernels="numpy") as prog:
        with prog.profile() as prof:
            for _ in range(2):
                prog(np.zeros((3, 8), np.float32))
        assert instructions(info) == instructions(prof.summary())
    trace = json.loads(trace_path.read_text())
    tracks = check_trace(trace)
    device_tracks = sorted(v for v in tracks.values() if v.startswith("cuda:"))
    assert [t.split(" ")[0] for t in device_tracks] == ["cuda:0/stream", "cuda:1/stream"]  # one stream each
    on_device = [e for e in trace["traceEvents"] if e.get("cat") == "device"]
    assert {e["pid"] for e in on_device} == {1, 2}
    assert sum(e["name"].startswith("delegate") for e in on_device) == 4


def test_simulated_gpus_from_the_environment_work_in_python_too(graph_break: Path) -> None:
    """``PYRT_SIMULATED_GPUS=2 python app.py`` runs app.py's Programs on simulated GPUs, as the CLI does."""
    script = ("import numpy as np, pyrt\n"
              f"with pyrt.Program({str(graph_break)!r}, kernels='numpy') as prog:\n"
              "    print(prog(np.ones((2, 8), np.float32)).shape)\n")
    environ = {k: v for k, v in os.environ.items() if k != "PYRT_SIMULATED_GPUS"}
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         env={**environ, "PYRT_SIMULATED_GPUS": "2", "PYTHONPATH": str(ROOT)})
    assert ran.returncode == 0 and ran.stdout.strip() == "(2, 4)", ran.stderr
    for value, hint in (("", "set PYRT_SIMULATED_GPUS=1 before pyrt is imported"),
                        ("two", "PYRT_SIMULATED_GPUS='two' is not a whole number of GPUs")):
        failed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                                env={**environ, "PYRT_SIMULATED_GPUS": value, "PYTHONPATH": str(ROOT)})
        assert failed.returncode == 1 and "DeviceError" in failed.stderr and hint in failed.stderr, failed.stderr
