"""A generation's handle and its outbox, alone: a reader blocks on the outbox until the stepping thread puts.

The handle's waits are what makes a reader see updates that come later, from another thread; these tests fail
fast (their own time limit) when a wait is deleted, which is how the ordering mutation test reaches them."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from pyrt.llm.outputs import GenerationResult, Update
from pyrt.llm.stream import Generation, Outbox, wait_all
from pyrt.llm.timings import Timings

pytestmark = pytest.mark.timeout(30)  # a deleted wait spins or blocks forever: fail in seconds, not minutes
TIMINGS = Timings(1, 2, 0.0, 0.0, 0.0, 0.0, 0.0)


class Posts(list[Any]):
    """A core loop whose core another thread steps (``later``): a handle waiting on it never steps it itself."""

    def post(self, command: Any) -> None:
        self.append(command)

    def run_until(self, ready: Any, deadline: float | None = None) -> bool:
        return False


def later(outbox: Outbox, *updates: Update, after_s: float = 0.05) -> threading.Thread:
    """The stepping thread's part: put ``updates`` a moment from now."""
    def put() -> None:
        for update in updates:
            threading.Event().wait(after_s)
            outbox.put(update)
    thread = threading.Thread(target=put, daemon=True)
    thread.start()
    return thread


def test_iteration_waits_for_tokens_put_later_from_another_thread() -> None:
    outbox = Outbox()
    handle = Generation(Posts(), 1, (5,), outbox)
    result = GenerationResult([7, 8], "length", TIMINGS)
    later(outbox, Update(1, accepted=True), Update(1, (7,)), Update(1, (8,), result=result))
    assert list(handle) == [7, 8] and handle.result is result


def test_wait_and_wait_accepted_block_until_the_update_comes() -> None:
    outbox = Outbox()
    handle = Generation(Posts(), 2, (5,), outbox)
    later(outbox, Update(2, accepted=True))
    assert handle.wait_accepted(20) and handle.accepted and not handle.done
    later(outbox, Update(2, (9,), result=GenerationResult([9], "stop", TIMINGS)))
    assert handle.wait(20) and handle.tokens == [9]


def test_a_refusal_ends_the_handle_without_acceptance() -> None:
    outbox = Outbox()
    handle = Generation(Posts(), 3, (5,), outbox)
    refusal = RuntimeError("queue full")
    later(outbox, Update(3, error=refusal))
    assert handle.wait_accepted(20) and not handle.accepted and handle.error is refusal
    with pytest.raises(RuntimeError, match="queue full"):
        next(handle)


def test_a_dropped_unfinished_handle_posts_its_cancellation() -> None:
    posts = Posts()
    handle = Generation(posts, 4, (5,), Outbox())
    del handle
    assert [type(c).__name__ for c in posts] == ["Cancel"] and posts[0].seq_id == 4


def test_wait_all_returns_once_every_handle_has_ended() -> None:
    """Another thread steps the core: wait_all waits for each handle's last update."""
    boxes = [Outbox(), Outbox()]
    handles = [Generation(Posts(), i, (5,), box) for i, box in enumerate(boxes)]
    for i, box in enumerate(boxes):
        later(box, Update(i, accepted=True), Update(i, (7 + i,), result=GenerationResult([7 + i], "length", TIMINGS)))
    wait_all(handles)
    assert [h.done for h in handles] == [True, True] and [h.tokens for h in handles] == [[7], [8]]
