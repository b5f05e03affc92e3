"""What a replica will not wait for: a full queue (503), a request past its time (504), a slow client (408).

A server under more load than it can take should say so at once rather than answer ever
later, as Triton's queue policy and Ray Serve's ``max_queued_requests`` do:

- The queue (``--max-queued-requests N``): a replica runs one batch at a time on its run
  thread (:class:`RunThread`); requests decoded and waiting for it (in the batch queue, or
  for the thread) are its queue. A request that finds N waiting is answered ``503`` with
  ``Retry-After`` and ``{"error": ...}`` before it joins (:class:`Overloaded`). Ray Serve
  gets a backstop limit for the requests it holds itself before a replica takes them (its
  proxy, handles; on HAProxy's direct ingress, those beyond the replica's
  ``max_ongoing_requests``), answered 503 with ``Retry-After`` by Ray
  (:func:`pyrt.serve.app.deployment`).
- The request timeout (``--request-timeout-s T``): an infer request not answered within T
  seconds of its arrival is answered ``504`` (:class:`RequestTimeout`). A run already on the
  run thread cannot be stopped: it finishes and its result is dropped; the replica keeps
  serving, and requests behind it wait for it (or reach their own timeouts).
- The read timeout (``--read-timeout-s R``, default 30): a request body not received within R
  seconds of the request's arrival is answered ``408`` (:class:`ReadTimeout`); such a request
  never reaches the queue. HAProxy in front of a Ray that ``pyrt serve`` starts gives the
  headers the same time (``timeout http-request``, :mod:`pyrt.serve.ingress`).

Each error carries the status it is answered with (:func:`pyrt.serve.failures.status_of`):

>>> Overloaded.http_status, RequestTimeout.http_status, ReadTimeout.http_status, RequestTooLarge.http_status
(503, 504, 408, 413)
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from starlette.requests import Request

from pyrt.errors import InputError, PyrtError

T = TypeVar("T")
RETRY_AFTER_S = 1  # what a refused client is told to wait: about one batch's time on a loaded replica


class Overloaded(PyrtError):
    """The replica's queue is full (503, with ``Retry-After``)."""

    http_status = 503


class RequestTimeout(PyrtError):
    """A request was not answered within the server's request timeout (504)."""

    http_status = 504


class ReadTimeout(PyrtError):
    """A client did not send its request within the server's read timeout (408)."""

    http_status = 408


class RequestTooLarge(InputError):
    """A request body over the server's ``max_request_bytes`` (413)."""

    http_status = 413


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The request body: RequestTooLarge over ``limit`` bytes, ReadTimeout when it takes over ``timeout_s``."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestTooLarge(f"request body of {declared} bytes is over the server's limit of {limit} bytes")

    async def read() -> bytes:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise RequestTooLarge(f"request body is over the server's limit of {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        return await asyncio.wait_for(read(), timeout_s)
    except asyncio.TimeoutError:
        raise ReadTimeout(f"the request body did not arrive within the server's read timeout of {timeout_s:g} s "
                          "(--read-timeout-s)") from None


async def within(work: Awaitable[T], timeout_s: float | None, since: float, what: str) -> T:
    """``await work``, or RequestTimeout naming ``what`` once ``timeout_s`` have passed since ``since``
    (a ``time.monotonic()``); None: no limit."""
    if timeout_s is None:
        return await work
    try:
        return await asyncio.wait_for(work, max(0.0, since + timeout_s - time.monotonic()))
    except asyncio.TimeoutError:
        raise RequestTimeout(f"{what}: no answer within the server's request timeout of {timeout_s:g} s "
                             "(--request-timeout-s)") from None


class RunThread:
    """A replica's run thread: runs take turns on it; calls waiting for it (and queued batches) are the queue.

    ``call`` runs a function there once the thread is free (in arrival order). A caller that
    stops waiting (its request timed out) withdraws its call if it has not started; a run that
    has started finishes, and the next starts after it.
    """

    def __init__(self, limit: int | None, name: str = "pyrt-run") -> None:
        self.pool = ThreadPoolExecutor(1, thread_name_prefix=name)
        self.limit = limit
        self._count = threading.Lock()
        self._waiting = 0  # calls handed to the thread, not started
        self._running = 0
        self.most_waiting = 0  # the longest queue an admitted request joined (itself included)

    @property
    def waiting(self) -> int:
        """Calls waiting for the thread."""
        return self._waiting

    @property
    def busy(self) -> bool:
        """A run holds the thread, or waits for it."""
        return self._running + self._waiting > 0

    def admit(self, queued: int, what: str) -> None:
        """Overloaded naming ``what`` when ``queued`` requests already wait and the limit allows no more.

        A request that finds the run thread idle joins no queue (``queued`` 0) yet counts as 1 in
        :attr:`most_waiting`: that is the largest ``queued`` an admitted request saw, plus one.
        """
        if self.limit is not None and queued >= self.limit:
            raise Overloaded(f"{what}: {queued} requests are waiting at this replica, its limit "
                             f"(--max-queued-requests {self.limit}); retry after {RETRY_AFTER_S} s")
        self.most_waiting = max(self.most_waiting, queued + 1)

    def queue_stats(self, queued: int) -> dict[str, Any]:
        """The queue now (``queued`` waiting), its limit (None: none) and the longest an admitted request joined."""
        return {"waiting": queued, "limit": self.limit, "most_waiting": self.most_waiting}

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the run thread, after the calls handed to it before.

        A call that finds the thread idle takes it at once: it counts as running, not waiting,
        even before the thread picks it up (which may take a GIL switch while the event loop
        decodes the next requests of a burst).
        """
        with self._count:
            first = self._running + self._waiting == 0
            if first:
                self._running += 1
            else:
                self._waiting += 1

        def job() -> T:
            if not first:
                with self._count:
                    self._waiting -= 1
                    self._running += 1
            try:
                return fn(*args)
            finally:
                with self._count:
                    self._running -= 1

        def withdrawn(f: Future[T]) -> None:
            if f.cancelled():  # never started: no longer waiting (or no longer about to run)
                with self._count:
                    if first:
                        self._running -= 1
                    else:
                        self._waiting -= 1

        future = self.pool.submit(job)
        future.add_done_callback(withdrawn)
        return await asyncio.wrap_future(future)
