"""What generation hands back: each step's :class:`Update` of a generation, and its final :class:`GenerationResult`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pyrt.llm.timings import Timings

FinishReason = Literal["stop", "length", "cache_full", "cancelled"]


@dataclass
class GenerationResult:
    """``tokens``: the new ids (an EOS that stopped generation included, as ``transformers`` does).
    ``passes``: the target's forward calls that gave it tokens; ``drafted`` / ``accepted``: the guessed
    tokens checked / kept (speculative decoding; 0 without a draft). ``logprobs``: a
    :class:`pyrt.llm.processors.TokenLogprob` per new token when the parameters asked (else None).
    ``cached_tokens``: the prompt's first tokens its KV-cache slot held already, not fed again (prefix caching;
    0 without a match)."""

    tokens: list[int]
    finish_reason: FinishReason
    timings: Timings
    prompt: list[int] = field(default_factory=list)
    passes: int = 0
    drafted: int = 0
    accepted: int = 0
    logprobs: list[Any] | None = None
    prompt_logprobs: list[Any] | None = None  # per prompt token (the first None), when the parameters asked
    cached_tokens: int = 0

    @property
    def cumulative_logprob(self) -> float | None:
        """The sum of the new tokens' log-probabilities (None when they were not computed)."""
        return None if self.logprobs is None else float(sum(t.logprob for t in self.logprobs))

    @property
    def tokens_per_pass(self) -> float:
        """New tokens per forward call of the target that gave some (1.0 without a draft)."""
        return len(self.tokens) / self.passes if self.passes else 0.0

    @property
    def acceptance_rate(self) -> float:
        """The share of guessed tokens the target kept (0.0 when none were guessed)."""
        return self.accepted / self.drafted if self.drafted else 0.0


@dataclass(frozen=True)
class Update:
    """What the core did to one generation: ``accepted`` (its submission is queued: the first update of each), its
    new ``tokens`` (``at``: ``time.perf_counter()`` when they came; ``logprobs``: theirs, where asked), and once it
    ended, its ``result`` or the error that ended it (``error``: a run failure, or the refusal of its submission)."""

    seq_id: int
    tokens: tuple[int, ...] = ()
    at: float = 0.0
    result: GenerationResult | None = None
    error: BaseException | None = None
    logprobs: tuple[Any, ...] = ()
    prompt_logprobs: tuple[Any, ...] = ()  # with the first new tokens: the prompt's, where asked
    accepted: bool = False

    @property
    def final(self) -> bool:
        return self.result is not None or self.error is not None
