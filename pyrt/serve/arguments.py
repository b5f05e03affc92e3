"""The argparse types of pyrt's command lines (``pyrt serve``, ``python -m pyrt.serve.ingress``, the ``pyrt``
parser of :mod:`pyrt.tools.cli_args`): a bad value is argparse's usage error naming it (exit status 2), and so is
a flag given without the flag it needs (:class:`Parser`, :func:`needs`).

>>> seconds_argument("2.5"), whole_argument(1)("8")
(2.5, 8)
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from typing import Any

NEEDS = "_pyrt_needs"  # the namespace attribute holding a command's (flag, flag it needs) rules


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose commands may say which flags need another (:func:`needs`): one given without it is
    a usage error naming both (exit status 2), as argparse's own are; its subparsers are Parsers too.

    >>> p = Parser(prog="pyrt export", exit_on_error=False)
    >>> _ = p.add_argument("--quantize"); _ = p.add_argument("--group-size", type=int)
    >>> needs(p, ("group_size", "quantize"))
    >>> p.parse_args(["--group-size", "64", "--quantize", "int4"]).group_size
    64
    """

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        for flag, needed in getattr(parsed, NEEDS, ()):
            if _given(getattr(parsed, flag, None)) and not _given(getattr(parsed, needed, None)):
                self.error(f"{_spelled(flag)} needs {_spelled(needed)} (without it, it would do nothing)")
        return parsed, extras


def needs(parser: argparse.ArgumentParser, *rules: tuple[str, str]) -> None:
    """Each ``(flag, needed)`` (argparse dests): ``flag`` given without ``needed`` is refused (:class:`Parser`)."""
    parser.set_defaults(**{NEEDS: tuple(rules)})


def _given(value: Any) -> bool:
    return value is not None and value is not False


def _spelled(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def whole_argument(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number >= ``low`` (and <= ``high``; the usage error says which bounds).

    >>> whole_argument(1)("3"), whole_argument(1, 65535)("65535")
    (3, 65535)
    """
    wanted = f">= {low}" if high is None else f"from {low} to {high}"

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = low - 1
        if n < low or (high is not None and n > high):
            raise argparse.ArgumentTypeError(f"expected a whole number {wanted}, got {text!r}")
        return n
    return parse


PORT = whole_argument(1, 65535)  # a TCP port


def float_argument(wanted: str, ok: Callable[[float], bool]) -> Callable[[str], float]:
    """An argparse type: a number for which ``ok`` holds; the usage error says it expected ``wanted``.

    >>> float_argument("a number > 0", lambda x: x > 0)("2.5")
    2.5
    """
    def parse(text: str) -> float:
        try:
            x = float(text)
        except ValueError:
            x = math.nan  # fails every ``ok`` written as a comparison
        if not ok(x):
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}")
        return x
    return parse


number_argument = float_argument("a number >= 0", lambda x: x >= 0)
seconds_argument = float_argument("a number of seconds > 0", lambda x: 0 < x < math.inf)  # finite
