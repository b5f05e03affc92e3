"""Generation timings: prefill, time to first token, decode rate."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Timings:
    """``prefill_ms``: the prompt's forward call(s); ``ttft_ms``: start to the first new token;
    ``decode_tokens_per_s``: new tokens after the first per second of their forward calls
    (0.0 when fewer than two tokens came); ``total_ms``: the whole generation."""

    prompt_tokens: int
    new_tokens: int
    prefill_ms: float
    ttft_ms: float
    decode_ms: float
    decode_tokens_per_s: float
    total_ms: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        return (f"prompt {self.prompt_tokens} tokens, prefill {self.prefill_ms:.2f} ms, first token "
                f"{self.ttft_ms:.2f} ms, {self.new_tokens} new tokens, decode {self.decode_tokens_per_s:.1f} tokens/s")


class Clock:
    """Marks taken during one generation (``time.perf_counter``), from ``start`` (default: now; a generation's
    clock starts when its caller submitted it)."""

    def __init__(self, start: float | None = None) -> None:
        self.start = time.perf_counter() if start is None else start
        self.prefilled = self.first = self.end = self.start

    @staticmethod
    def now() -> float:
        return time.perf_counter()

    def timings(self, prompt: int, new: int) -> Timings:
        decode = max(self.end - self.first, 0.0)
        rate = (new - 1) / decode if new > 1 and decode > 0 else 0.0
        return Timings(prompt, new, (self.prefilled - self.start) * 1e3, (self.first - self.start) * 1e3,
                       decode * 1e3, rate, (self.end - self.start) * 1e3)
