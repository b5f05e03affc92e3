"""Layer-group engines: the runtime's own cost per extra engine per decode step (issue 43 item 6, goal <= 50 us).

One random Llama of ``--layers`` layers (hidden 64, ``archs.causal_lm``), exported with reference engines twice:
as one engine and cut into one engine per layer (``max_engine_size`` a little over one layer's weights; the head
a group of its own), so the two files differ only in the number of engines (``layers + 1`` against 1). Each is
loaded on one simulated GPU and decodes ``--new-tokens`` greedy tokens of one prompt with ``pyrt.generate``;
the per-step time is the median over ``--samples`` calls of (call time - prefill) / decode steps, alternating the
files. The difference over the extra engines is what each engine costs a decode step, split by ``cProfile`` into
the simulated GPU's own work (``pyrt/sim``: the fake TensorRT and CUDA computing the engine's results on the CPU,
with the torch and numpy calls it makes) and the rest: pyrt's runtime around the engines (bindings, launches,
events, the plan's steps). A second figure needs no profiler: timers around the fake TensorRT's launches and the
work they queue (:class:`EngineClock`) take the engines' own time out of each call, and the rest's difference over
the extra launches is the cost of one (the fake CUDA calls pyrt makes stay in it: an upper bound). Threads pinned
to 1.

    python benchmarks/bench_group_step.py [--layers 16] [--new-tokens 48] [--samples 9] [--no-write]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import _common  # noqa: E402

sys.path.insert(0, str(_common.ROOT))
SEQ = 64
PROMPT = [5, 6, 7, 8, 9]


def export(folder: Path, layers: int) -> tuple[Path, Path]:
    import torch

    from pyrt.export import decoder_to_pte
    from pyrt.export._graph.layer_groups import EngineSizeWarning
    from pyrt.testing import archs

    torch.set_num_threads(1)
    model = archs.causal_lm("llama", layers=layers)
    layer = sum(p.numel() * p.element_size() for p in model.model.layers[0].parameters())
    one, many = folder / "one.pte", folder / "groups.pte"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EngineSizeWarning)
        decoder_to_pte(model, one, max_seq_len=SEQ, builder="reference", route="pyrt", progress=False,
                       max_engine_size=1 << 40)
        decoder_to_pte(model, many, max_seq_len=SEQ, builder="reference", route="pyrt", progress=False,
                       max_engine_size=layer + layer // 4)
    return one, many


def step_times(prog: object, new_tokens: int, samples: int) -> list[float]:
    """Per decode step seconds of each sample (prefill taken out with its measured TTFT)."""
    import pyrt

    out = []
    for _ in range(samples):
        t0 = time.perf_counter()
        result = pyrt.generate(prog, PROMPT, max_new_tokens=new_tokens, eos_ids=[])
        total = time.perf_counter() - t0
        out.append((total - result.timings.ttft_ms / 1e3) / (new_tokens - 1))
    return out


class EngineClock:
    """The seconds the simulated GPU spends on engines (the fake TensorRT's ``execute_async_v3`` and the work it
    queues, run when a stream is waited for) and how many launches, from timers put around those two for the
    benchmark's run. What is left of a call's time is pyrt's runtime plus the fake CUDA calls it makes (copies,
    events, syncs): an upper bound on pyrt's own cost, with no profiler's overhead in it."""

    def __init__(self) -> None:
        self.seconds, self.launches = 0.0, 0

    def __enter__(self) -> EngineClock:
        from pyrt.sim.fake_cuda.queue import QueueDriver
        from pyrt.sim.fake_tensorrt.engine import FakeExecutionContext

        clock, launch, execute = self, QueueDriver.launch, FakeExecutionContext.execute_async_v3
        self._restore = [(QueueDriver, "launch", launch), (FakeExecutionContext, "execute_async_v3", execute)]

        def timed_work(work: Any) -> Any:
            def run() -> Any:
                t0 = time.perf_counter()
                try:
                    return work()
                finally:
                    clock.seconds += time.perf_counter() - t0
            return run

        def timed_launch(driver: Any, stream: int, work: Any, what: str) -> bool:
            return launch(driver, stream, timed_work(work), what)

        def timed_execute(context: Any, stream: int) -> bool:
            t0 = time.perf_counter()
            try:
                return execute(context, stream)
            finally:
                clock.seconds += time.perf_counter() - t0
                clock.launches += 1

        QueueDriver.launch = timed_launch  # type: ignore[method-assign,assignment]
        FakeExecutionContext.execute_async_v3 = timed_execute  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, original in self._restore:
            setattr(owner, name, original)


def host_times(prog: object, new_tokens: int, samples: int) -> list[tuple[float, int]]:
    """(seconds outside the engines, engine launches) of each of ``samples`` generate calls (:class:`EngineClock`)."""
    import pyrt

    out = []
    for _ in range(samples):
        with EngineClock() as clock:
            t0 = time.perf_counter()
            pyrt.generate(prog, PROMPT, max_new_tokens=new_tokens, eos_ids=[])
            total = time.perf_counter() - t0
        out.append((total - clock.seconds, clock.launches))
    return out


def sim_share(prog: object, new_tokens: int) -> float:
    """The share of a generate call's time that is the simulated GPU's work (cProfile).

    Own time of functions in ``pyrt/sim`` counts as the GPU's, and so does the own time of what they call outside
    pyrt (torch operators, numpy, builtins computing an engine's results): a function outside pyrt is charged to
    its callers in proportion to the time each spent in it, up the call graph to the first pyrt function.
    """
    import pyrt

    profile = cProfile.Profile()
    profile.runcall(pyrt.generate, prog, PROMPT, max_new_tokens=new_tokens, eos_ids=[])
    sim, total = _sim_time(pstats.Stats(profile).stats)  # type: ignore[attr-defined]
    return sim / total if total else 0.0


def _owner(file: str) -> str | None:
    if f"{os.sep}pyrt{os.sep}sim{os.sep}" in file:
        return "sim"
    return "pyrt" if f"{os.sep}pyrt{os.sep}" in file else None


def _sim_time(stats: dict[Any, Any]) -> tuple[float, float]:
    """(seconds charged to pyrt/sim, all seconds) of a profile's ``stats``."""
    share: dict[Any, float] = {}

    def sim_part(func: Any, seen: frozenset[Any] = frozenset()) -> float:
        """How much of the time spent in ``func`` was spent for pyrt/sim (0..1)."""
        owner = _owner(func[0])
        if owner is not None:
            return 1.0 if owner == "sim" else 0.0
        if func in share:
            return share[func]
        callers = {c: v for c, v in stats.get(func, (0, 0, 0, 0, {}))[4].items() if c not in seen and c != func}
        weight = sum(v[3] for v in callers.values())
        part = sum(v[3] * sim_part(c, seen | {func}) for c, v in callers.items()) / weight if weight else 0.0
        share[func] = part
        return part

    sim = total = 0.0
    for func, (_, _, own, _, callers) in stats.items():
        total += own
        if _owner(func[0]) is not None:
            sim += own if _owner(func[0]) == "sim" else 0.0
            continue
        for caller, (_, _, edge_own, _) in callers.items():
            sim += edge_own * (sim_part(caller) if caller != func else 0.0)
    return sim, total


def engines_of(path: Path) -> int:
    from pyrt.pte_reader import PteFile

    plan = PteFile.open(path).program.method("forward")
    return sum(type(i).__name__ == "DelegateCall" for c in plan.chains for i in c.instructions)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--samples", type=int, default=9)
    ap.add_argument("--no-write", action="store_true", help="do not update benchmarks/RESULTS.md")
    args = ap.parse_args()

    import pyrt
    from pyrt.sim import simulated_gpus

    with tempfile.TemporaryDirectory() as tmp:
        paths = export(Path(tmp), args.layers)
        counts = [engines_of(p) for p in paths]
        times: dict[Path, list[float]] = {p: [] for p in paths}
        shares = {}
        with simulated_gpus(1):
            progs = {p: pyrt.Program(p) for p in paths}
            for p in paths:  # warm: first-use imports and allocations out of the timing
                step_times(progs[p], 4, 1)
            hosts: dict[Path, list[tuple[float, int]]] = {p: [] for p in paths}
            for _ in range(args.samples):  # alternating the files
                for p in paths:
                    times[p] += step_times(progs[p], args.new_tokens, 1)
                    hosts[p] += host_times(progs[p], args.new_tokens, 1)
            for p in paths:
                shares[p] = sim_share(progs[p], args.new_tokens)
            for prog in progs.values():
                prog.close()
    one, many = (statistics.median(times[p]) for p in paths)
    extra = counts[1] - counts[0]
    per_engine = (many - one) / extra
    sim_part = (many * shares[paths[1]] - one * shares[paths[0]]) / extra
    own = per_engine - sim_part
    (host_one, launches_one), (host_many, launches_many) = (
        (statistics.median(h for h, _ in hosts[p]), hosts[p][0][1]) for p in paths)
    timed = (host_many - host_one) / (launches_many - launches_one)
    head = ["file", "engines", "decode step (median)", "of it in pyrt/sim"]
    body = [[name, str(n), f"{t * 1e6:,.1f} us", f"{shares[p] * 100:.0f}%"]
            for name, n, t, p in (("one engine", counts[0], one, paths[0]),
                                  ("one engine per layer", counts[1], many, paths[1]))]
    text = (f"Command: `{_common.command_line()}` ({_common.machine()}; a {args.layers}-layer random Llama, hidden "
            f"64, reference engines, one simulated GPU, {args.new_tokens} greedy tokens of a {len(PROMPT)}-token "
            f"prompt, medians of {args.samples} alternating calls, threads pinned to 1)\n\n"
            + _common.markdown_table(head, body)
            + f"\n\nPer extra engine per decode step: {per_engine * 1e6:.1f} us in all, of which {sim_part * 1e6:.1f}"
            f" us the simulated GPU's own work and **{own * 1e6:.1f} us pyrt's runtime** around the engine "
            f"(goal <= 50 us: {'met' if own <= 50e-6 else 'NOT met'}).\n\n"
            f"Timed around the engines instead (no profiler; :class:`EngineClock`), medians of {args.samples} calls "
            f"each: {host_one * 1e3:.2f} ms outside the engines per call with {launches_one} launches, "
            f"{host_many * 1e3:.2f} ms with {launches_many}: **{timed * 1e6:.1f} us per extra engine launch** "
            f"(pyrt's runtime and the fake CUDA calls it makes; goal <= 50 us: "
            f"{'met' if timed <= 50e-6 else 'NOT met'}).\n")
    print(text)
    if not args.no_write:
        _common.write_results("bench_group_step", "Layer-group engines: cost per extra engine per decode step",
                              text)


if __name__ == "__main__":
    main()
