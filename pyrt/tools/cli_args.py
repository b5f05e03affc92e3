"""The ``pyrt`` command line's argparse parser: the options every subcommand shares (parent
parsers), one function per subcommand (``serve``'s is :func:`pyrt.serve.command.add_parser`;
``generate`` and ``bench --generate`` run :mod:`pyrt.llm`), and the converters that turn option
text into values (a bad value is argparse's usage error, exit status 2). ``args.command`` names
the subcommand (:data:`pyrt.tools.commands.COMMANDS`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from pyrt._version import __version__
from pyrt.llm.config import GenerationConfig
from pyrt.serve.arguments import Parser, float_argument, whole_argument
from pyrt.streaming import budget_argument
from pyrt.tools.inputs import parse_shape_arg

_FMT = argparse.RawDescriptionHelpFormatter

_EXAMPLES = {
    "pyrt": """examples:
  pyrt inspect model.pte                        readable report of the file
  pyrt run model.pte --random                   run once on random inputs
  pyrt bench model.pte --sweep 10%..100%        latency at ten weight-streaming budgets
  pyrt profile model.pte --trace trace.json     time per operator and delegate, and a trace

environment:
  PYRT_SIMULATED_GPUS=n   run on n simulated GPUs (pyrt.sim; reference engines only)
  PYRT_KERNELS=numpy      run non-delegated operators with pyrt's numpy kernels
  PYRT_LOG=debug          pyrt's log level (debug, info, warning, error; -v is debug)
  NO_COLOR=1              no colour on a terminal either""",
    "inspect": """examples:
  pyrt inspect model.pte
  pyrt inspect --json model.pte | jq '.methods[0].delegates'
  pyrt inspect model.pte --graph model.svg      SVG with Graphviz, else model.dot
  pyrt inspect --memory model.pte --gpu-memory 24GiB   the budget="fit" plan on a 24 GiB GPU
  PYRT_SIMULATED_GPUS=1 pyrt inspect --memory model.pte --gpu-memory 80GiB   (reference engines)""",
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
    "generate": """examples:
  pyrt generate m.pte --prompt-ids 1,2,3 --max-new-tokens 32
  pyrt generate m.pte --prompt-ids 1,2,3 --sample --temperature 0.8 --top-k 40 --seed 0
  pyrt generate m.pte --prompt "Hello" --tokenizer ./tokenizer --budget 50%
  pyrt generate m.pte --prompt-ids 1,2,3,1,2 --draft ngram --draft-tokens 4
  pyrt generate m.pte --prompt-ids 1,2,3 --draft small.pte          (a smaller LLM file: same vocabulary)
  pyrt generate m.pte --prompt "Hello"            the tokenizer pyrt export kept in m.tokenizer/
  PYRT_SIMULATED_GPUS=1 pyrt generate m.pte --prompt-ids 5,6,7 --json""",
}


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
    """``--budget``: :func:`pyrt.streaming.budget_argument`, its ValueError as a usage error."""
    try:
        return budget_argument(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_count, _one_or_more = whole_argument(0), whole_argument(1)


def _batches(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected batch sizes >= 1 separated by commas, got {text!r}")
    return sizes


def _ids(text: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated token ids such as 1,2,3, got {text!r}") from None


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


_seconds = float_argument("a number of seconds > 0", lambda x: x > 0)
_bandwidth_gbps = float_argument("a bandwidth in GB/s > 0", lambda x: x > 0)


def parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``pyrt`` parser: global options and the inspect, run, bench, profile, serve, generate and export
    subcommands. Given the command line ``argv`` that names a subcommand, only that one's options are built
    (the others by name alone): the server's and the exporter's flags come from their modules, which
    ``pyrt generate`` need not import. ``argv`` None (or naming none: ``pyrt --help``) builds them all."""
    common, load, inputs = _common(), _load(), _inputs()
    parser = Parser(prog="pyrt", parents=[common], formatter_class=_FMT, epilog=_EXAMPLES["pyrt"],
                                     description="Run, time and inspect ExecuTorch .pte programs with TensorRT "
                                                 "delegates.")
    parser.add_argument("--version", action="version", version=f"pyrt {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    adders: dict[str, Callable[[], Any]] = {
        "inspect": lambda: _add_inspect(sub, common),
        "run": lambda: _add_run(sub, [common, load, inputs]),
        "bench": lambda: _add_bench(sub, [common, load, inputs]),
        "profile": lambda: _add_profile(sub, [common, load, inputs]),
        "serve": lambda: _add_serve(sub, [common]),
        "generate": lambda: _add_generate(sub, [common, load]),
        "export": lambda: _add_export(sub, [common]),
    }
    chosen = _chosen(argv, adders)
    for name, add in adders.items():
        if chosen in (None, name):
            add()
        else:  # never parsed with: the name keeps argparse's list of choices whole
            sub.add_parser(name, add_help=False)
    return parser


def _chosen(argv: Sequence[str] | None, names: Iterable[str]) -> str | None:
    """The subcommand ``argv`` names: its first word not an option (no global option takes a value)."""
    first = next((a for a in argv or () if not a.startswith("-")), None)
    return first if first in set(names) else None


def _add_serve(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    from pyrt.serve.command import add_parser

    add_parser(sub, parents)


def _add_export(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    from pyrt.tools.export_command import add_parser

    add_parser(sub, parents)


def _common() -> argparse.ArgumentParser:
    """Options of the program and of every subcommand."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the traceback of an error")
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="show pyrt's debug log and third-party messages (as PYRT_LOG=debug)")
    return common


def _load() -> argparse.ArgumentParser:
    """How run, bench and profile open the program."""
    load = argparse.ArgumentParser(add_help=False)
    load.add_argument("path", help="the .pte file")
    load.add_argument("--data", action="append", metavar="PTD", help="a .ptd file of external weights (repeatable)")
    load.add_argument("--method", default="forward", help="method to run (default: forward)")
    load.add_argument("--device-map", action="append", type=_kv, default=[], metavar="FROM=TO",
                      help="move engines off the device the file names, e.g. cuda:0=cuda:1 (repeatable)")
    load.add_argument("--kernels", choices=("torch", "numpy"), help="kernels for non-delegated operators")
    load.add_argument("--trt", choices=("tensorrt", "tensorrt_rtx", "tensorrt_lean"),
                      help="TensorRT flavour (default: the first that imports)")
    return load


def _inputs() -> argparse.ArgumentParser:
    """Where run, bench and profile get the method's inputs."""
    inputs = argparse.ArgumentParser(add_help=False)
    inputs.add_argument("--input", action="append", default=[], metavar="[NAME=]FILE",
                        help="an input from .npy (NAME: position, 0 or input0) or several from .npz (repeatable)")
    inputs.add_argument("--random", action="store_true", help="draw every input not given with --input")
    inputs.add_argument("--seed", type=int, default=0, help="seed for --random (default 0)")
    inputs.add_argument("--shape", action="append", type=_shape, default=[], metavar="NAME=D0,D1,...",
                        help="shape of a random dynamic input (default: its upper bound)")
    return inputs


def _add_inspect(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("inspect", parents=[common], formatter_class=_FMT, epilog=_EXAMPLES["inspect"],
                       help="describe a .pte file", description="Describe a .pte file without loading it.")
    p.add_argument("path", help="the .pte file, or a .ptd data file")
    p.add_argument("--data", action="append", metavar="PTD", help="a .ptd file of the program (repeatable)")
    p.add_argument("--json", action="store_true", help="print JSON (the pyrt.inspect() dict)")
    p.add_argument("--graph", metavar="OUT.svg|OUT.dot", help="draw the instruction chains (Graphviz)")
    p.add_argument("--memory", action="store_true",
                   help="load the program (at budget 0) and print its GPU memory plan per device")
    p.add_argument("--gpu-memory", type=_budget, metavar="SIZE",
                   help="plan for GPUs of SIZE each (e.g. 24GiB) instead of the devices present (implies --memory)")
    p.add_argument("--headroom", type=_budget, metavar="SIZE|SHARE",
                   help="memory the plan leaves free on each GPU (default 5%%)")
    p.add_argument("--device-map", action="append", type=_kv, default=[], metavar="FROM=TO",
                   help="with --memory: move engines off the device the file names, e.g. cuda:0=cuda:1")
    p.add_argument("--trt", choices=("tensorrt", "tensorrt_rtx", "tensorrt_lean"),
                   help="with --memory: TensorRT flavour (default: the first that imports)")


def _add_run(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("run", parents=parents, formatter_class=_FMT, epilog=_EXAMPLES["run"],
                       help="run a method once and summarise its outputs",
                       description="Run a method once; print each output's dtype, shape and statistics.")
    p.add_argument("--budget", type=_budget, help="weight-streaming budget: bytes (a total), 50%%, auto, "
                   "or per engine 0=1GiB,1=50%%")
    p.add_argument("--save", metavar="OUT.npz", help="save inputs (input0...) and outputs (output0...)")
    p.add_argument("--json", action="store_true", help="print JSON")


def _add_bench(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("bench", parents=parents, formatter_class=_FMT, epilog=_EXAMPLES["bench"],
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
    amount.add_argument("--seconds", type=_seconds, help="time each row for this long")
    p.add_argument("--plot", metavar="CURVE.png", help="plot throughput and latency against budget (matplotlib)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--generate", action="store_true", help="time LLM generation (prefill ms, decode tokens/s) "
                   "per budget instead of single runs")
    p.add_argument("--prompt-len", type=_one_or_more, default=16, help="--generate: prompt tokens (default 16)")
    p.add_argument("--new-tokens", type=_one_or_more, default=32, help="--generate: new tokens (default 32)")
    p.add_argument("--batch", type=_batches, help="--generate: sequences generated at once, e.g. 1,4,16 (default 1; "
                   "a file of max_batch_size B runs up to B in one step)")
    p.add_argument("--bandwidth", type=_bandwidth_gbps, metavar="GB/s", help="--generate: the host-to-device bandwidth "
                   "of the B*BW/S column (default: measured when weights stream)")


def _add_profile(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("profile", parents=parents, formatter_class=_FMT, epilog=_EXAMPLES["profile"],
                       help="time per instruction, operator and delegate; a Chrome trace",
                       description="Profile a method's runs: host (and, on a GPU, device) time per instruction, "
                                   "by operator and by delegate. Inputs are random unless given.")
    p.add_argument("--budget", type=_budget, help="weight-streaming budget, as for run")
    p.add_argument("--warmup", type=_count, default=1, help="unprofiled runs first (default 1)")
    p.add_argument("--iters", type=_count, default=10, help="profiled runs (default 10)")
    p.add_argument("--trace", metavar="TRACE.json", help="write a Chrome trace (ui.perfetto.dev, chrome://tracing)")
    p.add_argument("--no-device-time", action="store_true", help="no CUDA timing events")
    p.add_argument("--json", action="store_true", help="print JSON (Profiler.summary())")


def _add_generate(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("generate", parents=parents, formatter_class=_FMT, epilog=_EXAMPLES["generate"],
                       help="generate tokens with an LLM file (ExecuTorch's LLM convention)",
                       description="Prefill a prompt, then generate token by token; tokens (or text) are printed "
                                   "as they come, then the timings.")
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt-ids", type=_ids, metavar="1,2,3", help="the prompt's token ids")
    prompt.add_argument("--prompt", metavar="TEXT", help="the prompt as text (needs a tokenizer: --tokenizer, or "
                                                         "the one pyrt export kept beside the file)")
    p.add_argument("--tokenizer", metavar="DIR", help="a local Hugging Face tokenizer directory (transformers; "
                                                      "default with --prompt: M.tokenizer/ beside M.pte)")
    p.add_argument("--max-new-tokens", type=_one_or_more, metavar="N",
                   help="cap on new tokens (default: until EOS or a full cache)")
    p.add_argument("--budget", type=_budget, help="weight-streaming budget, as for run")
    p.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument("--temperature", type=_float, help="with --sample: sampling temperature (default 1; 0: greedy)")
    p.add_argument("--top-k", type=_one_or_more, help="with --sample: sample among the k most likely tokens")
    p.add_argument("--top-p", type=_float, help="with --sample: sample within this probability mass")
    p.add_argument("--seed", type=_count, help="with --sample: seed of the sampler")
    p.add_argument("--eos-ids", type=_ids, metavar="2,3", help="stop ids (default: the file's get_eos_ids)")
    p.add_argument("--draft", metavar="ngram|D.pte", help="speculative decoding: guess tokens by prompt lookup "
                   "(ngram) or with a smaller LLM file (same vocabulary, BOS and EOS; loaded fully resident); "
                   "the same tokens in fewer passes of the model")
    p.add_argument("--draft-tokens", type=_one_or_more, metavar="K",
                   help=f"with --draft: the most tokens guessed per step (default {GenerationConfig.draft_tokens})")
    p.add_argument("--draft-tree", action="store_true", default=None,
                   help="with --draft: guess a tree of --draft-tokens tokens (e.g. 32) grown from the draft's "
                   "probabilities, verified in one pass (a slot file written with --max-batch-size)")
    p.add_argument("--json", action="store_true", help="print JSON at the end instead of tokens as they come")
