"""``pyrt generate``: a prompt (token ids, or text through a local tokenizer) -> tokens printed as they come,
then the timings (to stderr, so stdout stays the generated tokens or text), through :func:`pyrt.generate`.

Imports what generating needs and no more (not the server's, the exporter's or the bench's modules; nor
:mod:`pyrt.sim` unless ``PYRT_SIMULATED_GPUS`` asks for it): most of the command's start-up is imports
(``benchmarks/bench_generate_startup.py``), checked by ``tests/test_cold_imports.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from typing import Any

from pyrt.errors import InputError
from pyrt.format.companions import find_tokenizer
from pyrt.llm.config import GenerationConfig
from pyrt.llm.drafting import open_draft
from pyrt.llm.loop import generate
from pyrt.runtime.program import Program
from pyrt.serve.text import load_tokenizer
from pyrt.tools.terminal import EXIT_OK, say


def open_program(args: argparse.Namespace, budget: Any = None) -> Any:
    """The Program the load options name (``path``, ``--data``, ``--device-map``, ``--trt``, ``--kernels``;
    :func:`pyrt.tools.cli_args._load`), with weight-streaming ``budget``; run, bench and profile open theirs so."""
    return Program(args.path, data=args.data, budget=budget, device_map=dict(args.device_map) or None,
                   trt=args.trt, kernels=args.kernels)


def _tokenizer(args: argparse.Namespace) -> Any:
    """``--tokenizer``, else (for ``--prompt``) the one kept beside the file (:func:`find_tokenizer`), loaded
    (:func:`pyrt.serve.text.load_tokenizer`: what is wrong with the folder, on one line)."""
    if args.tokenizer is None:
        if args.prompt is None:
            return None
        args.tokenizer = find_tokenizer(args.path)
        if args.tokenizer is None:
            raise InputError("--prompt needs --tokenizer DIR (a local Hugging Face tokenizer; pyrt export keeps the "
                             "checkpoint's beside the .pte as M.tokenizer/, and none is there); or pass --prompt-ids")
    return load_tokenizer(args.tokenizer)


def _draft(args: argparse.Namespace, stack: contextlib.ExitStack) -> Any:
    """``--draft``: None, "ngram", or the draft file's Program (fully resident, closed with ``stack``)."""
    if args.draft is None or args.draft == "ngram":
        return args.draft
    if not os.path.isfile(args.draft):
        raise InputError(f"--draft {args.draft!r} is neither \"ngram\" nor a file")
    return stack.enter_context(open_draft(args.draft, device_map=dict(args.device_map) or None, trt=args.trt,
                                          kernels=args.kernels))


SAMPLING = ("temperature", "top_k", "top_p", "seed")  # generate's options that only --sample uses


def _sampling(args: argparse.Namespace) -> dict[str, Any]:
    """The sampling options given (those not given keep :func:`pyrt.generate`'s defaults); given without
    ``--sample`` (greedy decoding uses none of them) or ``--draft-tokens`` / ``--draft-tree`` without ``--draft``,
    warned about by name, as transformers' ``generate`` warns of a ``temperature`` it will not use."""
    given = {name: getattr(args, name) for name in SAMPLING if getattr(args, name) is not None}
    unused = [f"--{name.replace('_', '-')} {value}" for name, value in given.items()
              if not args.sample and not (name == "temperature" and value == 0)]
    if unused:
        say("warning", f"{', '.join(unused)} without --sample: decoding is greedy and does not use "
                       f"{'them' if len(unused) > 1 else 'it'} (add --sample to sample)")
    drafting = [shown for shown, value in ((f"--draft-tokens {args.draft_tokens}", args.draft_tokens),
                                           ("--draft-tree", args.draft_tree)) if value is not None]
    if drafting and args.draft is None:
        say("warning", f"{', '.join(drafting)} without --draft: no tokens are guessed (add --draft ngram or "
                       "--draft D.pte)")
    return given


def run(args: argparse.Namespace) -> int:
    if not os.path.isfile(args.path):  # named before the tokenizer, which is looked for beside it
        raise InputError(f"{args.path}: no such file" if not os.path.exists(args.path) else f"{args.path}: not a file")
    sampling = _sampling(args)
    tokenizer = _tokenizer(args)
    ids = args.prompt_ids if args.prompt is None else list(tokenizer(args.prompt)["input_ids"])
    with contextlib.ExitStack() as stack:
        prog = stack.enter_context(open_program(args, args.budget))
        stream = generate(prog, ids, max_new_tokens=args.max_new_tokens, do_sample=args.sample, **sampling,
                          eos_ids=args.eos_ids, stream=True, method=args.method, draft=_draft(args, stack),
                          draft_tokens=args.draft_tokens, draft_tree=args.draft_tree)
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
               "timings": result.timings.as_dict(), "cached_tokens": result.cached_tokens}
        if args.draft is not None:
            k = args.draft_tokens or GenerationConfig.draft_tokens
            out["speculation"] = {"draft": args.draft, "draft_tokens": k, "draft_tree": bool(args.draft_tree),
                                  "passes": result.passes,
                                  "drafted": result.drafted, "accepted": result.accepted,
                                  "tokens_per_pass": result.tokens_per_pass}
        if tokenizer is not None:
            out["text"] = tokenizer.decode(result.tokens, skip_special_tokens=True)
        print(json.dumps(out, indent=2))
        return EXIT_OK
    print()
    print(f"finish: {result.finish_reason}; {result.timings}; {result.cached_tokens} of the prompt's tokens cached "
          "(prefix caching)", file=sys.stderr)
    if args.draft is not None:
        print(f"draft {args.draft}: {result.tokens_per_pass:.2f} tokens per pass ({len(result.tokens)} tokens in "
              f"{result.passes} passes; {result.accepted} of {result.drafted} guessed tokens accepted)",
              file=sys.stderr)
    return EXIT_OK


