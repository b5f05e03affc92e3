"""pyrt's logging: its own messages on ``pyrt.*`` loggers, third-party chatter kept out of sight.

pyrt's library code only logs (stdlib :mod:`logging`, loggers named ``pyrt.*``); the
application decides what is shown. Two helpers:

- :func:`configure`, for processes pyrt owns (the ``pyrt`` command, ``examples/demo.py``):
  a stderr handler on the ``pyrt`` logger, at the level ``--verbose`` or ``$PYRT_LOG``
  (``debug``, ``info``, ``warning``, ``error``) asks for; warnings by default.
- :func:`third_party_quiet`, around pyrt's own calls into torch.export, torch.onnx,
  ExecuTorch, torchao and TensorRT: their log records below ``ERROR`` are not emitted
  (their loggers' levels are raised for the duration) and their Python warnings go to the
  ``pyrt.third_party`` logger at ``DEBUG`` instead of the terminal (a broken optional
  torchao extension, deprecations inside torch's pytree, ...). Nothing is held back when
  the ``pyrt`` logger is enabled for ``DEBUG`` (``--verbose``, ``PYRT_LOG=debug``, or an
  application's own configuration): then all of it shows as usual. TensorRT's own logger
  is routed into ``pyrt.tensorrt`` (``pyrt.device.tensorrt_seam``): its warnings and
  information at ``DEBUG``, its errors at ``ERROR`` and in the raised error's message.

>>> level_from_env({"PYRT_LOG": "Debug"}) == logging.DEBUG
True
>>> level_from_env({}) is None
True
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pyrt.errors import PyrtError

ENV = "PYRT_LOG"
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
# Loggers of the libraries pyrt calls while exporting (each covers its children).
THIRD_PARTY = ("torch", "torchao", "executorch", "onnx", "onnxscript", "onnx_ir", "transformers", "tensorrt",
               "tensorrt_rtx")
_HANDLER_NAME = "pyrt.logs.configure"
_PACKAGE = str(Path(__file__).resolve().parent)

log = logging.getLogger("pyrt.third_party")


def level_from_env(environ: Mapping[str, str]) -> int | None:
    """The level ``$PYRT_LOG`` names (None when unset); a ``PyrtError`` naming a value it does not know."""
    value = environ.get(ENV, "").strip()
    if not value:
        return None
    if value.lower() not in LEVELS:
        raise PyrtError(f"{ENV}={value!r}: expected one of {', '.join(LEVELS)}")
    return LEVELS[value.lower()]


class _Stderr(logging.StreamHandler):
    """A handler writing to whatever ``sys.stderr`` is when a record comes (as ``logging.lastResort``)."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def configure(verbose: bool = False, environ: Mapping[str, str] | None = None) -> int:
    """Show pyrt's log on stderr at ``--verbose``'s or ``$PYRT_LOG``'s level (else WARNING); returns the level.

    Idempotent: a second call replaces the handler the first one added.
    """
    level = logging.DEBUG if verbose else level_from_env(os.environ if environ is None else environ)
    level = logging.WARNING if level is None else level
    root = logging.getLogger("pyrt")
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(old)
    handler = _Stderr()
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(logging.Formatter("%(name)s: %(levelname)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(level)
    return level


def reset() -> None:
    """Undo :func:`configure`: its handler removed, the ``pyrt`` logger's level back to NOTSET."""
    root = logging.getLogger("pyrt")
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(old)
    root.setLevel(logging.NOTSET)


def _third_party_loggers() -> list[logging.Logger]:
    """Every logger of THIRD_PARTY's packages that sets its own level, and their roots."""
    known = [name for name in logging.Logger.manager.loggerDict if name.split(".")[0] in THIRD_PARTY]
    loggers = [logging.getLogger(name) for name in (*THIRD_PARTY, *known)]
    return [lg for lg in loggers if lg.name in THIRD_PARTY or lg.level != logging.NOTSET]


def warning_to_log(show: Any) -> Any:
    """A ``warnings.showwarning`` that shows pyrt's own warnings with ``show`` and sends every other library's
    to the ``pyrt.third_party`` logger at DEBUG (shown with ``--verbose``, never as pyrt's)."""
    def showwarning(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None,
                    line: str | None = None) -> None:
        if filename.startswith(_PACKAGE) or category.__module__.split(".")[0] == "pyrt":
            show(message, category, filename, lineno, file, line)  # pyrt's own warnings are not chatter
        else:
            log.debug("%s:%s: %s: %s", filename, lineno, category.__name__, message)

    return showwarning


class _RootGuard(logging.Handler):
    """Stands on a root logger that has no handler while pyrt calls third-party code.

    ExecuTorch's partitioner logs through ``logging.debug(...)``, which runs
    ``logging.basicConfig()`` on a root logger without handlers: every library's warnings
    would print from then on, pyrt's records twice. With this handler there, it does not.
    It passes what reaches the root on to stderr as ``logging.lastResort`` would (``show``;
    pyrt's own records excepted: pyrt's handler shows those), or drops it.
    """

    def __init__(self, show: bool) -> None:
        super().__init__()
        self.show = show

    def emit(self, record: logging.LogRecord) -> None:
        if self.show and not record.name.startswith("pyrt") and logging.lastResort is not None:
            if record.levelno >= logging.lastResort.level:
                logging.lastResort.handle(record)


@contextlib.contextmanager
def _root_guarded(show: bool) -> Iterator[None]:
    root = logging.getLogger()
    if root.handlers:
        yield
        return
    guard = _RootGuard(show)
    root.addHandler(guard)
    try:
        yield
    finally:
        root.removeHandler(guard)


@contextlib.contextmanager
def third_party_quiet() -> Iterator[None]:
    """Inside: third-party log records below ERROR are dropped, warnings go to ``pyrt.third_party`` at DEBUG.

    Not thread-safe in the way :func:`warnings.catch_warnings` is not; levels are restored on exit.
    """
    if logging.getLogger("pyrt").isEnabledFor(logging.DEBUG):
        with _root_guarded(show=True):
            yield
        return
    saved = [(lg, lg.level) for lg in _third_party_loggers()]
    with warnings.catch_warnings(), _root_guarded(show=False):
        warnings.showwarning = warning_to_log(warnings.showwarning)
        for lg, _ in saved:
            lg.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for lg, level in saved:
                lg.setLevel(level)
