"""The ``pyrt`` command line: inspect, run, bench and profile .pte programs; serve them; generate tokens;
export a Hugging Face checkpoint directory (or a .pt2) to one.

    pyrt inspect model.pte [--json] [--graph model.svg] [--data model.ptd]
    pyrt inspect model.ptd                    # a data file's entries
    pyrt run model.pte --random --seed 0 [--save out.npz] [--json]
    pyrt bench model.pte --sweep 10%..100% --plot curve.png
    pyrt profile model.pte --trace trace.json
    pyrt generate m.pte --prompt-ids 1,2,3 --max-new-tokens 32 [--budget 50%] [--sample --temperature 0.8
                  --top-k 40 --top-p 0.9 --seed 0] [--eos-ids 2] [--json]
    pyrt generate m.pte --prompt "Once upon a time" --tokenizer ./tokenizer_dir
    pyrt bench m.pte --generate --sweep 10%..100% [--prompt-len 16 --new-tokens 32] [--json] [--plot tps.png]
    pyrt export ./hf-checkpoint -o m.pte [--max-seq-len N] [--max-batch-size B] [--dtype float16]
                [--builder tensorrt_rtx] [--weight-streaming] [--budget 2GiB] [--json]
    pyrt export prog.pt2 -o m.pte             # a torch.export.save'd program

Exit status: 0 ok; 2 the command line does not parse (argparse's usage
errors); 1 a value is wrong for the file or running failed (the typed pyrt
error's message, no traceback unless ``--debug``); 130 interrupted; 141 the
reader of stdout went away (``pyrt inspect --json m.pte | head``). Results go
to stdout, messages and progress bars to stderr (colour only on a terminal
and never with ``NO_COLOR`` set). ``PYRT_SIMULATED_GPUS=n`` runs the command
on ``n`` simulated GPUs (:func:`pyrt.sim.simulated_gpus`).

The parser is :mod:`pyrt.tools.cli_args`, the subcommands :mod:`pyrt.tools.commands`,
messages and exit statuses :mod:`pyrt.tools.terminal`; this module runs one command line.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import traceback
from collections.abc import Callable, Sequence

from pyrt.errors import PyrtError
from pyrt.logs import configure as configure_logging
from pyrt.logs import reset as reset_logging
from pyrt.tools.cli_args import parser
from pyrt.tools.terminal import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PIPE,
    EXIT_USAGE,
    say,
    warnings_to_stderr,
)


def _simulated(stack: contextlib.ExitStack) -> None:
    """``$PYRT_SIMULATED_GPUS`` simulated GPUs for the command; :mod:`pyrt.sim` (its fake CUDA and TensorRT) is
    imported only when it is set (``benchmarks/bench_generate_startup.py``)."""
    if not os.environ.get("PYRT_SIMULATED_GPUS", "").strip():
        return
    from pyrt.sim import gpus_from_environment, simulated_gpus

    count = gpus_from_environment()
    if count is not None:
        stack.enter_context(simulated_gpus(count))


def _command(name: str) -> Callable[[argparse.Namespace], int]:
    """The subcommand's function, its module imported only now: ``pyrt generate`` imports neither the
    server's, the exporter's nor the bench's modules (its start-up is mostly imports)."""
    if name == "generate":
        from pyrt.tools.generate_command import run
    elif name == "serve":
        from pyrt.serve.command import run
    elif name == "export":
        from pyrt.tools.export_command import run
    else:
        from pyrt.tools.commands import COMMANDS

        return COMMANDS[name]
    return run


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    debug = bool(os.environ.get("PYRT_DEBUG"))
    try:
        try:
            args = parser(sys.argv[1:] if argv is None else argv).parse_args(argv)
        except SystemExit as exc:  # --help and --version (0), usage errors (2)
            return exc.code if isinstance(exc.code, int) else EXIT_USAGE if exc.code else EXIT_OK
        debug = debug or getattr(args, "debug", False)
        with contextlib.ExitStack() as stack:
            stack.callback(reset_logging)  # main() called in a process that goes on (tests) leaves no handler
            configure_logging(getattr(args, "verbose", False))
            stack.enter_context(warnings_to_stderr())
            _simulated(stack)
            status: int = _command(args.command)(args)
            sys.stdout.flush()
        return status
    except BrokenPipeError:
        # The reader left (`| head`): stop quietly; point stdout at /dev/null so the exit flush cannot fail.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_PIPE
    except KeyboardInterrupt:
        say("error", "interrupted")
        return EXIT_INTERRUPTED
    except (PyrtError, OSError) as exc:
        if debug:
            traceback.print_exc()
        say("error", str(exc))
        return EXIT_ERROR
    except Exception as exc:  # a bug: say so, with the traceback on request
        if debug:
            traceback.print_exc()
        say("error", f"internal error: {type(exc).__name__}: {exc} (run with --debug for the traceback)")
        return EXIT_ERROR


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
