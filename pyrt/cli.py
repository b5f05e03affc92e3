"""The ``pyrt`` command line.

    pyrt inspect model.pte                    # readable report
    pyrt inspect --json model.pte             # the same data as pyrt.inspect()
    pyrt inspect model.pte --data model.ptd   # and which tensors live in which file
    pyrt inspect model.ptd                    # a data file's entries
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from pyrt.errors import PyrtError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pyrt", description="TensorRT-accelerated ExecuTorch programs from Python")
    sub = parser.add_subparsers(dest="command", required=True)
    insp = sub.add_parser("inspect", help="describe a .pte (or .ptd) file")
    insp.add_argument("path", help="the .pte file, or a .ptd data file")
    insp.add_argument("--data", action="append", metavar="PTD", help="a .ptd file of the program (repeatable)")
    insp.add_argument("--json", action="store_true", help="print JSON (the pyrt.inspect() dict)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from pyrt.report import format_report, inspect

    try:
        info = inspect(args.path, data=args.data)
    except PyrtError as exc:
        print(f"pyrt: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(info, indent=2) if args.json else format_report(info))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
