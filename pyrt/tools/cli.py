"""The ``pyrt`` command line: inspect, run, bench and profile .pte programs.

    pyrt inspect model.pte [--json] [--graph model.svg] [--data model.ptd]
    pyrt inspect model.ptd                    # a data file's entries
    pyrt run model.pte --random --seed 0 [--save out.npz] [--json]
    pyrt bench model.pte --sweep 10%..100% --plot curve.png
    pyrt profile model.pte --trace trace.json

Exit status: 0 ok; 2 the command line does not parse (argparse's usage
errors); 1 a value is wrong for the file or running failed (the typed pyrt
error's message, no traceback unless ``--debug``); 130 interrupted; 141 the
reader of stdout went away (``pyrt inspect --json m.pte | head``). Results go
to stdout, messages and progress bars to stderr (colour only on a terminal
and never with ``NO_COLOR`` set). ``PYRT_SIMULATED_GPUS=n`` runs the command
on ``n`` simulated GPUs (:func:`pyrt.testing.simulated_gpus`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import time
import traceback
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, TextIO

from pyrt._version import __version__
from pyrt.errors import PyrtError
from pyrt.logs import configure as configure_logging
from pyrt.logs import reset as reset_logging
from pyrt.pte_reader import PteFile
from pyrt.runtime.program import Program
from pyrt.testing import simulated_gpus
from pyrt.tools.bench import check_plot_support, device_names, format_rows, parse_sweep, plot, sweep
from pyrt.tools.draw import to_dot, write_graph
from pyrt.tools.inputs import assemble, flatten, load_files, method_inputs, parse_shape_arg, parse_shapes, summarize
from pyrt.tools.report import _size, format_report, inspect

SIMULATED_GPUS_ENV = "PYRT_SIMULATED_GPUS"
EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_PIPE = 0, 1, 2, 130, 141

_EXAMPLES = {
    "pyrt": """examples:
  pyrt inspect model.pte                        readable report of the file
  pyrt run model.pte --random                   run once on random inputs
  pyrt bench model.pte --sweep 10%..100%        latency at ten weight-streaming budgets
  pyrt profile model.pte --trace trace.json     time per operator and delegate, and a trace

environment:
  PYRT_SIMULATED_GPUS=n   run on n simulated GPUs (pyrt.testing; reference engines only)
  PYRT_KERNELS=numpy      run non-delegated operators with pyrt's numpy kernels
  PYRT_LOG=debug          pyrt's log level (debug, info, warning, error; -v is debug)
  NO_COLOR=1              no colour on a terminal either""",
    "inspect": """examples:
  pyrt inspect model.pte
  pyrt inspect --json model.pte | jq '.methods[0].delegates'
  pyrt inspect model.pte --graph model.svg      SVG with Graphviz, else model.dot""",
    "run": """examples:
  pyrt run model.pte --random --seed 1
  pyrt run model.pte --input 0=x.npy --input 1=mask.npy --save out.npz
  pyrt run model.pte --input inputs.npz --json
  pyrt run model.pte --random --shape 0=4,3,224,224 --budget 50%
  PYRT_SIMULATED_GPUS=2 pyrt run model.pte --random --device-map cuda:0=cuda:1""",
    "bench": """examples:
  pyrt bench model.pte                           random inputs, >= 10 runs and >= 1 s
  pyrt bench model.pte --iters 200 --warmup 20 --json
  pyrt bench model.pte --budget 25% --budget 50% --budget 1GiB
  pyrt bench model.pte --sweep 10%..100% --plot curve.png
  pyrt bench model.pte --sweep 256MiB..2GiB:256MiB --seconds 3""",
    "profile": """examples:
  pyrt profile model.pte                         10 profiled runs on random inputs
  pyrt profile model.pte --iters 50 --trace trace.json   (open in ui.perfetto.dev)
  pyrt profile model.pte --input 0=x.npy --json""",
}


# -- parsing --------------------------------------------------------------------------------------


def _kv(text: str) -> tuple[Any, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key or not value:
        raise argparse.ArgumentTypeError(f"expected FROM=TO (e.g. cuda:0=cuda:1), got {text!r}")
    return (int(key) if key.isdigit() else key), (int(value) if value.isdigit() else value)


def _shape(text: str) -> tuple[str, tuple[int, ...]]:
    try:
        return parse_shape_arg(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _budget(text: str) -> Any:
    """``50%`` stays text (pyrt.streaming parses it); ``0=1GiB,1=50%`` -> {0: "1GiB", 1: "50%"}."""
    if "=" not in text:
        return text
    out: dict[int, str] = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        if not key.strip().isdigit() or not value.strip():
            raise argparse.ArgumentTypeError(f"expected ENGINE=BUDGET[,ENGINE=BUDGET...], got {text!r}")
        out[int(key)] = value.strip()
    return out


def _count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return n


def _positive(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        x = -1.0
    if not x > 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return x


def _parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the traceback of an error")
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="show pyrt's debug log and third-party messages (as PYRT_LOG=debug)")
    load = argparse.ArgumentParser(add_help=False)
    load.add_argument("path", help="the .pte file")
    load.add_argument("--data", action="append", metavar="PTD", help="a .ptd file of external weights (repeatable)")
    load.add_argument("--method", default="forward", help="method to run (default: forward)")
    load.add_argument("--device-map", action="append", type=_kv, default=[], metavar="FROM=TO",
                      help="move engines off the device the file names, e.g. cuda:0=cuda:1 (repeatable)")
    load.add_argument("--kernels", choices=("torch", "numpy"), help="kernels for non-delegated operators")
    load.add_argument("--trt", choices=("tensorrt", "tensorrt_rtx", "tensorrt_lean"),
                      help="TensorRT flavour (default: the first that imports)")
    inputs = argparse.ArgumentParser(add_help=False)
    inputs.add_argument("--input", action="append", default=[], metavar="[NAME=]FILE",
                        help="an input from .npy (NAME: position, 0 or input0) or several from .npz (repeatable)")
    inputs.add_argument("--random", action="store_true", help="draw every input not given with --input")
    inputs.add_argument("--seed", type=int, default=0, help="seed for --random (default 0)")
    inputs.add_argument("--shape", action="append", type=_shape, default=[], metavar="NAME=D0,D1,...",
                        help="shape of a random dynamic input (default: its upper bound)")

    parser = argparse.ArgumentParser(prog="pyrt", parents=[common], formatter_class=fmt, epilog=_EXAMPLES["pyrt"],
                                     description="Run, time and inspect ExecuTorch .pte programs with TensorRT "
                                                 "delegates.")
    parser.add_argument("--version", action="version", version=f"pyrt {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("inspect", parents=[common], formatter_class=fmt, epilog=_EXAMPLES["inspect"],
                       help="describe a .pte file", description="Describe a .pte file without loading it.")
    p.add_argument("path", help="the .pte file, or a .ptd data file")
    p.add_argument("--data", action="append", metavar="PTD", help="a .ptd file of the program (repeatable)")
    p.add_argument("--json", action="store_true", help="print JSON (the pyrt.inspect() dict)")
    p.add_argument("--graph", metavar="OUT.svg|OUT.dot", help="draw the instruction chains (Graphviz)")
    p.set_defaults(func=_cmd_inspect)

    p = sub.add_parser("run", parents=[common, load, inputs], formatter_class=fmt, epilog=_EXAMPLES["run"],
                       help="run a method once and summarise its outputs",
                       description="Run a method once; print each output's dtype, shape and statistics.")
    p.add_argument("--budget", type=_budget, help="weight-streaming budget: bytes (a total), 50%%, auto, "
                   "or per engine 0=1GiB,1=50%%")
    p.add_argument("--save", metavar="OUT.npz", help="save inputs (input0...) and outputs (output0...)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("bench", parents=[common, load, inputs], formatter_class=fmt, epilog=_EXAMPLES["bench"],
                       help="latency and throughput, optionally across weight-streaming budgets",
                       description="Time a method: latency min/p50/p90/p99/max and throughput, one row per "
                                   "budget. Inputs are random unless given. CUDA events time programs that use "
                                   "a GPU; host-only programs use the host clock.")
    p.add_argument("--budget", action="append", type=_budget, default=[],
                   help="a budget to time, as for run (repeatable: a sweep)")
    p.add_argument("--sweep", metavar="START..STOP[:STEP]", help="budgets from START to STOP, e.g. 10%%..100%%")
    p.add_argument("--warmup", type=_count, default=5, help="untimed runs before each row (default 5)")
    amount = p.add_mutually_exclusive_group()
    amount.add_argument("--iters", type=_count, help="timed runs per row (default: >= 10 runs and >= 1 s)")
    amount.add_argument("--seconds", type=_positive, help="time each row for this long")
    p.add_argument("--plot", metavar="CURVE.png", help="plot throughput and latency against budget (matplotlib)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser("profile", parents=[common, load, inputs], formatter_class=fmt, epilog=_EXAMPLES["profile"],
                       help="time per instruction, operator and delegate; a Chrome trace",
                       description="Profile a method's runs: host (and, on a GPU, device) time per instruction, "
                                   "by operator and by delegate. Inputs are random unless given.")
    p.add_argument("--budget", type=_budget, help="weight-streaming budget, as for run")
    p.add_argument("--warmup", type=_count, default=1, help="unprofiled runs first (default 1)")
    p.add_argument("--iters", type=_count, default=10, help="profiled runs (default 10)")
    p.add_argument("--trace", metavar="TRACE.json", help="write a Chrome trace (ui.perfetto.dev, chrome://tracing)")
    p.add_argument("--no-device-time", action="store_true", help="no CUDA timing events")
    p.add_argument("--json", action="store_true", help="print JSON (Profiler.summary())")
    p.set_defaults(func=_cmd_profile)
    return parser


# -- terminal --------------------------------------------------------------------------------------


def _colour(stream: TextIO) -> bool:
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _say(kind: str, message: str) -> None:
    """``pyrt: error: message`` on stderr (the label coloured on a terminal)."""
    codes = {"error": "1;31", "warning": "1;33", "note": "1;36"}
    label = f"\033[{codes[kind]}m{kind}:\033[0m" if _colour(sys.stderr) else f"{kind}:"
    print(f"pyrt: {label} {message}", file=sys.stderr)


@contextlib.contextmanager
def _warnings_to_stderr() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        warnings.showwarning = lambda message, *a, **k: _say("warning", str(message))
        yield


def _progress(enabled: bool) -> Any:
    """A tqdm bar factory on stderr (None without tqdm or when disabled; tqdm hides itself off a TTY)."""
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None

    def make(label: str, total: int | None) -> Any:
        return tqdm(total=total, desc=label, unit="run", file=sys.stderr, leave=False, disable=None,
                    dynamic_ncols=True)

    return make


# -- shared steps -------------------------------------------------------------------------------------


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


def _program(args: argparse.Namespace, budget: Any = None) -> Any:
    return Program(args.path, data=args.data, budget=budget, device_map=dict(args.device_map) or None,
                   trt=args.trt, kernels=args.kernels)


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


# -- commands ------------------------------------------------------------------------------------------


def _cmd_inspect(args: argparse.Namespace) -> int:
    info = inspect(args.path, data=args.data)
    if args.graph:
        with PteFile.open(args.path) as pte:
            text = to_dot(pte)
        written, note = write_graph(text, args.graph)
        if note:
            _say("warning", note)
        print(f"pyrt: wrote {written}", file=sys.stderr)
    print(json.dumps(info, indent=2) if args.json else format_report(info))
    return EXIT_OK


def _cmd_run(args: argparse.Namespace) -> int:
    import numpy as np

    values, described = _inputs(args, random_default=False)
    with _program(args, args.budget) as prog:
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
        budget = "-" if e["budget"] is None else _size(e["budget"])
        lines.append(f"  engine {e['index']} ({e['method']}/delegate{e['delegate_index']}, cuda:{e['device']}): "
                     f"budget {budget} of {_size(e['streamable_bytes'])} streamable ({e['source']})")
    return lines


def _cmd_bench(args: argparse.Namespace) -> int:
    budgets: list[Any] = list(args.budget) + (parse_sweep(args.sweep) if args.sweep else [])
    if args.plot:
        check_plot_support()
    values, described = _inputs(args, random_default=True)
    with _program(args) as prog:
        devices = sorted({w.device for w in prog.weight_streaming})
        rows = sweep(prog, values, method=args.method, budgets=budgets or [None], warmup=args.warmup,
                     iters=args.iters, seconds=args.seconds, progress=_progress(not args.no_progress))
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
    return EXIT_OK


def _cmd_profile(args: argparse.Namespace) -> int:
    values, described = _inputs(args, random_default=True)
    with _program(args, args.budget) as prog:
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


# -- entry point --------------------------------------------------------------------------------------


def _simulated(stack: contextlib.ExitStack) -> None:
    value = os.environ.get(SIMULATED_GPUS_ENV, "").strip()
    if not value:
        return
    if not value.isdigit():
        raise PyrtError(f"{SIMULATED_GPUS_ENV}={value!r}: expected a whole number of GPUs")

    stack.enter_context(simulated_gpus(int(value)))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    debug = bool(os.environ.get("PYRT_DEBUG"))
    try:
        try:
            args = _parser().parse_args(argv)
        except SystemExit as exc:  # --help and --version (0), usage errors (2)
            return exc.code if isinstance(exc.code, int) else EXIT_USAGE if exc.code else EXIT_OK
        debug = debug or getattr(args, "debug", False)
        with contextlib.ExitStack() as stack:
            stack.callback(reset_logging)  # main() called in a process that goes on (tests) leaves no handler
            configure_logging(getattr(args, "verbose", False))
            stack.enter_context(_warnings_to_stderr())
            _simulated(stack)
            status: int = args.func(args)
            sys.stdout.flush()
        return status
    except BrokenPipeError:
        # The reader left (`| head`): stop quietly; point stdout at /dev/null so the exit flush cannot fail.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_PIPE
    except KeyboardInterrupt:
        _say("error", "interrupted")
        return EXIT_INTERRUPTED
    except (PyrtError, OSError) as exc:
        if debug:
            traceback.print_exc()
        _say("error", str(exc))
        return EXIT_ERROR
    except Exception as exc:  # a bug: say so, with the traceback on request
        if debug:
            traceback.print_exc()
        _say("error", f"internal error: {type(exc).__name__}: {exc} (run with --debug for the traceback)")
        return EXIT_ERROR


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
