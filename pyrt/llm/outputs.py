"""What generation hands back: each step's :class:`Update` of a generation, and its final :class:`GenerationResult`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pyrt.llm.timings import Timings

FinishReason = Literal["stop", "length", "cache_full", "cancelled"]


@dataclass
class GenerationResult:
    """``tokens``: the new ids (an EOS that stopped generation included, as ``transformers`` does)."""

    tokens: list[int]
    finish_reason: FinishReason
    timings: Timings
    prompt: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Update:
    """What a step did to one generation: its new ``tokens`` (``at``: ``time.perf_counter()`` when they
    came), and once it ended, its ``result`` or the run failure that ended it (``error``)."""

    seq_id: int
    tokens: tuple[int, ...] = ()
    at: float = 0.0
    result: GenerationResult | None = None
    error: BaseException | None = None

    @property
    def final(self) -> bool:
        return self.result is not None or self.error is not None
