"""One generation's state (:class:`Sequence`) and the handle its caller holds (:class:`Generation`).

A :class:`Generation` iterates the new token ids as they come and has :attr:`~Generation.result`
once the generation ends. Iterating one runs the engine's steps when nobody else is running
them (a caller alone with its streams needs no thread), or waits for the thread that is. A
generation whose handle is dropped unfinished is cancelled at its engine's next step, freeing
its slot.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from pyrt.llm.request import Request
from pyrt.llm.timings import Clock, Timings

FinishReason = Literal["stop", "length", "cache_full", "cancelled"]


@dataclass
class GenerationResult:
    """``tokens``: the new ids (an EOS that stopped generation included, as ``transformers`` does)."""

    tokens: list[int]
    finish_reason: FinishReason
    timings: Timings
    prompt: list[int] = field(default_factory=list)


class Sequence:
    """A generation inside an engine: its request, slot, tokens fed so far, new tokens, random state."""

    def __init__(self, request: Request, seed: int | None) -> None:
        self.request = request
        self.prompt = list(request.prompt)
        self.new: list[int] = []
        self.unread: deque[int] = deque()
        self.slot: int | None = None
        self.fed = 0  # tokens of prompt + new already written to the cache
        self.rng = np.random.default_rng(seed)
        self.clock = Clock()
        self.result: GenerationResult | None = None
        self.error: BaseException | None = None
        self.cancel_reason: FinishReason | None = None
        self.listeners: list[Callable[[Sequence], None]] = []

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None

    @property
    def next_position(self) -> int:
        """The cache position the last new token will take when it is fed."""
        return len(self.prompt) + len(self.new) - 1

    def finish(self, reason: FinishReason) -> None:
        self.clock.end = self.clock.now()
        timings = self.clock.timings(len(self.prompt), len(self.new))
        self.result = GenerationResult(list(self.new), reason, timings, list(self.prompt))

    def notify(self) -> None:
        for listener in list(self.listeners):
            listener(self)


class Driver(Protocol):
    """What a :class:`Generation` needs of the engine that runs it (:class:`pyrt.llm.Engine`)."""

    @property
    def lock(self) -> AbstractContextManager[Any]:
        """Guards every Sequence of the engine (re-entrant)."""

    def drive(self) -> None: ...

    def cancel(self, stream: Generation, reason: FinishReason = "cancelled") -> None: ...

    def drop(self, seq: Sequence) -> None: ...

    def wait_for(self, seq: Sequence, timeout: float | None) -> bool: ...


class Generation:
    """An iterator of new token ids as they come; :attr:`result` once it is exhausted.

    ``tokens``: every new id so far; ``done``; ``cancel()`` ends it at the engine's next step
    (``finish_reason == "cancelled"``, the tokens so far kept). A run failure is raised where the
    iteration reaches it.
    """

    def __init__(self, engine: Driver, sequence: Sequence) -> None:
        self._engine, self._seq = engine, sequence
        self._finalizer = weakref.finalize(self, engine.drop, sequence)

    def __iter__(self) -> Iterator[int]:
        return self

    def __next__(self) -> int:
        while True:
            with self._engine.lock:
                if self._seq.unread:
                    return self._seq.unread.popleft()
                if self._seq.error is not None:
                    raise self._seq.error
                if self._seq.result is not None:
                    raise StopIteration
            self._engine.drive()

    @property
    def result(self) -> GenerationResult | None:
        return self._seq.result

    @property
    def error(self) -> BaseException | None:
        return self._seq.error

    @property
    def done(self) -> bool:
        return self._seq.done

    @property
    def tokens(self) -> list[int]:
        with self._engine.lock:
            return list(self._seq.new)

    @property
    def prompt(self) -> list[int]:
        return list(self._seq.prompt)

    def cancel(self) -> None:
        self._engine.cancel(self)

    def add_listener(self, listener: Callable[[Sequence], None]) -> None:
        """Call ``listener(sequence)`` on the stepping thread after each new token and when it ends."""
        with self._engine.lock:
            self._seq.listeners.append(listener)
            if self._seq.done:
                listener(self._seq)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the generation ends (driving the engine when nobody else is); True when it has."""
        return self._engine.wait_for(self._seq, timeout)

    @property
    def sequence(self) -> Sequence:
        """The engine's record of this generation (read it under ``engine.lock``)."""
        return self._seq
