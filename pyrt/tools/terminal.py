"""How the ``pyrt`` command line talks to the terminal: exit statuses, ``pyrt: error:``
messages on stderr (coloured only on a terminal without ``NO_COLOR``), warnings routed
there, and tqdm progress bars.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Iterator
from typing import Any, TextIO

from pyrt.logs import warning_to_log

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_PIPE = 0, 1, 2, 130, 141


def _colour(stream: TextIO) -> bool:
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def say(kind: str, message: str) -> None:
    """``pyrt: error: message`` on stderr (the label coloured on a terminal)."""
    codes = {"error": "1;31", "warning": "1;33", "note": "1;36"}
    label = f"\033[{codes[kind]}m{kind}:\033[0m" if _colour(sys.stderr) else f"{kind}:"
    print(f"pyrt: {label} {message}", file=sys.stderr)


@contextlib.contextmanager
def warnings_to_stderr() -> Iterator[None]:
    """pyrt's own warnings as ``pyrt: warning: ...``; other libraries' to the ``pyrt.third_party`` log (shown with
    ``--verbose``), never labelled pyrt's (:func:`pyrt.logs.warning_to_log`)."""
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        warnings.showwarning = warning_to_log(lambda message, *a, **k: say("warning", str(message)))
        yield


def progress_bar(enabled: bool) -> Any:
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
