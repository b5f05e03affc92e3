"""``pyrt generate`` and ``pyrt bench --generate``: the command line's LLM side.

    pyrt generate m.pte --prompt-ids 1,2,3 --max-new-tokens 32 [--budget 50%] [--sample --temperature 0.8
                  --top-k 40 --top-p 0.9 --seed 0] [--eos-ids 2] [--json]
    pyrt generate m.pte --prompt "Once upon a time" --tokenizer ./tokenizer_dir
    pyrt bench m.pte --generate --sweep 10%..100% [--prompt-len 16 --new-tokens 32] [--json] [--plot tps.png]

The command line (:mod:`pyrt.tools.cli_args`) loads this module with ``importlib`` when it
builds its parser and calls :func:`add_commands`; tokens are printed as they come, then the
timings (to stderr, so stdout stays the generated tokens or text).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from pyrt.errors import InputError, PyrtError
from pyrt.llm.gen_bench import format_generation_rows, generation_sweep, plot_generation
from pyrt.llm.loop import generate
from pyrt.runtime.program import Program
from pyrt.tools.bench import check_plot_support, parse_sweep
from pyrt.tools.cli_args import _budget, _count
from pyrt.tools.commands import COMMANDS, _program
from pyrt.tools.terminal import EXIT_OK

_EXAMPLES = """examples:
  pyrt generate m.pte --prompt-ids 1,2,3 --max-new-tokens 32
  pyrt generate m.pte --prompt-ids 1,2,3 --sample --temperature 0.8 --top-k 40 --seed 0
  pyrt generate m.pte --prompt "Hello" --tokenizer ./tokenizer --budget 50%
  PYRT_SIMULATED_GPUS=1 pyrt generate m.pte --prompt-ids 5,6,7 --json"""


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


def add_commands(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Add ``generate`` to the subcommands, and ``--generate`` (with its options) to ``bench``."""
    p = sub.add_parser("generate", parents=parents, formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog=_EXAMPLES, help="generate tokens with an LLM file (ExecuTorch's LLM convention)",
                       description="Prefill a prompt, then generate token by token; tokens (or text) are printed "
                                   "as they come, then the timings.")
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt-ids", type=_ids, metavar="1,2,3", help="the prompt's token ids")
    prompt.add_argument("--prompt", metavar="TEXT", help="the prompt as text (needs --tokenizer)")
    p.add_argument("--tokenizer", metavar="DIR", help="a local Hugging Face tokenizer directory (transformers)")
    p.add_argument("--max-new-tokens", type=_count, metavar="N", help="cap on new tokens (default: until EOS or a "
                   "full cache)")
    p.add_argument("--budget", type=_budget, help="weight-streaming budget, as for run")
    p.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument("--temperature", type=_float, default=1.0, help="sampling temperature (default 1)")
    p.add_argument("--top-k", type=_count, help="sample among the k most likely tokens")
    p.add_argument("--top-p", type=_float, help="sample within this probability mass")
    p.add_argument("--seed", type=_count, help="seed of the sampler")
    p.add_argument("--eos-ids", type=_ids, metavar="2,3", help="stop ids (default: the file's get_eos_ids)")
    p.add_argument("--json", action="store_true", help="print JSON at the end instead of tokens as they come")
    p.set_defaults(handler=_cmd_generate)
    bench = sub.choices["bench"]
    bench.add_argument("--generate", action="store_true", help="time LLM generation (prefill ms, decode tokens/s) "
                       "per budget instead of single runs")
    bench.add_argument("--prompt-len", type=_count, default=16, help="--generate: prompt tokens (default 16)")
    bench.add_argument("--new-tokens", type=_count, default=32, help="--generate: new tokens (default 32)")
    bench.set_defaults(handler=_cmd_bench)


def _tokenizer(args: argparse.Namespace) -> Any:
    if args.tokenizer is None:
        if args.prompt is not None:
            raise InputError("--prompt needs --tokenizer DIR (a local Hugging Face tokenizer); or pass --prompt-ids")
        return None
    if not os.path.isdir(args.tokenizer):
        raise InputError(f"--tokenizer {args.tokenizer!r} is not a directory")
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise PyrtError("--tokenizer needs transformers: pip install transformers") from None
    try:
        return AutoTokenizer.from_pretrained(args.tokenizer, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise InputError(f"--tokenizer {args.tokenizer!r}: {exc}") from None


def _cmd_generate(args: argparse.Namespace) -> int:
    tokenizer = _tokenizer(args)
    ids = args.prompt_ids if args.prompt is None else list(tokenizer(args.prompt)["input_ids"])
    with _program(args, args.budget) as prog:
        stream = generate(prog, ids, max_new_tokens=args.max_new_tokens, do_sample=args.sample,
                          temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                          eos_ids=args.eos_ids, stream=True, method=args.method)
        shown, seen = "", []
        for token in stream:
            seen.append(token)
            if args.json:
                continue
            if tokenizer is None:
                print(token, end=" ", flush=True)
            else:  # decode everything so far: a token's text can depend on its neighbours
                text = tokenizer.decode(seen, skip_special_tokens=True)
                print(text[len(shown):], end="", flush=True)
                shown = text
    result = stream.result
    if args.json:
        out = {"prompt_ids": ids, "tokens": result.tokens, "finish_reason": result.finish_reason,
               "timings": result.timings.as_dict()}
        if tokenizer is not None:
            out["text"] = tokenizer.decode(result.tokens, skip_special_tokens=True)
        print(json.dumps(out, indent=2))
        return EXIT_OK
    print()
    print(f"finish: {result.finish_reason}; {result.timings}", file=sys.stderr)
    return EXIT_OK


def _cmd_bench(args: argparse.Namespace) -> int:
    if not args.generate:
        return COMMANDS["bench"](args)
    budgets: list[Any] = list(args.budget) + (parse_sweep(args.sweep) if args.sweep else [])
    if args.plot:
        check_plot_support()
    with Program(args.path, data=args.data, device_map=dict(args.device_map) or None, trt=args.trt,
                 kernels=args.kernels) as prog:
        rows = generation_sweep(prog, budgets=budgets or [None], prompt_len=args.prompt_len,
                                new_tokens=args.new_tokens, iters=args.iters or 3, warmup=min(args.warmup, 1),
                                seed=args.seed, method=args.method)
    if args.plot:
        plot_generation(rows, args.plot, title=f"{os.path.basename(args.path)}: decode tokens/s per budget")
        print(f"pyrt: wrote {args.plot}", file=sys.stderr)
    if args.json:
        print(json.dumps({"source": args.path, "method": args.method, "rows": rows}, indent=2))
        return EXIT_OK
    print(f"{args.path}: {args.prompt_len}-token prompt, {args.new_tokens} new tokens, median of "
          f"{rows[0]['generations']} greedy generation(s) per row (host clock)")
    print(format_generation_rows(rows))
    return EXIT_OK
