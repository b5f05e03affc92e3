"""The one thread that steps a program's engine core, and the inbox every front end posts to.

A :class:`CoreLoop` is made once per (:class:`pyrt.Program`, method), kept with the Program
(:meth:`pyrt.Program.extension`, :func:`core_loop`): every :class:`pyrt.llm.Engine` and
``pyrt.generate`` call on that method is a front end of it, and their generations share each
forward call. How the one stepping thread is chosen: the loop starts a thread on the first command
posted to it (:meth:`CoreLoop.post`); that thread drains the inbox, calls
:meth:`pyrt.llm.core.EngineCore.step` while there is work, publishes the core's counters
(:attr:`CoreLoop.published`), then hands each update to its generation's outbox; with nothing to
do (no work, or paused) and nothing posted, it ends, and the next command starts another. So at
most one thread steps a core at any moment, it is the only thread that touches the core's state,
and a Program nobody uses holds no thread. Front ends wait on their own queues (a generation's
outbox, a control command's reply), never on the core. Closing the Program stops the loop
(:meth:`CoreLoop.close`: every generation ends as cancelled, later submissions are refused).

The re-entrant lock below is the only threading primitive in :mod:`pyrt.llm`: it makes "start a
thread when none runs" and "end the thread when idle" one decision, so that no command is ever
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
import threading
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

    def post(self, command: Command) -> None:
        """Queue ``command`` for the core (from any thread, a finalizer included); start the thread if none runs."""
        self._inbox.put(command)
        with self._turn:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"pyrt-core-{self.source}", daemon=True)
                self._thread.start()

    def call(self, make: Callable[[Any], Command], timeout: float | None = None) -> Any:
        """Post ``make(reply)`` and wait for the core's reply (its value)."""
        if self.stepping_here:
            raise PyrtError(f"{self.source}: a front end waited for its own engine core from the core's thread (an "
                            "update listener must not call the engine)")
        reply: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.post(make(reply))
        try:
            return reply.get(timeout=timeout)
        except queue.Empty:
            raise PyrtError(f"{self.source}: the engine core did not answer within {timeout} s (a step is still "
                            "running)") from None

    def close(self) -> None:
        """Stop the core (the Program closes): its generations end as cancelled; waits for the step in flight."""
        if self.stepping_here:
            self._inbox.put(Stop())
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
