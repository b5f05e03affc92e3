"""The handle a caller holds for one generation (:class:`Generation`), and the queue that feeds it (:class:`Outbox`).

The thread that steps the engine core puts each :class:`~pyrt.llm.outputs.Update` of a generation
into its outbox (a ``queue.SimpleQueue``, safe to put into from a finalizer); the handle takes
them from there. Iterating a handle yields the new token ids as they come, waiting on its outbox
while the core's thread steps. A handle is read by one thread at a time (the one that iterates
it, or an event loop through :meth:`Generation.take`); any thread may cancel it. A generation
whose handle is dropped unfinished is cancelled: the drop posts a cancellation to the core, which
applies it at its next step and frees the slot.
"""

from __future__ import annotations

import logging
import queue
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from pyrt.llm.core import Cancel
from pyrt.llm.outputs import FinishReason, GenerationResult, Update

log = logging.getLogger("pyrt.llm")


class Outbox:
    """One generation's updates: put by the stepping thread, taken by its handle (``listener``: called after each
    put, on the stepping thread, e.g. to wake an event loop; one that raises is logged, not propagated)."""

    def __init__(self) -> None:
        self._items: queue.SimpleQueue[Update] = queue.SimpleQueue()
        self._listener: Callable[[], None] | None = None
        self.ended = False  # its last update has been put

    def put(self, update: Update) -> None:
        self._items.put(update)
        self.ended = self.ended or update.final
        listener = self._listener
        if listener is not None:
            try:
                listener()
            except Exception:  # the stepping thread serves every generation: a listener's bug stays its own
                log.exception("an update listener failed")

    def ready(self) -> bool:
        """Whether an update is waiting."""
        return not self._items.empty()

    def take(self) -> list[Update]:
        """The updates waiting (maybe none); never blocks."""
        return drain(self._items)

    def wait(self, timeout: float | None = None) -> list[Update]:
        """The updates waiting, after waiting for the first up to ``timeout`` seconds (None: as long as it takes)."""
        try:
            first = self._items.get(timeout=timeout)
        except queue.Empty:
            return []
        return [first, *self.take()]

    def listen(self, listener: Callable[[], None]) -> None:
        self._listener = listener


def drain(items: queue.SimpleQueue[Any]) -> list[Any]:
    """Everything ``items`` holds now, in order (maybe nothing); never blocks."""
    out = []
    while True:
        try:
            out.append(items.get_nowait())
        except queue.Empty:
            return out


def wait_all(handles: Sequence[Generation]) -> None:
    """Block until every one of ``handles`` (generations of one core) has ended, stepping the core on this thread
    while no other thread steps it (``pyrt.generate``'s way: no handoff between threads per token)."""
    if handles:
        handles[0]._core.run_until(lambda: all(h._outbox.ended for h in handles))
    for handle in handles:
        handle.wait()


class Poster(Protocol):
    """Where a handle posts its cancellation, and whose core a waiting handle steps while no other thread does: its
    engine core's loop (:class:`pyrt.llm.stepping.CoreLoop`)."""

    def post(self, command: Any) -> None: ...

    def run_until(self, ready: Callable[[], bool], deadline: float | None = None) -> bool: ...


class Generation:
    """An iterator of new token ids as they come; :attr:`result` once it is exhausted.

    ``tokens``: every new id so far; ``done``; ``cancel()`` ends it at the core's next step
    (``finish_reason == "cancelled"``, the tokens so far kept). A run failure (or the refusal of its
    submission) is raised where the iteration reaches it. :meth:`take` and :meth:`on_update` serve
    readers that must not block (an event loop).
    """

    def __init__(self, core: Poster, seq_id: int, prompt: tuple[int, ...], outbox: Outbox) -> None:
        self._core, self.id, self._prompt, self._outbox = core, seq_id, prompt, outbox
        self._tokens: list[int] = []
        self._times: list[float] = []
        self._logprobs: list[Any] = []
        self._prompt_logprobs: list[Any] = []
        self._read = 0
        self._accepted = False
        self._result: GenerationResult | None = None
        self._error: BaseException | None = None
        self._finalizer = weakref.finalize(self, core.post, Cancel(seq_id))

    def __iter__(self) -> Iterator[int]:
        return self

    def __next__(self) -> int:
        self._apply(self._outbox.take())
        while True:
            if self._read < len(self._tokens):
                self._read += 1
                return self._tokens[self._read - 1]
            if self._error is not None:
                raise self._error
            if self._result is not None:
                raise StopIteration
            self._wait_for(lambda: self._read < len(self._tokens) or self._ended(), self._outbox.ready, None)

    def _apply(self, updates: list[Update]) -> None:
        for update in updates:
            self._accepted = self._accepted or update.accepted
            self._tokens.extend(update.tokens)
            self._times.extend([update.at] * len(update.tokens))
            self._logprobs.extend(update.logprobs)
            self._prompt_logprobs.extend(update.prompt_logprobs)
            if update.final:
                self._result, self._error = update.result, update.error
                self._finalizer.detach()

    def _ended(self) -> bool:
        return self._result is not None or self._error is not None

    def wait_accepted(self, timeout: float | None = None) -> bool:
        """Block until the core has queued the submission or ended it (a refusal is then :attr:`error`); True when
        it has."""
        return self._wait_for(lambda: self._accepted or self._ended(), self._outbox.ready, timeout)

    def take(self) -> list[int]:
        """The new ids not yet taken here or by iteration (maybe none); never blocks."""
        self._apply(self._outbox.take())
        new = self._tokens[self._read:]
        self._read = len(self._tokens)
        return new

    def on_update(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` on the stepping thread after each update of this generation (its acceptance, new
        tokens, its end); updates that came before are waiting for :meth:`take`."""
        self._outbox.listen(listener)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the generation ends; True when it has."""
        return self._wait_for(self._ended, lambda: self._outbox.ended, timeout)

    def _wait_for(self, done: Callable[[], bool], stepped: Callable[[], bool], timeout: float | None) -> bool:
        """Block until ``done()`` (True) or ``timeout`` (False): stepping the core on this thread until ``stepped()``
        while no other thread steps it, else waiting for this generation's next updates."""
        self._apply(self._outbox.take())
        deadline = None if timeout is None else time.monotonic() + timeout
        while not done():
            if deadline is not None and deadline <= time.monotonic():
                return False
            self._core.run_until(stepped, deadline)
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._apply(self._outbox.wait(left))
        return True

    def _state(self) -> tuple[list[int], GenerationResult | None, BaseException | None]:
        self._apply(self._outbox.take())
        return self._tokens, self._result, self._error

    @property
    def accepted(self) -> bool:
        """Whether the core has queued it (False until then, and after a refusal)."""
        self._apply(self._outbox.take())
        return self._accepted

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
        self._apply(self._outbox.take())
        return list(self._times)

    @property
    def logprobs(self) -> list[Any]:
        """Each new token's :class:`pyrt.llm.processors.TokenLogprob` so far (empty unless the parameters ask)."""
        self._apply(self._outbox.take())
        return list(self._logprobs)

    @property
    def prompt_logprobs(self) -> list[Any]:
        """The prompt tokens' log-probabilities (the first None) once the first new token came (``prompt_logprobs``)."""
        self._apply(self._outbox.take())
        return list(self._prompt_logprobs)

    @property
    def prompt(self) -> list[int]:
        return list(self._prompt)

    def cancel(self, reason: FinishReason = "cancelled") -> None:
        """End the generation at the core's next step, its tokens so far kept (from any thread)."""
        self._core.post(Cancel(self.id, reason))


__all__ = ["Generation", "Outbox", "drain", "wait_all"]
