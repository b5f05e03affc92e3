"""pyrt's hardware check: one run on a GPU machine answers what only hardware can.

Subcommands:

    prepare --assets .gpu                 # here (CPU): ONNX model + TensorRT-RTX engines built on the CPU
    install --assets .gpu --site DIR      # GPU machine: unpack the carried TensorRT-RTX into DIR
    run --assets .gpu --out DIR           # GPU machine: every step, report.json + logs in DIR
    step NAME --assets .gpu --out DIR     # one step (run uses this, one subprocess per step)

Each step runs in its own subprocess under a time limit, so a crash or hang in
TensorRT or the driver costs that step only; its result (or exact error and the
TensorRT log) lands in ``report.json``. ``scripts/gpu_check.sh`` strings
install and run together; docs/hardware.md records what a run found.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import lzma
import os
import resource
import shutil
import subprocess
import sys
import time
import traceback
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

import numpy as np  # noqa: E402
from gpu_models import mlp_onnx, mlp_reference, mlp_weights  # noqa: E402

SMALL = {"layers": 4, "width": 64, "batch": 8, "seed": 1}
BIG = {"layers": 8, "width": 8192, "batch": 64, "seed": 2, "dtype": "float16"}  # 8 x 128 MiB = 1 GiB fp16
MiB = 1 << 20


# -- helpers -------------------------------------------------------------------------------------
class Log:
    """A TensorRT logger that keeps every message (severity, text)."""

    def __init__(self, trt: Any) -> None:
        outer = self
        self.messages: list[tuple[str, str]] = []

        class _L(trt.ILogger):  # type: ignore[misc, name-defined]
            def __init__(self) -> None:
                trt.ILogger.__init__(self)

            def log(self, severity: Any, msg: str) -> None:
                outer.messages.append((str(severity).split(".")[-1], msg))

        self.logger = _L()

    def take(self, limit: int = 20) -> list[str]:
        out = [f"{s}: {m}" for s, m in self.messages[-limit:]]
        self.messages.clear()
        return out


def _bindings(dtype: str, batch: int, width: int) -> list[Any]:
    from pyrt.format.trt_blob import IOBinding

    return [IOBinding("input_0", dtype, (batch, width), True), IOBinding("output_0", dtype, (batch, width), False)]


def _run_engine(engine: Any, cuda: Any, x: np.ndarray) -> np.ndarray:
    """pyrt's TensorRTEngine on real memory: H2D, execute, D2H on one stream."""
    (shape,) = engine.infer_output_shapes([x.shape])
    with cuda.stream(engine.device) as stream:
        src, dst = cuda.alloc(x.nbytes, engine.device), cuda.alloc(int(np.prod(shape)) * x.itemsize, engine.device)
        try:
            cuda.memcpy_htod(src, np.ascontiguousarray(x), stream=stream)
            engine.execute([src.ptr], [dst.ptr], stream.handle)
            out = np.empty(shape, x.dtype)
            cuda.memcpy_dtoh(out, dst, stream=stream)
            stream.synchronize()
        finally:
            src.free()
            dst.free()
    return out


def _rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - want) / max(np.linalg.norm(want), 1e-30))


def _small_input() -> np.ndarray:
    return np.random.default_rng(7).standard_normal((SMALL["batch"], SMALL["width"])).astype(np.float32)


def _small_reference(x: np.ndarray) -> np.ndarray:
    return mlp_reference(x, mlp_weights(SMALL["layers"], SMALL["width"], "float32", SMALL["seed"]))


def _check_small(engine: Any, cuda: Any) -> dict[str, Any]:
    x = _small_input()
    got = _run_engine(engine, cuda, x)
    err = _rel_err(got, _small_reference(x))
    return {"rel_err_vs_float64": err, "correct": bool(np.isfinite(err) and err < 1e-2)}


def _streaming_facts(engine: Any, log: Log) -> dict[str, Any]:
    """Raw TensorRT: streamable size, automatic budget, a 50% budget set and read back."""
    facts: dict[str, Any] = {}
    for name in ("streamable_weights_size", "weight_streaming_scratch_memory_size", "device_memory_size_v2"):
        try:
            facts[name] = int(getattr(engine, name))
        except Exception as exc:
            facts[name] = f"{type(exc).__name__}: {exc}"
    try:
        facts["automatic_budget"] = int(engine.get_weight_streaming_automatic_budget())
    except Exception as exc:
        facts["automatic_budget"] = f"{type(exc).__name__}: {exc}"
    try:
        facts["default_budget_v2"] = int(engine.weight_streaming_budget_v2)
        size = facts.get("streamable_weights_size")
        if isinstance(size, int) and size > 0:
            engine.weight_streaming_budget_v2 = size // 2
            facts["budget_set_half"] = size // 2
            facts["budget_read_back"] = int(engine.weight_streaming_budget_v2)
    except Exception as exc:
        facts["budget_v2"] = f"{type(exc).__name__}: {exc}"
    facts["log"] = log.take()
    return facts


# -- steps ---------------------------------------------------------------------------------------
def step_env(assets: Path, out: Path) -> dict[str, Any]:
    facts: dict[str, Any] = {"python": sys.version.split()[0]}
    with contextlib.suppress(Exception):
        q = "name,driver_version,memory.total,compute_cap,clocks.max.sm"
        facts["nvidia_smi"] = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"],
                                             capture_output=True, text=True, timeout=30).stdout.strip()
    for mod in ("torch", "cuda.bindings", "cupy", "onnx", "numpy", "tensorrt_rtx"):
        try:
            m = __import__(mod, fromlist=["__version__"])
            facts[mod] = getattr(m, "__version__", "?")
        except Exception as exc:
            facts[mod] = f"not importable: {type(exc).__name__}: {exc}"
    import pyrt.cuda

    facts["pyrt_devices"] = [str(d) for d in pyrt.cuda.Cuda().devices()]
    return facts


def step_cuda_seam(assets: Path, out: Path) -> dict[str, Any]:
    """pyrt.cuda on the real driver: copies every way, streams, events, a peer-free D2D."""
    from pyrt.cuda import Cuda

    cuda = Cuda()
    dev = cuda.require_device(0)
    data = np.random.default_rng(0).integers(0, 255, 64 * MiB, dtype=np.uint8)
    a, b = cuda.alloc(data.nbytes, 0), cuda.alloc(data.nbytes, 0)
    back = np.empty_like(data)
    t = {}
    with cuda.stream(0) as s:
        start = time.perf_counter()
        cuda.memcpy_htod(a, data, stream=s)
        cuda.memcpy_dtod(b, a, data.nbytes, stream=s)
        cuda.memcpy_dtoh(back, b, stream=s)
        s.synchronize()
        t["roundtrip_64MiB_s"] = time.perf_counter() - start
        ev = cuda.event(0)
        ev.record(s)
        ev.synchronize()
        ev.close()
    a.free()
    b.free()
    free, total = cuda.mem_info(0)
    return {"device": str(dev), "roundtrip_equal": bool(np.array_equal(back, data)), **t,
            "mem_free": free, "mem_total": total}


def step_interop(assets: Path, out: Path) -> dict[str, Any]:
    """DLPack and __cuda_array_interface__ both ways, with torch CUDA tensors and CuPy arrays."""
    from pyrt.cuda import Cuda
    from pyrt.memory import tensors

    cuda = Cuda()
    res: dict[str, Any] = {}
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    producers: dict[str, Callable[[], Any]] = {}
    with contextlib.suppress(Exception):
        import torch

        producers["torch_dlpack"] = lambda: torch.from_numpy(x).cuda()
        producers["torch_cai"] = lambda: _CaiOnly(torch.from_numpy(x).cuda())
    with contextlib.suppress(Exception):
        import cupy

        producers["cupy_dlpack"] = lambda: _DlpackOnly(cupy.asarray(x))
        producers["cupy_cai"] = lambda: _CaiOnly(cupy.asarray(x))
    for name, make in producers.items():
        try:
            obj = make()
            got = tensors.device_input(obj, f"input {name}")
            back = np.empty_like(x)
            alloc = cuda.borrow(got.ptr, got.nbytes, got.device)
            cuda.memcpy_dtoh(back, alloc)
            res[name] = {"device": got.device, "equal": bool(np.array_equal(back, x)),
                         "kind": type(got).__name__}
        except Exception as exc:
            res[name] = f"{type(exc).__name__}: {exc}"
    # pyrt's own DeviceTensor consumed by torch and CuPy through __cuda_array_interface__
    from pyrt.format.dtypes import ScalarType

    buf = cuda.alloc(x.nbytes, 0)
    cuda.memcpy_htod(buf, x)
    dt = tensors.DeviceTensor(buf, 0, ScalarType.FLOAT, (4, 6), 24)
    with contextlib.suppress(Exception):
        import torch

        res["torch_reads_pyrt"] = bool(np.array_equal(torch.as_tensor(dt, device="cuda").cpu().numpy(), x))
    with contextlib.suppress(Exception):
        import cupy

        res["cupy_reads_pyrt"] = bool(np.array_equal(cupy.asnumpy(cupy.asarray(dt)), x))
    buf.free()
    return res


class _CaiOnly:
    def __init__(self, t: Any) -> None:
        self._t = t
        self.__cuda_array_interface__ = t.__cuda_array_interface__


class _DlpackOnly:
    def __init__(self, t: Any) -> None:
        self._t = t

    def __dlpack__(self, *a: Any, **k: Any) -> Any:
        return self._t.__dlpack__(*a, **k)

    def __dlpack_device__(self) -> Any:
        return self._t.__dlpack_device__()


def step_rtx_import(assets: Path, out: Path) -> dict[str, Any]:
    import tensorrt_rtx as trt

    caps = [n for n in dir(trt.ComputeCapability) if n.isupper() or n.startswith("SM") or n == "CURRENT"]
    log = Log(trt)
    runtime = trt.Runtime(log.logger)
    return {"version": trt.__version__, "compute_capabilities": caps,
            "runtime_created": runtime is not None, "log": log.take()}


def step_rtx_cpu_engine(assets: Path, out: Path) -> dict[str, Any]:
    """Engines built on the CPU with the default targets: does Hopper take them?"""
    import tensorrt_rtx as trt

    from pyrt.cuda import Cuda
    from pyrt.engine import TensorRTEngine

    cuda = Cuda()
    cuda.require_device(0)
    res: dict[str, Any] = {}
    for name in ("mlp_default", "mlp_ws"):
        data = (assets / "assets" / f"{name}.engine").read_bytes()
        log = Log(trt)
        runtime = trt.Runtime(log.logger)
        r: dict[str, Any] = {"bytes": len(data)}
        try:
            engine = runtime.deserialize_cuda_engine(data)
            r["deserialized"] = engine is not None
            r["log"] = log.take()
            if engine is not None:
                r.update(_streaming_facts(engine, log))
                ctx = engine.create_execution_context()
                r["context_created"] = ctx is not None
                r["context_log"] = log.take()
                del ctx, engine
        except Exception as exc:
            r["error"] = f"{type(exc).__name__}: {exc}"
            r["log"] = log.take()
        try:
            with TensorRTEngine.load(memoryview(data), device=0, io_bindings=_bindings("float32", 8, 64), trt=trt,
                                     cuda=cuda, name=name) as eng:
                eng.configure(None, "automatic")
                r["pyrt"] = {"applied_budget": eng.applied_budget, **_check_small(eng, cuda)}
        except Exception as exc:
            r["pyrt"] = f"{type(exc).__name__}: {exc}"
        res[name] = r
    return res


def step_rtx_current(assets: Path, out: Path) -> dict[str, Any]:
    """Build on the GPU for its own compute capability (CURRENT), then run through pyrt."""
    import tensorrt_rtx as trt

    from pyrt.cuda import Cuda
    from pyrt.engine import TensorRTEngine
    from pyrt.export.trt_builder import build_engine_from_onnx

    cuda = Cuda()
    res: dict[str, Any] = {}
    for ws in (False, True):
        key = "mlp_current_ws" if ws else "mlp_current"
        r: dict[str, Any] = {}
        try:
            built = build_engine_from_onnx(assets / "assets" / "mlp.onnx", flavour="tensorrt_rtx",
                                           weight_streaming=ws, compute_capabilities=["current"])
            data = bytes(built.engine)
            (out / f"{key}.engine").write_bytes(data)
            r.update(built_bytes=len(data), build_s=round(built.build_seconds, 3))
        except Exception as exc:
            r["build_error"] = f"{type(exc).__name__}: {exc}"
            res[key] = r
            continue
        log = Log(trt)
        engine = trt.Runtime(log.logger).deserialize_cuda_engine(data)
        r["deserialized"] = engine is not None
        r["log"] = log.take()
        if engine is not None:
            r["raw"] = _streaming_facts(engine, log)
            del engine
        try:
            with TensorRTEngine.load(memoryview(data), device=0, io_bindings=_bindings("float32", 8, 64), trt=trt,
                                     cuda=cuda, name=key) as eng:
                eng.configure(None, "automatic")
                r["pyrt_automatic"] = {"applied": eng.applied_budget, **_check_small(eng, cuda)}
                if eng.streamable_weights_size:
                    for frac in (0.0, 0.5, 1.0):
                        eng.configure(int(eng.streamable_weights_size * frac), "load-time")
                        r[f"pyrt_budget_{frac}"] = {"applied": eng.applied_budget, **_check_small(eng, cuda)}
        except Exception as exc:
            r["pyrt"] = f"{type(exc).__name__}: {exc}"
            r["pyrt_traceback"] = traceback.format_exc(limit=6)
        res[key] = r
    return res


def _working_engine(out: Path, assets: Path) -> tuple[str, bytes] | None:
    for path in (out / "mlp_current.engine", assets / "assets" / "mlp_default.engine"):
        if path.exists():
            return path.name, path.read_bytes()
    return None


def step_host_overhead(assets: Path, out: Path) -> dict[str, Any]:
    """Per-call host time of pyrt's TensorRTEngine.execute against TensorRT's execute_async_v3 alone."""
    import tensorrt_rtx as trt

    from pyrt.cuda import Cuda
    from pyrt.engine import TensorRTEngine

    found = _working_engine(out, assets)
    if found is None:
        return {"skipped": "no engine"}
    name, data = found
    cuda = Cuda()
    n = 5000
    with TensorRTEngine.load(memoryview(data), device=0, io_bindings=_bindings("float32", 8, 64), trt=trt, cuda=cuda,
                             name=name) as eng:
        eng.configure(None, "automatic")
        eng.infer_output_shapes([(8, 64)])
        src, dst = cuda.alloc(8 * 64 * 4, 0), cuda.alloc(8 * 64 * 4, 0)
        with cuda.stream(0) as s:
            eng.execute([src.ptr], [dst.ptr], s.handle)
            s.synchronize()
            ctx = eng._context  # the raw context pyrt drives: the floor for one enqueue
            samples: dict[str, list[float]] = {"raw_execute_async_v3": [], "pyrt_engine_execute": []}
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(n):
                    ctx.execute_async_v3(s.handle)
                s.synchronize()
                samples["raw_execute_async_v3"].append((time.perf_counter() - t0) / n * 1e6)
                t0 = time.perf_counter()
                for _ in range(n):
                    eng.execute([src.ptr], [dst.ptr], s.handle)
                s.synchronize()
                samples["pyrt_engine_execute"].append((time.perf_counter() - t0) / n * 1e6)
        src.free()
        dst.free()
    med = {k: float(np.median(v)) for k, v in samples.items()}
    return {"engine": name, "calls_per_sample": n, "us_per_call_median": med,
            "pyrt_overhead_us": med["pyrt_engine_execute"] - med["raw_execute_async_v3"], "samples_us": samples}


def step_big_build(assets: Path, out: Path) -> dict[str, Any]:
    """A 1 GiB float16 weight-streaming engine, built here for this GPU (weights too big to carry)."""
    from pyrt.export.trt_builder import build_engine_from_onnx

    work = Path("/tmp/pyrt-big")
    work.mkdir(exist_ok=True)
    t0 = time.perf_counter()
    onnx_path = mlp_onnx(work / "big.onnx", external_data=True, **BIG)
    gen_s = time.perf_counter() - t0
    built = build_engine_from_onnx(onnx_path, flavour="tensorrt_rtx", weight_streaming=True,
                                   compute_capabilities=["current"])
    with open(work / "big.engine", "wb") as f:
        f.write(built.engine)
    return {"onnx_gen_s": round(gen_s, 2), "build_s": round(built.build_seconds, 2),
            "engine_bytes": built.engine.nbytes, "weights_bytes": BIG["layers"] * BIG["width"] ** 2 * 2}


def step_big_load_rss(assets: Path, out: Path) -> dict[str, Any]:
    """Peak host RSS while pyrt loads the 1 GiB engine from an mmap (as Program does)."""
    import mmap

    import tensorrt_rtx as trt

    from pyrt.cuda import Cuda
    from pyrt.device.tensorrt_seam import create_runtime  # noqa: F401  (imported before the baseline)
    from pyrt.engine import TensorRTEngine

    path = Path("/tmp/pyrt-big/big.engine")
    cuda = Cuda()
    cuda.require_device(0)
    cuda.context(0)
    size = path.stat().st_size

    def rss_kib() -> tuple[int, int]:
        status = Path("/proc/self/status").read_text().split("\n")
        get = {ln.split(":")[0]: int(ln.split()[1]) for ln in status if ln.startswith(("VmRSS", "VmHWM"))}
        return get["VmRSS"], get["VmHWM"]

    trt.Runtime(Log(trt).logger)  # load TensorRT's libraries before the baseline
    base_rss, base_hwm = rss_kib()
    fd = os.open(path, os.O_RDONLY)
    mm = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    t0 = time.perf_counter()
    eng = TensorRTEngine.load(memoryview(mm), device=0, io_bindings=_bindings("float16", BIG["batch"], BIG["width"]),
                              trt=trt, cuda=cuda, name="big")
    load_s = time.perf_counter() - t0
    rss, hwm = rss_kib()
    eng.configure(0, "load-time")
    rss2, hwm2 = rss_kib()
    streamable = eng.streamable_weights_size
    eng.close()
    return {"engine_bytes": size, "load_s": round(load_s, 2), "baseline_rss": base_rss * 1024,
            "peak_rss_after_load": hwm * 1024, "peak_growth_bytes": (hwm - base_rss) * 1024,
            "peak_growth_over_engine": round((hwm - base_rss) * 1024 / size, 3),
            "peak_growth_after_context": (hwm2 - base_rss) * 1024, "rss_after_context": rss2 * 1024,
            "baseline_hwm": base_hwm * 1024, "streamable_weights_size": streamable}


def step_big_streaming(assets: Path, out: Path) -> dict[str, Any]:
    """Throughput of the 1 GiB engine at 10/25/50/100% of its streamable weights."""
    import tensorrt_rtx as trt

    from pyrt.cuda import Cuda
    from pyrt.engine import TensorRTEngine

    data = memoryview(Path("/tmp/pyrt-big/big.engine").read_bytes())
    cuda = Cuda()
    b, w = BIG["batch"], BIG["width"]
    x = np.random.default_rng(3).standard_normal((b, w)).astype(np.float16)
    rows = []
    with TensorRTEngine.load(data, device=0, io_bindings=_bindings("float16", b, w), trt=trt, cuda=cuda,
                             name="big") as eng:
        streamable = eng.streamable_weights_size
        ref = None
        for frac in (1.0, 0.5, 0.25, 0.1):
            eng.configure(int(streamable * frac), "load-time")
            got = _run_engine(eng, cuda, x)  # warm-up and a correctness check across budgets
            if ref is None:
                ref = got.astype(np.float64)
            err = _rel_err(got, ref)
            src, dst = cuda.alloc(x.nbytes, 0), cuda.alloc(x.nbytes, 0)
            with cuda.stream(0) as s:
                cuda.memcpy_htod(src, x, stream=s)
                eng.infer_output_shapes([x.shape])
                eng.execute([src.ptr], [dst.ptr], s.handle)
                s.synchronize()
                times = []
                for _ in range(3):
                    iters = 10
                    t0 = time.perf_counter()
                    for _ in range(iters):
                        eng.execute([src.ptr], [dst.ptr], s.handle)
                    s.synchronize()
                    times.append((time.perf_counter() - t0) / iters)
            src.free()
            dst.free()
            med = float(np.median(times))
            rows.append({"budget_fraction": frac, "budget_bytes": eng.applied_budget, "ms_per_forward": med * 1e3,
                         "rows_per_s": b / med, "weights_GB_per_s": streamable / med / 1e9,
                         "rel_diff_vs_full_budget": err})
    return {"streamable_weights_size": streamable, "curve": rows}


def step_program(assets: Path, out: Path) -> dict[str, Any]:
    """pyrt.Program end to end on .pte files exported here (CPU-built engines, default targets)."""
    import pyrt

    res: dict[str, Any] = {}
    for pte in sorted((assets / "assets").glob("*.pte")):
        ref = np.load(pte.with_suffix(".npz"))
        x, want = ref["x"], ref["want"]
        r: dict[str, Any] = {}
        try:
            with pyrt.Program(pte) as prog:
                (got,) = prog(x)
                r["numpy_in"] = _rel_err(np.asarray(got), want.astype(np.float64))
                r["weight_streaming"] = [str(w) for w in prog.weight_streaming]
                with contextlib.suppress(ImportError):
                    import torch

                    xt = torch.from_numpy(x).cuda()
                    (gt,) = prog(xt)
                    r["torch_cuda_in"] = {"type": type(gt).__name__, "device": str(getattr(gt, "device", "?")),
                                          "rel_err": _rel_err(gt.cpu().numpy(), want.astype(np.float64))}
                with contextlib.suppress(ImportError):
                    import cupy

                    (gc,) = prog(cupy.asarray(x))
                    r["cupy_in"] = {"type": type(gc).__name__,
                                    "rel_err": _rel_err(cupy.asnumpy(cupy.asarray(gc)), want.astype(np.float64))}
                prog.set_budget("50%")
                (got,) = prog(x)
                r["after_set_budget_50"] = _rel_err(np.asarray(got), want.astype(np.float64))
                n = 2000
                t0 = time.perf_counter()
                for _ in range(n):
                    prog(x)
                r["us_per_forward_numpy_io"] = (time.perf_counter() - t0) / n * 1e6
        except Exception as exc:
            r["error"] = f"{type(exc).__name__}: {exc}"
            r["traceback"] = traceback.format_exc(limit=8)
        res[pte.name] = r
    return res


STEPS: dict[str, tuple[Callable[[Path, Path], dict[str, Any]], int]] = {
    "env": (step_env, 60),
    "cuda_seam": (step_cuda_seam, 60),
    "interop": (step_interop, 90),
    "rtx_import": (step_rtx_import, 60),
    "rtx_cpu_engine": (step_rtx_cpu_engine, 120),
    "rtx_current": (step_rtx_current, 180),
    "program": (step_program, 120),
    "host_overhead": (step_host_overhead, 90),
    "big_build": (step_big_build, 200),
    "big_load_rss": (step_big_load_rss, 90),
    "big_streaming": (step_big_streaming, 120),
}
PYTEST_FILES = ["tests/device/test_cuda_seam.py", "tests/device/test_engine.py", "tests/export/test_trt_builder.py",
                "tests/device/test_gpu_programs.py"]


# -- orchestration --------------------------------------------------------------------------------
def run_step(name: str, assets: Path, out: Path) -> None:
    fn, _ = STEPS[name]
    try:
        result: Any = {"ok": True, **fn(assets, out)}
    except Exception as exc:
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=8)}
    print("RESULT-JSON " + json.dumps(result, default=str), flush=True)


def run_all(assets: Path, out: Path, deadline_s: float, only: list[str] | None) -> int:
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "steps": {}}
    log = open(out / "steps.log", "a")
    names = [n for n in STEPS if not only or n in only] + ([] if only and "pytest" not in only else ["pytest"])
    for name in names:
        left = deadline_s - (time.monotonic() - start)
        limit = 420 if name == "pytest" else STEPS[name][1]
        if left < min(limit, 60):
            report["steps"][name] = {"ok": False, "error": f"not run: {left:.0f} s left of the deadline"}
            continue
        if name == "pytest":
            cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=", "-m", "gpu", "-rA",
                   "--timeout", "240", f"--junitxml={out / 'pytest-gpu.xml'}", *PYTEST_FILES]
        else:
            cmd = [sys.executable, __file__, "step", name, "--assets", str(assets), "--out", str(out)]
        t0 = time.monotonic()
        log.write(f"\n===== {name} =====\n")
        log.flush()
        try:
            env = {**os.environ, "PYRT_PREBUILT_PTE": str((assets / "assets" / "programs").resolve())}
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=min(limit, left), cwd=ROOT, env=env)
            text, rc = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as exc:
            text, rc = f"{exc.stdout or ''}{exc.stderr or ''}TIMEOUT after {exc.timeout:.0f} s", -9
        text = text if isinstance(text, str) else text.decode(errors="replace")
        log.write(text)
        log.flush()
        if name == "pytest":
            tail = [ln for ln in text.splitlines() if ln.startswith(("PASSED", "FAILED", "ERROR", "SKIPPED"))
                    or " passed" in ln or " failed" in ln]
            result: dict[str, Any] = {"ok": rc == 0, "rc": rc, "summary": tail[-80:]}
        else:
            lines = [ln for ln in text.splitlines() if ln.startswith("RESULT-JSON ")]
            result = (json.loads(lines[-1][len("RESULT-JSON "):]) if lines else
                      {"ok": False, "error": f"no result (rc {rc})", "output_tail": text[-3000:]})
        result["seconds"] = round(time.monotonic() - t0, 1)
        report["steps"][name] = result
        (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
        print(f"{name:16s} {'ok ' if result.get('ok') else 'FAIL'} {result['seconds']:6.1f}s", flush=True)
    print(json.dumps(report, indent=1, default=str)[-6000:])
    return 0


def install(assets: Path, site: Path) -> None:
    """Unpack the carried TensorRT-RTX: copy the small files, decompress the two libraries."""
    site.mkdir(parents=True, exist_ok=True)
    shutil.copytree(assets / "site", site, dirs_exist_ok=True)
    for wheel in sorted(assets.glob("*.whl")):
        with zipfile.ZipFile(wheel) as z:
            z.extractall(site)
    for xz in sorted(assets.glob("*.so.1.xz")):
        target = site / "tensorrt_rtx_libs" / xz.name[: -len(".xz")]
        with lzma.open(xz) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, 16 * MiB)
    print("installed into", site, sorted(p.name for p in (site / "tensorrt_rtx_libs").iterdir()))


def prepare(assets: Path) -> None:
    """Here, on the CPU: the small ONNX model and engines built from it with the default targets."""
    from pyrt.export.trt_builder import build_engine_from_onnx

    folder = assets / "assets"
    folder.mkdir(parents=True, exist_ok=True)
    onnx_path = mlp_onnx(folder / "mlp.onnx", **SMALL)
    for name, ws in (("mlp_default", False), ("mlp_ws", True)):
        built = build_engine_from_onnx(onnx_path, flavour="tensorrt_rtx", weight_streaming=ws)
        (folder / f"{name}.engine").write_bytes(built.engine)
        print(name, built.engine.nbytes, "bytes", [(b.name, b.dtype, b.shape) for b in built.inputs + built.outputs])
    _export_program(folder)
    from tests.fixtures import gpu_programs

    print("programs", sorted(p.name for p in gpu_programs.build_all(folder / "programs").values()))
    for n in (1, 16):  # benchmarks/bench_host_overhead.py --gpu --programs .gpu/assets/programs
        gpu_programs.chain_program(folder / "programs" / f"chain{n}.pte", n)
        gpu_programs.chain_program(folder / "programs" / f"chain{n}_device_io.pte", n, device_io=True)


def _export_program(folder: Path) -> None:
    """Two TensorRT-RTX engines around an operator ExecuTorch runs (a graph break), exported with pyrt."""
    import torch

    import pyrt.export

    class TwoEngines(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(64, 128), torch.nn.Linear(128, 32)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(torch.sigmoid(torch.relu(self.a(x))))

    torch.manual_seed(0)
    model = TwoEngines().eval()
    x = torch.randn(8, 64)
    path = folder / "two_engines.pte"
    pyrt.export.to_pte(model, path, (x,), torch_executed_ops=("aten.sigmoid.default",), weight_streaming=True,
                       builder="tensorrt_rtx", progress=False)
    with torch.no_grad():
        want = model(x).double().numpy()
    np.savez(path.with_suffix(".npz"), x=x.numpy(), want=want)
    print(path.name, path.stat().st_size, "bytes")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name in ("prepare", "install", "run", "step"):
        p = sub.add_parser(name)
        if name == "step":
            p.add_argument("name", choices=sorted(STEPS))
        p.add_argument("--assets", type=Path, default=ROOT / ".gpu")
        p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-out")))
        p.add_argument("--site", type=Path, default=Path("/tmp/site"))
        p.add_argument("--deadline", type=float, default=540.0, help="seconds for all steps together")
        p.add_argument("--only", nargs="*", help="run only these steps (and pytest if named)")
    args = parser.parse_args(argv)
    if args.cmd == "prepare":
        prepare(args.assets)
    elif args.cmd == "install":
        install(args.assets, args.site)
    elif args.cmd == "step":
        run_step(args.name, args.assets, args.out)
    else:
        return run_all(args.assets, args.out, args.deadline, args.only)
    return 0


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crashing step must not write a core file
    sys.exit(main())
