"""Profile a Program's runs: host time per instruction, device time from CUDA events, a Chrome trace.

>>> with prog.profile() as prof:                 # doctest: +SKIP
...     prog(x)
>>> print(prof.table())                          # doctest: +SKIP
>>> prof.save_trace("trace.json")                # doctest: +SKIP

``table()`` shows time by operator, by delegate and per instruction;
``save_trace`` writes a trace for ui.perfetto.dev or chrome://tracing.
A profiler installs itself on each method's runner with
``MethodRunner.observe`` (wrapped steps swapped in for the duration of the
``with`` block) and removes itself on exit; a Program that is not being
profiled runs its plain steps. Device time: each instruction that works on a
CUDA device (a delegate, an ``et_copy`` op, a kernel on device tensors) gets
timing events recorded before and after it on its device's stream; they are
read at the end of each run (a profiled run synchronises there). In the trace
a device span is placed at the host launch of the first device instruction of
its stream in that run, plus the event time elapsed since: exact for work
ordering, approximate for absolute position. Profiled runs are serialised.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyrt.pte_reader import DelegateCall, KernelCall

Step = Callable[[], None]
_clock = time.perf_counter_ns


@dataclass(frozen=True)
class Site:
    """What the file says about one instruction: where it is, what it runs, on which device."""

    method: str
    chain: int
    pc: int
    kind: str  # KernelCall | DelegateCall | MoveCall | FreeCall
    name: str  # operator ("aten::add.out"), "delegate 0 (forward/delegate0)", "move", "free"
    delegate: int | None = None
    engine: str | None = None  # "forward/delegate0"
    device: int | None = None  # CUDA ordinal of its device work; None: host only


@dataclass
class Span:
    """One execution of one instruction (host ns from ``time.perf_counter_ns``)."""

    site: Site
    run: int
    thread: int
    start: int
    end: int
    device_ms: float | None = None
    device_start: int | None = None  # host-clock ns where the trace places the device span
    stream: int | None = None  # stream handle
    events: tuple[Any, Any] | None = field(default=None, repr=False)


@dataclass(frozen=True)
class RunSpan:
    """One profiled run of a method."""

    index: int
    method: str
    thread: int
    start: int
    end: int


class Profiler:
    """Records every run made while active (``with``); then :meth:`summary`, :meth:`table`, :meth:`trace`.

    Made by ``Program.profile()``: ``runners`` are the program's MethodRunners, ``xplans`` its
    methods as read from the file (name -> ``pyrt.pte_reader.ExecutionPlan``), ``engines`` its
    ``Program.weight_streaming`` list (which device each delegate runs on).
    """

    def __init__(self, runners: Iterable[Any], xplans: Mapping[str, Any], engines: Sequence[Any], *,
                 device_time: bool = True, source: str = "") -> None:
        self.source = source
        self.device_time = device_time
        self.spans: list[Span] = []
        self.runs: list[RunSpan] = []
        self._runners = list(runners)
        self._xplans = dict(xplans)
        self._engines = {(e.method, e.delegate_index): e for e in engines}
        self._pending: list[Span] = []
        self._lock = threading.Lock()
        self._pool: dict[int, list[Any]] = defaultdict(list)  # device -> free timing events
        self._all_events: list[Any] = []
        self._origin = _clock()
        self._active = False

    # -- installing ----------------------------------------------------------------------------
    def __enter__(self) -> Profiler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Install on every method (idempotent)."""
        if not self._active:
            self._active = True
            for r in self._runners:
                r.observe(self)

    def stop(self) -> None:
        """Remove from every method and release the timing events (idempotent)."""
        if self._active:
            self._active = False
            for r in self._runners:
                r.observe(None)
            for e in self._all_events:
                e.close()
            self._all_events.clear()
            self._pool.clear()

    # -- the observer protocol (pyrt.runtime.executor.MethodRunner.observe) -------------------------------
    def wrap(self, runner: Any, chain: int, pc: int, step: Step) -> Step:
        """The step ``step`` of ``runner``'s instruction (chain, pc), timed."""
        site = self._site(runner, chain, pc)
        pending = self._pending
        if site.device is None or not self.device_time or runner.devices is None:
            def timed() -> None:
                t0 = _clock()
                try:
                    step()
                finally:
                    pending.append(Span(site, -1, threading.get_ident(), t0, _clock()))

            return timed
        devices, device, event = runner.devices, site.device, self._event

        def timed_device() -> None:
            stream = devices.stream(device)
            e0 = event(device, devices.cuda)
            e0.record(stream)
            t0 = _clock()
            try:
                step()
            except BaseException:
                pending.append(Span(site, -1, threading.get_ident(), t0, _clock()))
                self._pool[device].append(e0)
                raise
            t1 = _clock()
            e1 = event(device, devices.cuda)
            e1.record(stream)
            pending.append(Span(site, -1, threading.get_ident(), t0, t1, stream=stream.handle, events=(e0, e1)))

        return timed_device

    def run(self, runner: Any, call: Callable[[Sequence[Any], Any], Any], inputs: Sequence[Any],
            stream: Any) -> Any:
        """One run of ``runner``: timed as a whole; device times are read when it ends."""
        with self._lock:
            index = len(self.runs)
            del self._pending[:]
            t0 = _clock()
            try:
                return call(inputs, stream)
            finally:
                t1 = _clock()
                self.runs.append(RunSpan(index, runner.name, threading.get_ident(), t0, t1))
                self._finish(index)

    # -- internals --------------------------------------------------------------------------------
    def _event(self, device: int, cuda: Any) -> Any:
        pool = self._pool[device]
        if pool:
            return pool.pop()
        e = cuda.event(device, timing=True)
        self._all_events.append(e)
        return e

    def _finish(self, index: int) -> None:
        spans, self._pending[:] = list(self._pending), []
        anchors: dict[int, tuple[Any, int]] = {}  # stream -> (its first start event, host ns of that launch)
        failed = False
        for s in spans:
            s.run = index
            if s.events is None:
                continue
            e0, e1 = s.events
            s.events = None
            if not failed:
                try:
                    s.device_ms = e0.elapsed_ms(e1)
                    first, at = anchors.setdefault(s.stream or 0, (e0, s.start))
                    s.device_start = at + round(first.elapsed_ms(e0) * 1e6)
                except Exception:  # a failed run leaves events unrecorded: no device times for it
                    failed = True
                    s.device_ms = s.device_start = None
            self._pool[e0.device].extend((e0, e1))
        self.spans.extend(spans)

    def _site(self, runner: Any, chain: int, pc: int) -> Site:
        name = runner.name
        xplan = self._xplans[name]
        ins = xplan.chains[chain].instructions[pc]
        if isinstance(ins, KernelCall):
            op = xplan.operators[ins.op_index]  # index validated when the program loaded
            return Site(name, chain, pc, ins.kind, op.qualified_name, device=_kernel_device(runner, ins.args))
        if isinstance(ins, DelegateCall):
            e = self._engines.get((name, ins.delegate_index))
            engine = f"{name}/delegate{ins.delegate_index}"
            return Site(name, chain, pc, ins.kind, f"delegate {ins.delegate_index} ({engine})", ins.delegate_index,
                        engine, e.device if e is not None else None)
        return Site(name, chain, pc, ins.kind, {"MoveCall": "move", "FreeCall": "free"}.get(ins.kind, ins.kind))

    # -- results ----------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """JSON-ready: runs, then time by operator, by delegate and per instruction (milliseconds)."""
        run_ms = [(r.end - r.start) / 1e6 for r in self.runs]
        total = sum(run_ms)
        has_device = any(s.device_ms is not None for s in self.spans)

        def rows(key: Callable[[Span], Any], make: Callable[[Any, list[Span]], dict[str, Any]]) -> list[dict]:
            groups: dict[Any, list[Span]] = {}
            for s in self.spans:
                k = key(s)
                if k is not None:
                    groups.setdefault(k, []).append(s)
            out = [{**make(k, g), **_times(g, total)} for k, g in groups.items()]
            return sorted(out, key=lambda r: -r["host_ms"])

        instructions = rows(lambda s: s.site, lambda site, g: {
            "method": site.method, "chain": site.chain, "pc": site.pc, "kind": site.kind, "name": site.name,
            "device": site.device, "delegate": site.delegate})
        instructions.sort(key=lambda r: (r["method"], r["chain"], r["pc"]))
        return {
            "source": self.source,
            "runs": len(self.runs),
            "clock": "host+cuda-events" if has_device else "host",
            "run_ms": _stats(run_ms),
            "by_method": rows(lambda s: s.site.method, lambda m, g: {"method": m}),
            "by_operator": rows(lambda s: (s.site.kind, s.site.name if s.site.kind != "DelegateCall" else "delegate"),
                                lambda k, g: {"kind": k[0], "name": k[1]}),
            "by_delegate": rows(lambda s: s.site.engine, lambda engine, g: {
                "engine": engine, "method": g[0].site.method, "delegate": g[0].site.delegate,
                "device": g[0].site.device}),
            "instructions": instructions,
        }

    def table(self) -> str:
        """The summary as text: totals, then by operator, by delegate, per instruction."""
        info = self.summary()
        r = info["run_ms"]
        lines = [f"{info['runs']} run(s) of {info['source'] or 'the program'}: mean {r['mean']:.3f} ms, "
                 f"min {r['min']:.3f} ms, max {r['max']:.3f} ms (clock: {info['clock']})"]
        dev = info["clock"] != "host"
        head = ["calls", "host ms", "host %"] + (["device ms"] if dev else [])

        def cells(row: dict[str, Any]) -> list[str]:
            c = [str(row["calls"]), f"{row['host_ms']:.3f}", f"{row['host_share'] * 100:.1f}"]
            if dev:
                c.append("-" if row["device_ms"] is None else f"{row['device_ms']:.3f}")
            return c

        lines += ["", "by operator"]
        lines += format_columns(["operator", *head], [[r["name"], *cells(r)] for r in info["by_operator"]])
        if info["by_delegate"]:
            lines += ["", "by delegate"]
            lines += format_columns(["delegate", "device", *head], [
                [r["engine"], "-" if r["device"] is None else f"cuda:{r['device']}", *cells(r)]
                for r in info["by_delegate"]])
        lines += ["", "per instruction"]
        lines += format_columns(["method", "chain", "pc", "instruction", *head], [
            [r["method"], str(r["chain"]), str(r["pc"]), r["name"], *cells(r)] for r in info["instructions"]])
        return "\n".join(lines)

    def trace(self) -> dict[str, Any]:
        """A Chrome trace (JSON object format): the host thread(s), then one track per device stream."""
        events: list[dict[str, Any]] = []
        threads: dict[int, int] = {}
        streams: dict[tuple[int, int], int] = {}
        us = self._us

        def tid(thread: int) -> int:
            if thread not in threads:
                threads[thread] = len(threads) + 1
                events.append(_meta("thread_name", 0, threads[thread], f"host thread {len(threads)}"))
            return threads[thread]

        events.append(_meta("process_name", 0, 0, "pyrt host"))
        events.append({"ph": "M", "name": "process_sort_index", "pid": 0, "tid": 0, "args": {"sort_index": 0}})
        for r in self.runs:
            events.append({"ph": "X", "name": f"run {r.method}", "cat": "run", "pid": 0, "tid": tid(r.thread),
                           "ts": us(r.start), "dur": _dur(r.start, r.end), "args": {"run": r.index}})
        for s in self.spans:
            args = {"method": s.site.method, "chain": s.site.chain, "pc": s.site.pc, "run": s.run}
            if s.site.device is not None:
                args["device"] = f"cuda:{s.site.device}"
            events.append({"ph": "X", "name": s.site.name, "cat": s.site.kind, "pid": 0, "tid": tid(s.thread),
                           "ts": us(s.start), "dur": _dur(s.start, s.end), "args": args})
            if s.device_ms is None or s.device_start is None or s.site.device is None:
                continue
            pid = 1 + s.site.device
            key = (s.site.device, s.stream or 0)
            if key not in streams:
                streams[key] = sum(1 for k in streams if k[0] == s.site.device) + 1
                if streams[key] == 1:
                    events.append(_meta("process_name", pid, 0, f"cuda:{s.site.device}"))
                    events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                                   "args": {"sort_index": pid}})
                events.append(_meta("thread_name", pid, streams[key], f"stream {key[1]:#x}"))
            events.append({"ph": "X", "name": s.site.name, "cat": "device", "pid": pid, "tid": streams[key],
                           "ts": us(s.device_start), "dur": round(s.device_ms * 1000, 3), "args": args})
        return {"traceEvents": events, "displayTimeUnit": "ms",
                "otherData": {"source": self.source, "runs": len(self.runs), "clock": self.summary()["clock"]}}

    def save_trace(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`trace` as JSON (load it in ui.perfetto.dev or chrome://tracing)."""
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(self.trace(), fh)

    def _us(self, ns: int) -> float:
        return round((ns - self._origin) / 1000, 3)


def _kernel_device(runner: Any, args: Sequence[int]) -> int | None:
    """The CUDA device a kernel's tensors live on (et_copy ops: the device side), else None."""
    infos = getattr(getattr(runner.plan, "table", None), "infos", {})
    for a in args:
        info = infos.get(a)
        if info is not None and getattr(info, "device", None) is not None:
            return int(info.device)
    return None


def _times(spans: list[Span], total_ms: float) -> dict[str, Any]:
    host = sum(s.end - s.start for s in spans) / 1e6
    device = [s.device_ms for s in spans if s.device_ms is not None]
    return {"calls": len(spans), "host_ms": host, "host_ms_mean": host / len(spans),
            "host_share": host / total_ms if total_ms else 0.0,
            "device_ms": sum(device) if device else None}


def _stats(ms: list[float]) -> dict[str, float]:
    if not ms:
        return {"count": 0, "total": 0.0, "mean": 0.0, "min": 0.0, "max": 0.0}
    return {"count": len(ms), "total": sum(ms), "mean": sum(ms) / len(ms), "min": min(ms), "max": max(ms)}


def _meta(kind: str, pid: int, tid: int, name: str) -> dict[str, Any]:
    return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": {"name": name}}


def _dur(start: int, end: int) -> float:
    return round(max(end - start, 0) / 1000, 3)


def format_columns(head: list[str], body: list[list[str]]) -> list[str]:
    """Left-aligned first columns, right-aligned numbers."""
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
    numeric = [i for i in range(len(head)) if body and all(_numberish(r[i]) for r in body)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in numeric else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    return ["  " + line(head), *("  " + line(r) for r in body)]


def _numberish(text: str) -> bool:
    return text == "-" or text.replace(".", "", 1).isdigit()


__all__ = ["Profiler", "Site", "Span", "RunSpan"]
