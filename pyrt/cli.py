"""The ``pyrt`` command line.

    pyrt inspect model.pte          # readable report
    pyrt inspect --json model.pte   # the same data as pyrt.inspect()

Exit status: 0, 1 on a pyrt error (message on stderr), 141 when the reader of
stdout went away early (``pyrt inspect --json f | head``; no traceback).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from pyrt.errors import PyrtError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pyrt", description="TensorRT-accelerated ExecuTorch programs from Python")
    sub = parser.add_subparsers(dest="command", required=True)
    insp = sub.add_parser("inspect", help="describe a .pte file")
    insp.add_argument("path", help="the .pte file")
    insp.add_argument("--json", action="store_true", help="print JSON (the pyrt.inspect() dict)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from pyrt.report import format_report, inspect

    try:
        info = inspect(args.path)
    except PyrtError as exc:
        print(f"pyrt: error: {exc}", file=sys.stderr)
        return 1
    return _emit(json.dumps(info, indent=2) if args.json else format_report(info))


def _emit(text: str) -> int:
    """Print ``text``; a reader that stops early (``pyrt inspect --json f | head``) is not an error to report."""
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # Point stdout at /dev/null so the interpreter's final flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141  # 128 + SIGPIPE, what a command killed by the broken pipe would report
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
