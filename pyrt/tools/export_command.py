"""``pyrt export``: a local Hugging Face causal-LM checkpoint directory, or a ``torch.export`` .pt2, -> a .pte.

    pyrt export ./llama-dir -o llama.pte --max-seq-len 2048 --max-batch-size 4 --weight-streaming
    pyrt export prog.pt2 -o prog.pte --builder tensorrt_rtx

A directory runs :func:`pyrt.export.checkpoint.checkpoint_to_pte` (its tokenizer goes to
``llama.tokenizer/``, where ``pyrt generate`` and ``pyrt serve`` find it); a file runs
:func:`pyrt.export.pt2.pt2_to_pte`. Each stage (load, export, build, write) shows a bar with its
time and memory on a terminal; the summary goes to stdout (``--json``: as JSON). torch and the
exporter are imported only when the command runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
from collections.abc import Sequence
from typing import Any

from pyrt.device.budgets import parse_budget
from pyrt.errors import BudgetError, ExportError
from pyrt.export.options import DECODER_BUILDERS, DEFAULT_BUILDER, DEFAULT_DEVICE, check_engine_size
from pyrt.format import weight_quant as wq
from pyrt.logs import third_party_quiet
from pyrt.serve.arguments import needs, whole_argument
from pyrt.tools.terminal import EXIT_OK

DTYPES = ("float16", "bfloat16", "float32")
# vLLM's --dtype names: auto keeps the stored dtype (no --dtype), half and float are float16 and float32
DTYPE_ALIASES = {"auto": None, "half": "float16", "float": "float32"}
# Options that only a checkpoint directory takes (a .pt2 program keeps the shapes it was exported with).
LLM_OPTIONS = ("max_seq_len", "max_batch_size", "max_tokens_per_step", "dtype", "quantize", "group_size",
               "max_engine_size")
EXAMPLES = """examples:
  pyrt export ./Llama-3.2-1B -o llama.pte                          the model's dtype, TensorRT (else -RTX)
  pyrt export ./Llama-3.2-1B -o llama.pte --max-seq-len 4096 --max-batch-size 8 --weight-streaming
  pyrt export ./qwen2 -o qwen.pte --dtype float16 --builder tensorrt_rtx --budget 2GiB
  pyrt export ./qwen2 -o qwen-int4.pte --quantize int4 --group-size 64 --weight-streaming
  pyrt export ./Llama-2-7b -o l7.pte --max-engine-size 1GiB        engines of at most 1 GiB of weights
  pyrt export prog.pt2 -o prog.pte                                  a torch.export.save'd program
  pyrt generate llama.pte --prompt "Hello"                         the tokenizer is found beside the file"""


def _bytes(text: str) -> int:
    """``--budget``: a byte count baked into each engine (percentages and auto are load-time choices)."""
    try:
        spec = parse_budget(text, source="--budget")
    except BudgetError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if spec is None or spec.kind != "bytes":
        raise argparse.ArgumentTypeError(f"--budget {text!r}: export bakes a byte count per engine (e.g. 2GiB); "
                                         "shares and auto are chosen at load: pyrt generate --budget 50%")
    return int(spec.value or 0)


def _engine_size(text: str) -> int:
    """``--max-engine-size``: the most weight bytes of one engine (checked once, here)."""
    try:
        return check_engine_size(text, "--max-engine-size") or 0
    except ExportError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_parser(sub: Any, parents: Sequence[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = sub.add_parser("export", parents=list(parents), formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog=EXAMPLES, help="export a Hugging Face checkpoint directory or a .pt2 to a .pte",
                       description="Export a local Hugging Face causal-LM checkpoint (config.json, *.safetensors, "
                                   "tokenizer files) to a .pte following ExecuTorch's LLM convention, with its "
                                   "tokenizer kept beside it; or a torch.export.save'd .pt2 program.")
    p.add_argument("source", metavar="DIR|PT2", help="a checkpoint directory, or a .pt2 file")
    p.add_argument("-o", "--output", required=True, metavar="OUT.pte", help="the .pte to write (replaced atomically)")
    llm = p.add_argument_group("checkpoint directories")
    llm.add_argument("--max-seq-len", "--max-model-len", type=whole_argument(2), metavar="N", dest="max_seq_len",
                     help="KV-cache positions (default: the model's limit, at most 2048; vLLM's --max-model-len)")
    llm.add_argument("--max-batch-size", "--max-num-seqs", type=whole_argument(1), metavar="B", dest="max_batch_size",
                     help="sequences served at once, each in its own KV-cache slot (default 1; vLLM's "
                          "--max-num-seqs)")
    llm.add_argument("--max-tokens-per-step", type=whole_argument(1), metavar="T",
                     help="with --max-batch-size > 1: most tokens one step takes (default max(B, min(N, 256)))")
    llm.add_argument("--dtype", choices=DTYPES + tuple(DTYPE_ALIASES),
                     help="weights' dtype (default, or auto: as stored; another converts, a copy; half and float: "
                          "vLLM's names of float16 and float32)")
    llm.add_argument("--quantize", "--quantization", choices=tuple(wq.SCHEMES), dest="quantize",
                     help="weight-only INT8 / INT4 linear layers (symmetric, per group of --group-size input "
                          "features; vLLM's --quantization)")
    llm.add_argument("--group-size", type=whole_argument(1), metavar="G",
                     help=f"with --quantize: input features per scale (a power of two >= {wq.MIN_GROUP_SIZE}; "
                          f"default {wq.DEFAULT_GROUP_SIZE})")
    llm.add_argument("--max-engine-size", type=_engine_size, metavar="SIZE",
                     help="cut the decoder at layer boundaries into the fewest engines whose weights each fit SIZE "
                          "(e.g. 2GiB); default: one engine when its build fits the host's available memory, else "
                          "the fewest groups that fit")
    p.add_argument("--builder", choices=DECODER_BUILDERS, default=DEFAULT_BUILDER,
                   help="engine builder: auto (tensorrt, else tensorrt_rtx), tensorrt, tensorrt_rtx, reference "
                        "(pyrt's simulated GPU), portable (no engines: ExecuTorch's portable kernels)")
    p.add_argument("--weight-streaming", action="store_true", help="build engines whose weights can stream")
    p.add_argument("--budget", type=_bytes, metavar="SIZE", help="weight-streaming budget baked per engine, e.g. "
                                                                 "2GiB (needs --weight-streaming)")
    p.add_argument("--device", default=DEFAULT_DEVICE,
                   help=f"the engines' CUDA device (default {DEFAULT_DEVICE}); a list (cuda:0,cuda:1) spreads "
                        "the layer groups over those GPUs in order, balanced by weight bytes")
    tok = p.add_mutually_exclusive_group()
    tok.add_argument("--tokenizer", metavar="DIR", help="keep this tokenizer folder's files beside the .pte "
                                                        "(default: the checkpoint's own)")
    tok.add_argument("--no-tokenizer", action="store_true", help="keep no tokenizer beside the .pte")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (log lines with -v)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    needs(p, ("group_size", "quantize"), ("budget", "weight_streaming"), ("max_tokens_per_step", "max_batch_size"))
    return p


def run(args: argparse.Namespace) -> int:
    """Export ``args.source``; prints the summary (stages with their time and memory). The libraries it imports and
    calls (torch, torchao, transformers, ExecuTorch) keep their chatter to themselves unless ``--verbose``
    (:func:`pyrt.logs.third_party_quiet`: torchao's extensions that fail to load, torch's pytree notes, ...)."""
    if importlib.util.find_spec("torch") is not None:  # torch sets its loggers' levels as it imports: before
        import torch  # noqa: F401  # extra: export
    with third_party_quiet():
        summary = _export(args)
    print(json.dumps(_as_json(summary), indent=2) if args.json else summary)
    return EXIT_OK


def _export(args: argparse.Namespace) -> Any:
    progress = False if args.no_progress else None
    common = dict(builder=args.builder, weight_streaming=args.weight_streaming, weight_streaming_budget=args.budget,
                  device=args.device, progress=progress)
    if os.path.isdir(args.source):
        _needs("torch", "executorch", "onnxscript", "transformers", "safetensors")
        from pyrt.export.checkpoint import checkpoint_to_pte  # extra: export (torch, transformers)

        tokenizer: Any = False if args.no_tokenizer else args.tokenizer or True
        summary = checkpoint_to_pte(args.source, args.output, tokenizer=tokenizer, **_decoder_options(args),
                                    **common)
    else:
        given = [f"--{name.replace('_', '-')}" for name in LLM_OPTIONS if getattr(args, name) is not None]
        if given or args.builder == "portable":
            what = ", ".join(given) or "--builder portable"
            raise ExportError(f"{what}: for checkpoint directories; {args.source!r} is a program file, "
                              "exported with the shapes it was saved with")
        _needs("torch", "executorch", "onnxscript")
        from pyrt.export.pt2 import pt2_to_pte  # extra: export (torch)

        summary = pt2_to_pte(args.source, args.output, tokenizer=args.tokenizer, **common)
    return summary


def _needs(*modules: str) -> None:
    """ExportError naming the extras to install when a module the export imports is missing."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        raise ExportError(f"pyrt export needs {', '.join(missing)}: pip install 'pyrt-executorch[export,hf]' "
                          "(torch first, see README.md, Install)")


def _decoder_options(args: argparse.Namespace) -> dict[str, Any]:
    """The checkpoint-only flags as ``checkpoint_to_pte`` keywords (those not given keep its defaults)."""
    options = {name: getattr(args, name) for name in LLM_OPTIONS}
    options["dtype"] = DTYPE_ALIASES.get(options["dtype"], options["dtype"])
    return {k: v for k, v in options.items() if v is not None}


def _as_json(summary: Any) -> dict[str, Any]:
    return {"path": summary.path, "file_size": summary.file_size, "builder": summary.builder,
            "seconds": summary.seconds, "tokenizer": summary.tokenizer,
            "engines": [{"name": e.name, "size": e.size, "flavour": e.flavour, "device": e.device,
                         "streamable_weights": e.streamable_weights, "route": e.route,
                         "build_seconds": e.build_seconds, "layers": e.layers, "weight_bytes": e.weight_bytes,
                         "released_bytes": e.released_bytes}
                        for e in summary.engines],
            "grouping": summary.grouping,
            "fallback_ops": summary.fallback_ops, "constant_methods": summary.constant_methods,
            "stages": [r.as_dict() for r in summary.stages]}
