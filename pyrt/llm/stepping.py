"""The one thread that steps a program's engine core, and the inbox every front end posts to.

A :class:`CoreLoop` is made once per (:class:`pyrt.Program`, method), kept with the Program
(:meth:`pyrt.Program.extension`, :func:`core_loop`): every :class:`pyrt.llm.Engine` and
``pyrt.generate`` call on that method is a front end of it, and their generations share each
forward call. How the one stepping thread is chosen: a caller that waits (``pyrt.generate``, iterating a
generation, :meth:`pyrt.llm.Engine.step`, a blocking submission) steps the core itself while no other
thread does (:meth:`CoreLoop.run_until`: no thread handoff per token, and no thread started at all
for a synchronous call); otherwise the loop starts a thread on the first command posted to it
(:meth:`CoreLoop.post`), or when a waiting caller stops stepping with work left for others. That
thread drains the inbox, calls :meth:`pyrt.llm.core.EngineCore.step` while there is work, publishes
the core's counters (:attr:`CoreLoop.published`), then hands each update to its generation's outbox;
with nothing to do (no work, or paused) and nothing posted, it ends, and the next command starts
another. So at most one thread steps a core at any moment (the one holding its turn), it is the only
thread that touches the core's state, and a Program nobody uses holds no thread. Front ends that do
not step wait on their own queues (a generation's outbox, a control command's reply), never on the
core. Closing the Program stops the loop (:meth:`CoreLoop.close`: every generation ends as
cancelled, later submissions are refused).

The re-entrant lock below is the only threading primitive in :mod:`pyrt.llm`: it makes "take the
turn when nobody has it" and "give the turn up when idle" one decision, so that no command is ever
left in an inbox with no thread to take it (a dropped handle's finalizer may post from inside the
stepping thread itself, hence re-entrant).

>>> loop = core_loop(pyrt.Program("m.pte"))                       # doctest: +SKIP
>>> loop.published.free_slots                                        # doctest: +SKIP
4
"""

from __future__ import annotations

import itertools
import logging
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from pyrt.errors import InputError, PyrtError
from pyrt.llm.core import Command, EngineCore, Snapshot, Stop
from pyrt.llm.program import engine_convention
from pyrt.llm.stream import drain
from pyrt.runtime.program import Program

log = logging.getLogger("pyrt.llm")
CLOSE_WAIT_S = 60.0  # Program.close waits this long for the step in flight


class CoreLoop:
    """``core`` and the thread that steps it (started by :meth:`post`, ended when idle)."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self.program, self.conv, self.source = core.program, core.conv, core.source
        self._inbox: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._ids = itertools.count(1)  # generation and front end ids (next() is atomic)
        self._turn = threading.RLock()  # starting / ending the stepping thread: one decision
        self._thread: threading.Thread | None = None
        self.published: Snapshot = core.snapshot()  # replaced whole after each step: read from any thread

    def new_id(self) -> int:
        return next(self._ids)

    @property
    def stepping_here(self) -> bool:
        """Whether the calling thread is the one stepping the core (it must not wait for the core's replies)."""
        return self._thread is threading.current_thread()

    def post(self, command: Command, start: bool = True) -> None:
        """Queue ``command`` for the core (from any thread, a finalizer included); start the thread if none runs
        (``start=False``: the caller steps the core itself next, :meth:`run_until`)."""
        self._inbox.put(command)
        if start:
            self._ensure_thread()

    def _ensure_thread(self) -> None:
        with self._turn:
            if self._thread is None:
                self._start_thread()

    def _start_thread(self) -> None:
        """Give the turn to a new stepping thread (the caller holds ``_turn``)."""
        self._thread = threading.Thread(target=self._run, name=f"pyrt-core-{self.source}", daemon=True)
        self._thread.start()

    def run_until(self, ready: Callable[[], bool], deadline: float | None = None) -> bool:
        """Step the core on the calling thread until ``ready()`` (or ``deadline``, a ``time.monotonic()`` value), if
        no other thread steps it; False at once when one does (the caller waits on its own queue). With nothing to
        do it waits for the next command (a Resume, say). On leaving with work left, a stepping thread takes over.

        PyrtError when called from the stepping thread (an update listener must not wait for the engine)."""
        me = threading.current_thread()
        with self._turn:
            if self._thread is me:
                raise PyrtError(f"{self.source}: a front end waited for its own engine core from the core's thread "
                                "(an update listener must not call the engine)")
            if self._thread is not None:
                return False
            self._thread = me
        try:
            while not ready():
                commands: list[Command] = drain(self._inbox)
                if not commands and not self.core.wants_step:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        break
                    try:
                        commands = [self._inbox.get(timeout=left)]
                    except queue.Empty:
                        break
                self._step(commands)
        finally:
            with self._turn:
                if self._inbox.empty() and not self.core.wants_step:
                    self._thread = None
                else:
                    self._start_thread()
        return True

    def call(self, make: Callable[[Any], Command], timeout: float | None = None) -> Any:
        """Post ``make(reply)`` and wait for the core's reply (its value), stepping the core meanwhile when no other
        thread does."""
        reply: queue.SimpleQueue[Any] = queue.SimpleQueue()
        deadline = None if timeout is None else time.monotonic() + timeout
        self._inbox.put(make(reply))
        if not self.run_until(lambda: not reply.empty(), deadline):
            self._ensure_thread()
        try:
            return reply.get(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise PyrtError(f"{self.source}: the engine core did not answer within {timeout} s (a step is still "
                            "running)") from None

    def close(self) -> None:
        """Stop the core (the Program closes): its generations end as cancelled; waits for the step in flight."""
        if self.stepping_here:
            self._inbox.put(Stop())
            return
        if sys.is_finalizing():  # interpreter shutdown: no thread runs any more, and nothing waits for the core
            return
        try:
            self.call(Stop, timeout=CLOSE_WAIT_S)
        except RuntimeError:  # interpreter shutdown: no new thread may start, and nothing waits any more
            pass

    def _run(self) -> None:
        me = threading.current_thread()
        while True:
            commands: list[Command] = drain(self._inbox)
            if not commands and not self.core.wants_step:
                if self._idle(me):
                    return
                continue
            self._step(commands)

    def _step(self, commands: list[Command]) -> None:
        """One core step on the thread holding the turn, then its updates handed over."""
        try:
            out = self.core.step(commands)
        except Exception as exc:  # a bug of the core's: its generations end with it, the loop goes on
            log.exception("%s: the generation engine failed; its generations end", self.source)
            out = self.core.fail_all(exc)
        self.published = self.core.snapshot()  # before the updates: a caller sees the stats that count them
        for sink, item in out:
            sink.put(item)

    def _idle(self, me: threading.Thread) -> bool:
        """End this thread unless a command came meanwhile (then keep stepping, or leave it to a thread started
        for it): True when this thread should return."""
        with self._turn:
            self._thread = None
        if self._inbox.empty():
            return True
        with self._turn:  # a command came after the drain: take the turn back unless a new thread has it
            if self._thread is not None:
                return True
            self._thread = me
        return False


def core_loop(program: Any, method: str = "forward") -> CoreLoop:
    """``program``'s engine core for ``method`` (made on first use, kept with the Program, stopped when it closes);
    a :class:`CoreLoop` given is returned as it is (a stand-in program's, in tests). InputError naming what does not
    follow the LLM convention."""
    if isinstance(program, CoreLoop):
        return program
    if not isinstance(program, Program):
        raise InputError(f"program must be a pyrt.Program, got {type(program).__name__}")
    loop: CoreLoop = program.extension(f"pyrt.llm.core:{method}",
                                       lambda: CoreLoop(EngineCore(program, engine_convention(program, method))))
    return loop


__all__ = ["CoreLoop", "core_loop"]
