"""Progress for engine builds and large writes: a tqdm bar on a TTY, log lines otherwise.

Everything is also logged to the ``pyrt.export`` logger, so a pipeline without
a terminal still sees what happens and how long it took. With a
:class:`~pyrt.export.stage_meter.StageMeter` (``pyrt export``), each task names its stage
(load, export, build, write) and the meter keeps each stage's time and memory.

>>> with Progress(enabled=False).task("writing", total=10, unit="B") as t:
...     t.update(10)
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from pyrt.errors import ExportError
from pyrt.export.stage_meter import StageMeter

log = logging.getLogger("pyrt.export")
_LOG_STEP = 0.25  # log every quarter of a large task when there is no bar
_LARGE = 64 << 20  # "large": worth intermediate log lines


class Progress:
    """``enabled``: None = bar when stderr is a TTY, True = always a bar, False = log only.
    ``stages``: a meter that each task with a ``stage`` enters."""

    def __init__(self, enabled: bool | None = None, stages: StageMeter | None = None) -> None:
        if enabled is not None and not isinstance(enabled, bool):
            raise ExportError(f"progress={enabled!r} must be None, True or False")
        self.bars = _tty() if enabled is None else enabled
        self.stages = stages

    @classmethod
    def of(cls, value: Any) -> Progress:
        """``value`` itself when it is a Progress (an export's stages share one), else ``Progress(value)``."""
        return value if isinstance(value, Progress) else cls(value)

    def task(self, desc: str, total: int | None = None, unit: str = "it", stage: str | None = None) -> _Task:
        if stage is not None and self.stages is not None:
            self.stages.enter(stage)
        return _Task(desc, total, unit, self.bars)


class _Task:
    def __init__(self, desc: str, total: int | None, unit: str, bars: bool) -> None:
        self.desc, self.total, self.unit = desc, total, unit
        self.done, self.started, self.next_log = 0, time.perf_counter(), _LOG_STEP
        self.bar = _make_bar(desc, total, unit) if bars else None
        log.info("%s%s", desc, f" ({_fmt(total, unit)})" if total else "")

    def update(self, n: int) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.total and self.total >= _LARGE and self.next_log * self.total <= self.done < self.total:
            log.info("%s: %d%%", self.desc, int(100 * self.done / self.total))
            while self.next_log * self.total <= self.done:
                self.next_log += _LOG_STEP

    def note(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(text)
        log.debug("%s: %s", self.desc, text)

    def __enter__(self) -> _Task:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if self.bar is not None:
            self.bar.close()
        seconds = time.perf_counter() - self.started
        if exc_type is None:
            log.info("%s: done in %.2f s", self.desc, seconds)


def _tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _make_bar(desc: str, total: int | None, unit: str) -> Any:
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    scale = unit == "B"
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=scale, unit_divisor=1024 if scale else 1000,
                leave=False, file=sys.stderr)


def _fmt(n: int | None, unit: str) -> str:
    if n is None:
        return ""
    if unit != "B":
        return f"{n} {unit}"
    size = float(n)
    for suffix in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or suffix == "GiB":
            return f"{size:.0f} {suffix}" if suffix == "B" else f"{size:.1f} {suffix}"
        size /= 1024
    return f"{n} B"
