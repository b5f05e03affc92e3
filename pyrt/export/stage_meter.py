"""An export's stages (load, export, build, write): each one's time and host memory, one bar each.

:class:`StageMeter` is entered stage by stage; a thread samples the process's resident memory
(``/proc/self/statm``) every 50 ms while a stage runs, so each stage keeps its own peak, and the
process peak (``ru_maxrss``) makes it exact whenever the stage set a new one. With bars on, each
stage shows a tqdm line with its elapsed time, current RSS and peak, left on screen when it ends;
without, each ending is a log line on ``pyrt.export``.

>>> meter = StageMeter(bars=False)
>>> meter.enter("load"); meter.enter("export")
>>> [r.name for r in meter.close()]
['load', 'export']
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

log = logging.getLogger("pyrt.export")
STAGES = ("load", "export", "build", "write")
INTERVAL = 0.05  # seconds between RSS samples
REDRAW = 10  # samples between redraws of a bar


@dataclass(frozen=True)
class StageRecord:
    """One stage: wall seconds, RSS at its end and the highest RSS while it ran (bytes; None off Linux)."""

    name: str
    seconds: float
    rss_bytes: int | None
    peak_bytes: int | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        return f"{self.name}: {self.seconds:.1f} s, RSS {gib(self.rss_bytes)}, peak {gib(self.peak_bytes)}"


def gib(n: int | None) -> str:
    """``n`` bytes as GiB text ("-" when unknown)."""
    return "-" if n is None else f"{n / (1 << 30):.2f} GiB"


def rss_bytes() -> int | None:
    """This process's resident memory now (Linux ``/proc/self/statm``); None elsewhere."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def peak_rss_bytes() -> int | None:
    """This process's peak resident memory so far (``ru_maxrss``); None where unknown."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


class StageMeter:
    """Time and memory per stage; ``bars``: a tqdm line per stage (else log lines)."""

    def __init__(self, bars: bool) -> None:
        self.bars, self.lock = bars, threading.Lock()
        self.records: list[StageRecord] = []
        self.name: str | None = None
        self.started = self.peak_at_start = 0.0
        self.stage_peak: int | None = None
        self.bar: Any = None
        self.stop = threading.Event()
        self.sampler: threading.Thread | None = None

    def enter(self, name: str) -> None:
        """End the running stage (if another) and start ``name``; entering the running stage does nothing."""
        with self.lock:
            if name == self.name:
                return
            self._end()
            self.name, self.started, self.stage_peak = name, time.perf_counter(), rss_bytes()
            self.peak_at_start = float(peak_rss_bytes() or 0)
            self.bar = _bar(name) if self.bars else None
        if self.sampler is None:
            self.sampler = threading.Thread(target=self._sample, name="pyrt-export-memory", daemon=True)
            self.sampler.start()

    def close(self) -> list[StageRecord]:
        """End the running stage and the sampler; returns every stage's record, in order."""
        self.stop.set()
        if self.sampler is not None:
            self.sampler.join()
        with self.lock:
            self._end()
        return list(self.records)

    def _sample(self) -> None:
        count = 0
        while not self.stop.wait(INTERVAL):
            now, count = rss_bytes(), count + 1
            with self.lock:
                if now is not None and self.name is not None:
                    self.stage_peak = max(self.stage_peak or 0, now)
                    if self.bar is not None and count % REDRAW == 0:
                        self.bar.set_postfix_str(f"RSS {gib(now)}, peak {gib(self.stage_peak)}")

    def _end(self) -> None:
        if self.name is None:
            return
        peak, now = peak_rss_bytes(), rss_bytes()
        stage_peak = max(self.stage_peak or 0, now or 0) or None
        if peak is not None and peak > self.peak_at_start:  # this stage raised the process peak: exact
            stage_peak = max(stage_peak or 0, peak)
        record = StageRecord(self.name, time.perf_counter() - self.started, now, stage_peak)
        self.records.append(record)
        if self.bar is not None:
            self.bar.set_postfix_str(f"RSS {gib(now)}, peak {gib(stage_peak)}")
            self.bar.close()
        log.info("stage %s", record)
        self.name, self.bar = None, None


def _bar(name: str) -> Any:
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(desc=f"{name:<6}", total=None, file=sys.stderr, leave=True,
                bar_format="{desc} {elapsed}{postfix}")
