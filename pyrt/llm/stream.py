"""The handle a caller holds for one generation (:class:`Generation`), and the queue that feeds it (:class:`Outbox`).

The thread that steps the engine puts each :class:`~pyrt.llm.outputs.Update` of a generation
into its outbox; the handle takes them from there. Iterating a handle yields the new token ids
as they come: it steps the engine itself when no thread runs it (a caller alone with its
streams needs no thread), else waits for the thread that does. A generation whose handle is
dropped unfinished is cancelled, freeing its slot.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from pyrt.llm.outputs import FinishReason, GenerationResult, Update


class Outbox:
    """One generation's updates: put by the stepping thread, taken by its handle (``listener``: called after
    each put, on the stepping thread, e.g. to wake an event loop)."""

    def __init__(self) -> None:
        self._items: deque[Update] = deque()
        self._ready = threading.Condition(threading.Lock())
        self._listener: Callable[[], None] | None = None

    def put(self, update: Update) -> None:
        with self._ready:
            self._items.append(update)
            self._ready.notify_all()
            listener = self._listener
        if listener is not None:
            listener()

    def take(self) -> list[Update]:
        with self._ready:
            items = list(self._items)
            self._items.clear()
            return items

    def pause(self, timeout: float) -> None:
        """Return when an update is there, or after ``timeout`` seconds."""
        with self._ready:
            if not self._items:
                self._ready.wait(timeout)

    def listen(self, listener: Callable[[], None]) -> None:
        with self._ready:
            self._listener = listener


class Driver(Protocol):
    """What a :class:`Generation` needs of the engine that runs it (:class:`pyrt.llm.Engine`)."""

    def advance(self, outbox: Outbox) -> None: ...

    def abort(self, seq_id: int, reason: FinishReason) -> None: ...


class Generation:
    """An iterator of new token ids as they come; :attr:`result` once it is exhausted.

    ``tokens``: every new id so far; ``done``; ``cancel()`` ends it at the engine's next step
    (``finish_reason == "cancelled"``, the tokens so far kept). A run failure is raised where the
    iteration reaches it. :meth:`take` and :meth:`on_update` serve readers that must not block
    (an event loop).
    """

    def __init__(self, engine: Driver, seq_id: int, prompt: tuple[int, ...], outbox: Outbox) -> None:
        self._engine, self.id, self._prompt, self._outbox = engine, seq_id, prompt, outbox
        self._tokens: list[int] = []
        self._times: list[float] = []
        self._logprobs: list[Any] = []
        self._prompt_logprobs: list[Any] = []
        self._read = 0
        self._result: GenerationResult | None = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._finalizer = weakref.finalize(self, engine.abort, seq_id, "cancelled")

    def __iter__(self) -> Iterator[int]:
        return self

    def __next__(self) -> int:
        while True:
            with self._lock:
                self._apply()
                if self._read < len(self._tokens):
                    self._read += 1
                    return self._tokens[self._read - 1]
                if self._error is not None:
                    raise self._error
                if self._result is not None:
                    raise StopIteration
            self._engine.advance(self._outbox)

    def _apply(self) -> None:
        """Take the updates waiting in the outbox (under ``self._lock``)."""
        for update in self._outbox.take():
            self._tokens.extend(update.tokens)
            self._times.extend([update.at] * len(update.tokens))
            self._logprobs.extend(update.logprobs)
            self._prompt_logprobs.extend(update.prompt_logprobs)
            if update.final:
                self._result, self._error = update.result, update.error
                self._finalizer.detach()

    def take(self) -> list[int]:
        """The new ids not yet taken here or by iteration (maybe none); never blocks, never steps."""
        with self._lock:
            self._apply()
            new = self._tokens[self._read:]
            self._read = len(self._tokens)
            return new

    def on_update(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` on the stepping thread after each update of this generation (new tokens, its end)."""
        self._outbox.listen(listener)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the generation ends (stepping the engine when no thread runs it); True when it has."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.done:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            self._engine.advance(self._outbox)
        return True

    def _state(self) -> tuple[list[int], GenerationResult | None, BaseException | None]:
        with self._lock:
            self._apply()
            return self._tokens, self._result, self._error

    @property
    def result(self) -> GenerationResult | None:
        return self._state()[1]

    @property
    def error(self) -> BaseException | None:
        return self._state()[2]

    @property
    def done(self) -> bool:
        _, result, error = self._state()
        return result is not None or error is not None

    @property
    def tokens(self) -> list[int]:
        return list(self._state()[0])

    @property
    def token_times(self) -> list[float]:
        """``time.perf_counter()`` when each new token came (as the stepping thread produced it)."""
        with self._lock:
            self._apply()
            return list(self._times)

    @property
    def logprobs(self) -> list[Any]:
        """Each new token's :class:`pyrt.llm.processors.TokenLogprob` so far (empty unless the parameters ask)."""
        with self._lock:
            self._apply()
            return list(self._logprobs)

    @property
    def prompt_logprobs(self) -> list[Any]:
        """The prompt tokens' log-probabilities (the first None) once the first new token came (``prompt_logprobs``)."""
        with self._lock:
            self._apply()
            return list(self._prompt_logprobs)

    @property
    def prompt(self) -> list[int]:
        return list(self._prompt)

    def cancel(self, reason: FinishReason = "cancelled") -> None:
        """End the generation at the engine's next step (at once when nothing steps), its tokens so far kept."""
        self._engine.abort(self.id, reason)
