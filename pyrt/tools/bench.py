"""Latency and throughput of a Program, optionally across weight-streaming budgets.

With a CUDA device (real or simulated), each run is timed by CUDA events on
the stream pyrt runs the program on (the events bracket the run's device work,
input copies to output copies); without one, by the host clock. Host wall time
is always measured too: throughput is runs per second of wall time.

>>> parse_sweep("25%..100%:25%")
['25%', '50%', '75%', '100%']
>>> parse_sweep("0%..100%:50%")
['0', '50%', '100%']
>>> with pyrt.Program("model.pte") as prog:                             # doctest: +SKIP
...     rows = sweep(prog, [x], budgets=["25%", "100%"], iters=50)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

import pyrt.cuda as cuda_seam
from pyrt.errors import BudgetError, PyrtError
from pyrt.runtime.profile import format_columns
from pyrt.streaming import BudgetSpec, parse_budget
from pyrt.tools.report import format_size

PLOT_SIZE = (8.0, 6.0)  # inches
PLOT_DPI = 100  # -> 800 x 600 pixels


def parse_sweep(text: str) -> list[str]:
    """``START..STOP[:STEP]`` budgets: shares (``10%..100%``, step 10% by default; ``0%`` is 0 bytes)
    or bytes (``64MiB..512MiB:64MiB``, ten even steps by default).
    """
    start_text, sep, rest = text.partition("..")
    stop_text, _, step_text = rest.partition(":")
    if not sep or not start_text or not stop_text:
        raise BudgetError(f"--sweep {text!r}: expected START..STOP[:STEP], e.g. 10%..100% or 64MiB..1GiB:64MiB")
    share = start_text.strip().endswith("%")
    if share != stop_text.strip().endswith("%") or (step_text and share != step_text.strip().endswith("%")):
        raise BudgetError(f"--sweep {text!r}: START, STOP and STEP must all be shares (%) or all bytes")

    def value(part: str) -> Fraction:
        part = part.strip()
        if share:
            try:
                if Fraction(part[:-1].strip()) == 0:
                    return Fraction(0)  # 0%: stream everything (a share must be > 0; 0 bytes says the same)
            except ValueError:
                raise BudgetError(f"--sweep {text!r}: {part!r} is not a percentage") from None
        spec = parse_budget(part, source=f"--sweep {text!r}")
        if spec is None or spec.value is None:
            raise BudgetError(f"--sweep {text!r}: {part!r} is not a share or a byte count")
        return Fraction(spec.value)

    start, stop = value(start_text), value(stop_text)
    if stop < start:
        raise BudgetError(f"--sweep {text!r}: STOP is below START")
    if step_text:
        step = value(step_text)
    else:
        step = Fraction(1, 10) if share else (stop - start) / 9
    if step <= 0:
        raise BudgetError(f"--sweep {text!r}: the step must be positive")
    count = math.floor((stop - start) / step) + 1
    if count > 1000:
        raise BudgetError(f"--sweep {text!r}: {count} budgets; at most 1000")
    points = [start + i * step for i in range(count)]
    if points[-1] != stop:
        points.append(stop)
    return [_budget_text(p, share) for p in points]


def _budget_text(x: Fraction, share: bool) -> str:
    if x == 0:
        return "0"
    if share:
        return str(BudgetSpec("share", x))
    return str(BudgetSpec("bytes", int(x)))


# -- timing -------------------------------------------------------------------------------------------


class _Clock:
    """Times one run: CUDA events on ``stream`` when given, else the host clock."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream
        if stream is not None:
            cuda = stream._cuda  # the seam the stream (and so the program) was made with
            self._start, self._end = cuda.event(stream.device, timing=True), cuda.event(stream.device, timing=True)

    def time(self, fn: Callable[[], Any]) -> tuple[float, float]:
        """(latency ms by this clock, host wall ms) of one call."""
        if self.stream is None:
            t0 = time.perf_counter_ns()
            fn()
            ms = (time.perf_counter_ns() - t0) / 1e6
            return ms, ms
        t0 = time.perf_counter_ns()
        self._start.record(self.stream)
        fn()
        self._end.record(self.stream)
        ms = self._start.elapsed_ms(self._end)  # waits for the end event
        return ms, (time.perf_counter_ns() - t0) / 1e6

    def close(self) -> None:
        if self.stream is not None:
            self._start.close()
            self._end.close()


def gpu_stream(prog: Any) -> Any:
    """A pyrt stream on the program's first CUDA device, or None for a host-only program."""
    devices = sorted({w.device for w in prog.weight_streaming})
    if not devices:
        return None
    return prog.cuda.stream(devices[0])


def device_names(devices: Sequence[int]) -> list[str]:
    """``cuda:0 (NVIDIA H100 ...)`` for each ordinal."""
    infos = {d.index: d for d in cuda_seam.devices()}
    return [f"cuda:{d} ({infos[d].name})" if d in infos else f"cuda:{d}" for d in devices]


def stats(ms: Sequence[float]) -> dict[str, float]:
    """min, p50, p90, p99, max and mean of latencies in ms (linear-interpolated percentiles)."""
    a = np.asarray(ms, dtype=np.float64)
    if a.size == 0:
        return {k: 0.0 for k in ("min", "p50", "p90", "p99", "max", "mean")}
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {"min": float(a.min()), "p50": float(p50), "p90": float(p90), "p99": float(p99), "max": float(a.max()),
            "mean": float(a.mean())}


def measure(run: Callable[[], Any], *, warmup: int = 5, iters: int | None = None, seconds: float | None = None,
            stream: Any = None, progress: Callable[[int], Any] | None = None) -> dict[str, Any]:
    """Run ``run`` ``warmup`` times, then ``iters`` times or for ``seconds`` (default: at least 10 runs and 1 s)."""
    clock = _Clock(stream)
    try:
        for _ in range(warmup):
            run()
        lat: list[float] = []
        host: list[float] = []
        min_iters, min_s = (iters, 0.0) if iters is not None else (1 if seconds is not None else 10, seconds or 1.0)
        t0 = time.perf_counter()
        while True:
            ms, wall = clock.time(run)
            lat.append(ms)
            host.append(wall)
            if progress is not None:
                progress(1)
            done = len(lat) >= min_iters and time.perf_counter() - t0 >= min_s
            if done or (iters is not None and len(lat) >= iters):
                break
        elapsed = time.perf_counter() - t0
    finally:
        clock.close()
    return {"iterations": len(lat), "warmup": warmup, "seconds": elapsed,
            "clock": "host" if stream is None else "cuda-events", "latency_ms": stats(lat),
            "host_latency_ms": stats(host), "throughput_per_s": len(lat) / elapsed if elapsed > 0 else 0.0}


def sweep(prog: Any, inputs: Sequence[Any], *, method: str = "forward", budgets: Sequence[Any] = (None,),
          warmup: int = 5, iters: int | None = None, seconds: float | None = None,
          progress: Callable[[str, int | None], Any] | None = None) -> list[dict[str, Any]]:
    """One :func:`measure` row per budget (``None``: as loaded), with the per-engine budgets read back.

    ``progress(label, total)`` returns a callable advanced once per timed run (e.g. a tqdm bar's update).
    """
    stream = gpu_stream(prog)
    rows = []
    try:
        for b in budgets:
            if b is not None:
                prog.set_budget(b)
            engines = [{"index": w.index, "method": w.method, "delegate": w.delegate_index, "device": w.device,
                        "streamable_bytes": w.streamable_bytes, "budget": w.budget, "source": w.source}
                       for w in prog.weight_streaming]
            bar: Any = progress(f"budget {_label(b)}" if b is not None else method, iters) if progress else None
            try:
                m = measure(lambda: prog.run(*inputs, method=method, stream=stream), warmup=warmup, iters=iters,
                            seconds=seconds, stream=stream, progress=getattr(bar, "update", None))
            finally:
                if hasattr(bar, "close"):
                    bar.close()
            streamable = sum(e["streamable_bytes"] for e in engines)
            applied = sum(e["budget"] or 0 for e in engines)
            plan = getattr(prog, "memory_plan", None)
            rows.append({"budget": _label(b), "engines": engines, "streamable_bytes": streamable,
                         "applied_bytes": applied, **m, "memory": plan.as_dict() if plan is not None else None})
    finally:
        if stream is not None:
            stream.close()
    return rows


def _label(budget: Any) -> str | None:
    """A budget as the command line writes it: ``50%``, ``0=1GiB,1=50%``."""
    if budget is None:
        return None
    if isinstance(budget, Mapping):
        return ",".join(f"{k}={v}" for k, v in budget.items())
    return str(budget)


# -- output ---------------------------------------------------------------------------------------------


def _size(n: int | None) -> str:
    return "-" if n is None else format_size(n)


MEMORY_ITEMS = ("weights_resident", "weights_streamed", "activations", "streaming_scratch", "arenas", "graphs",
                "headroom")


def format_memory(rows: Sequence[dict[str, Any]]) -> str:
    """The memory plan's items per device (rows) for each budget of a sweep (columns), with throughput."""
    head = ["device / item", *(r["budget"] or "as loaded" for r in rows)]
    body = []
    devices = [d["device"] for d in (rows[0].get("memory") or {}).get("devices", [])]
    for k, dev in enumerate(devices):
        for item in MEMORY_ITEMS:
            body.append([f"cuda:{dev} {item.replace('_', ' ')}",
                         *(_size(r["memory"]["devices"][k][item]) for r in rows)])
    body.append(["runs/s", *(f"{r['throughput_per_s']:.1f}" for r in rows)])
    return "\n".join(format_columns(head, body))


def format_rows(rows: Sequence[dict[str, Any]]) -> str:
    """A table: budget, applied per-engine budgets, latency percentiles, throughput."""
    head = ["budget", "applied", "runs", "min ms", "p50 ms", "p90 ms", "p99 ms", "max ms", "runs/s"]
    body = []
    for r in rows:
        lat = r["latency_ms"]
        applied = ", ".join(_size(e["budget"]) for e in r["engines"]) or "-"
        body.append([r["budget"] or "as loaded", applied, str(r["iterations"]),
                     *(f"{lat[k]:.3f}" for k in ("min", "p50", "p90", "p99", "max")),
                     f"{r['throughput_per_s']:.1f}"])
    return "\n".join(format_columns(head, body))


def plot(rows: Sequence[dict[str, Any]], path: str, *, title: str = "") -> None:
    """Throughput and latency (p50 with p90/p99) against budget, as a PNG/SVG/PDF by ``path``'s suffix."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise PyrtError("--plot needs matplotlib: pip install 'pyrt-executorch[plot]'") from None
    streamable = rows[0]["streamable_bytes"] if rows else 0
    if streamable:
        xs = [100.0 * r["applied_bytes"] / streamable for r in rows]
        xlabel = "weight-streaming budget (% of streamable weights, applied)"
    else:
        xs = list(range(len(rows)))
        xlabel = "budget (nothing streams: rows in order)"
    labels = [r["budget"] or "as loaded" for r in rows]
    fig = Figure(figsize=PLOT_SIZE, dpi=PLOT_DPI)
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True)
    top.plot(xs, [r["throughput_per_s"] for r in rows], marker="o")
    top.set_ylabel("throughput (runs/s)")
    for key, style in (("p50", "o-"), ("p90", "s--"), ("p99", "^:")):
        bottom.plot(xs, [r["latency_ms"][key] for r in rows], style, label=key)
    bottom.set_ylabel(f"latency (ms, {rows[0]['clock'] if rows else 'host'})")
    bottom.set_xlabel(xlabel)
    bottom.legend()
    if not streamable:
        bottom.set_xticks(xs, labels)
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.savefig(path, dpi=PLOT_DPI)


def check_plot_support() -> None:
    """PyrtError now, before any benchmarking, when matplotlib is missing."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise PyrtError("--plot needs matplotlib: pip install 'pyrt-executorch[plot]'")


__all__ = ["parse_sweep", "measure", "sweep", "stats", "format_rows", "format_memory", "plot", "check_plot_support",
           "gpu_stream"]
