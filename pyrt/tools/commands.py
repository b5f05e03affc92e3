"""The ``pyrt`` subcommands inspect, run, bench and profile and the steps they share: reading inputs,
opening the program, printing results. Each takes the parsed arguments (:mod:`pyrt.tools.cli_args`)
and returns the exit status; :data:`COMMANDS` maps names to them. ``bench --generate`` calls
:mod:`pyrt.llm`; ``generate`` is :func:`pyrt.tools.generate_command.run`, ``serve``
:func:`pyrt.serve.command.run`, ``export`` :func:`pyrt.tools.export_command.run` (each imported by
:mod:`pyrt.tools.cli` only for its own command).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from pyrt.format.method_io import flatten, method_inputs
from pyrt.llm.gen_bench import format_generation_rows, generation_sweep, host_to_device_bandwidth, plot_generation
from pyrt.pte_reader import PteFile
from pyrt.runtime.program import Program
from pyrt.tools.bench import (
    check_plot_support,
    device_names,
    format_memory,
    format_rows,
    parse_sweep,
    plot,
    sweep,
)
from pyrt.tools.draw import to_dot, write_graph
from pyrt.tools.generate_command import open_program
from pyrt.tools.inputs import assemble, load_files, parse_shapes, summarize
from pyrt.tools.report import format_report, format_size, inspect
from pyrt.tools.terminal import EXIT_OK, progress_bar, say


def _inputs(args: argparse.Namespace, *, random_default: bool) -> tuple[list[Any], list[dict[str, Any]]]:
    """Positional inputs for ``args.method`` and a description of each (position, kind, origin)."""
    with PteFile.open(args.path) as pte:
        specs = method_inputs(pte, args.method)
    given = load_files(specs, args.input, method=args.method)
    shapes = parse_shapes(args.shape, specs, args.method)
    origins: dict[int, str] = {}
    random = args.random or (random_default and not args.input)
    values = assemble(specs, given, method=args.method, random=random, seed=args.seed, shapes=shapes,
                      origins=origins)
    described = []
    for spec, x in zip(specs, values, strict=True):
        item: dict[str, Any] = {"position": spec.position, "kind": spec.kind, "origin": origins[spec.position]}
        if spec.kind == "Tensor":
            item.update(dtype=spec.dtype, shape=list(x.shape), declared=list(spec.shape), dynamic=spec.dynamic)
        else:
            item["value"] = x
        if origins[spec.position] == "random":
            item["seed"] = args.seed
        described.append(item)
    return values, described


def _engines(prog: Any) -> list[dict[str, Any]]:
    return [dataclasses.asdict(w) for w in prog.weight_streaming]


def _describe_inputs(items: list[dict[str, Any]]) -> list[str]:
    lines = []
    for it in items:
        what = f"{it['dtype']}{it['shape']}" if it["kind"] == "Tensor" else f"{it['kind']} {it.get('value')!r}"
        origin = it["origin"] + (f" (seed {it['seed']})" if "seed" in it else "")
        lines.append(f"  {it['position']}  {what}  {origin}")
    return lines


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def _cmd_inspect(args: argparse.Namespace) -> int:
    info = inspect(args.path, data=args.data)
    if args.graph:
        with PteFile.open(args.path) as pte:
            text = to_dot(pte)
        written, note = write_graph(text, args.graph)
        if note:
            say("warning", note)
        print(f"pyrt: wrote {written}", file=sys.stderr)
    if args.memory or args.gpu_memory is not None:
        with Program(args.path, data=args.data, budget=0, device_map=dict(args.device_map) or None,
                     trt=args.trt, headroom=args.headroom) as prog:
            plan = prog.plan_memory(gpu_memory=args.gpu_memory)
            profiles = {k: v for k, v in prog.optimization_profiles.items() if len(v) > 1}
        if args.json:
            _print_json({**info, "memory_plan": plan.as_dict(), "profiles": profiles})
            return EXIT_OK
        print(format_report(info))
        where = f"GPUs of {args.gpu_memory}" if args.gpu_memory is not None else "the GPUs present"
        print(f"\nmemory plan (budget=\"fit\") on {where}\n{plan.table()}\n{plan.explain()}")
        for name, ranges in profiles.items():
            print(f"{name}: optimization profiles " + "; ".join(
                f"{p}: " + ", ".join(f"{n} {lo}..{hi}" for n, (lo, hi) in r.items()) for p, r in enumerate(ranges)))
        return EXIT_OK
    print(json.dumps(info, indent=2) if args.json else format_report(info))
    return EXIT_OK


def _cmd_run(args: argparse.Namespace) -> int:
    import numpy as np

    values, described = _inputs(args, random_default=False)
    with open_program(args, args.budget) as prog:
        t0 = time.perf_counter()
        result = prog.run(*values, method=args.method)
        seconds = time.perf_counter() - t0
        engines = _engines(prog)
        kernels = prog.kernels
    outputs = flatten(result)
    info = {"source": args.path, "method": args.method, "kernels": kernels, "seconds": seconds,
            "inputs": described, "outputs": [{"position": i, **summarize(x)} for i, x in enumerate(outputs)],
            "weight_streaming": engines}
    if args.save:
        arrays: dict[str, Any] = {f"input{i}": np.asarray(v) for i, v in enumerate(values) if v is not None}
        arrays.update({f"output{i}": np.asarray(x) for i, x in enumerate(outputs) if x is not None})
        np.savez(args.save, **arrays)
        print(f"pyrt: wrote {args.save}", file=sys.stderr)
    if args.json:
        _print_json(info)
        return EXIT_OK
    lines = [f"{args.path}: method {args.method!r} ran in {seconds * 1000:.3f} ms (kernels: {kernels})", "inputs"]
    lines += _describe_inputs(described) or ["  (none)"]
    lines.append("outputs")
    for o in info["outputs"]:
        if o["kind"] != "Tensor":
            lines.append(f"  {o['position']}  {o['kind']} {o['value']!r}")
            continue
        head = f"  {o['position']}  {o['dtype']}{o['shape']}"
        if o["min"] is None:
            lines.append(head + ("  (empty)" if not o["nan"] + o["inf"] else ""))
        else:
            lines.append(f"{head}  min {o['min']:.6g}  max {o['max']:.6g}  mean {o['mean']:.6g}  std {o['std']:.6g}")
        if o["nan"] or o["inf"]:
            lines.append(f"     nan {o['nan']}  inf {o['inf']}")
    lines += _describe_engines(engines)
    print("\n".join(lines))
    return EXIT_OK


def _describe_engines(engines: list[dict[str, Any]]) -> list[str]:
    if not engines:
        return []

    lines = ["weight streaming"]
    for e in engines:
        budget = "-" if e["budget"] is None else format_size(e["budget"])
        lines.append(f"  engine {e['index']} ({e['method']}/delegate{e['delegate_index']}, cuda:{e['device']}): "
                     f"budget {budget} of {format_size(e['streamable_bytes'])} streamable ({e['source']})")
    return lines


def _cmd_bench(args: argparse.Namespace) -> int:
    if args.generate:
        return _bench_generation(args)
    budgets: list[Any] = list(args.budget) + (parse_sweep(args.sweep) if args.sweep else [])
    if args.plot:
        check_plot_support()
    values, described = _inputs(args, random_default=True)
    with open_program(args) as prog:
        devices = sorted({w.device for w in prog.weight_streaming})
        rows = sweep(prog, values, method=args.method, budgets=budgets or [None], warmup=args.warmup,
                     iters=args.iters, seconds=args.seconds, progress=progress_bar(not args.no_progress))
    clock = rows[0]["clock"]
    where = (f"CUDA events on {device_names(devices)[0]}" if clock == "cuda-events"
             else "host clock (the program does no GPU work)")
    info = {"source": args.path, "method": args.method, "clock": clock, "devices": device_names(devices),
            "inputs": described, "rows": rows}
    if args.plot:
        plot(rows, args.plot, title=f"{os.path.basename(args.path)} ({args.method})")
        print(f"pyrt: wrote {args.plot}", file=sys.stderr)
    if args.json:
        _print_json(info)
        return EXIT_OK
    print(f"{args.path}: method {args.method!r}, {rows[0]['warmup']} warm-up run(s) per row; timed by {where}")
    print(format_rows(rows))
    if any((r.get("memory") or {}).get("devices") for r in rows):
        print("\nGPU memory per budget (pyrt.Program.memory_plan)")
        print(format_memory(rows))
    return EXIT_OK


def _cmd_profile(args: argparse.Namespace) -> int:
    values, described = _inputs(args, random_default=True)
    with open_program(args, args.budget) as prog:
        for _ in range(args.warmup):
            prog.run(*values, method=args.method)
        with prog.profile(device_time=not args.no_device_time) as prof:
            for _ in range(args.iters):
                prog.run(*values, method=args.method)
        if args.trace:
            prof.save_trace(args.trace)
            print(f"pyrt: wrote {args.trace}", file=sys.stderr)
        summary = prof.summary()
        text = prof.table()
    if args.json:
        _print_json({**summary, "method": args.method, "inputs": described})
    else:
        print(text)
    return EXIT_OK


def _bench_generation(args: argparse.Namespace) -> int:
    """``bench --generate``: prefill ms and decode tokens/s per budget and batch size, beside the link's bound."""
    budgets: list[Any] = list(args.budget) + (parse_sweep(args.sweep) if args.sweep else [])
    if args.plot:
        check_plot_support()
    with Program(args.path, data=args.data, device_map=dict(args.device_map) or None, trt=args.trt,
                 kernels=args.kernels) as prog:
        bandwidth, how = (args.bandwidth * 1e9, "given") if args.bandwidth else (None, "")
        if bandwidth is None and any(w.streamable_bytes for w in prog.weight_streaming):
            bandwidth, how = host_to_device_bandwidth()
        rows = generation_sweep(prog, budgets=budgets or [None], batches=args.batch or [1],
                                prompt_len=args.prompt_len, new_tokens=args.new_tokens, iters=args.iters or 3,
                                warmup=min(args.warmup, 1), seed=args.seed, method=args.method, bandwidth=bandwidth)
    if args.plot:
        plot_generation(rows, args.plot, title=f"{os.path.basename(args.path)}: decode tokens/s per budget")
        print(f"pyrt: wrote {args.plot}", file=sys.stderr)
    if args.json:
        print(json.dumps({"source": args.path, "method": args.method, "bandwidth": bandwidth,
                          "bandwidth_how": how, "rows": rows}, indent=2))
        return EXIT_OK
    print(f"{args.path}: {args.prompt_len}-token prompts, {args.new_tokens} new tokens, median of "
          f"{rows[0]['generations']} round(s) of greedy generations per row (host clock)")
    if bandwidth:
        print(f"host-to-device bandwidth BW = {bandwidth / 1e9:.1f} GB/s ({how}); S = bytes a step streams")
    print(format_generation_rows(rows))
    return EXIT_OK


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "inspect": _cmd_inspect, "run": _cmd_run, "bench": _cmd_bench, "profile": _cmd_profile,
}
