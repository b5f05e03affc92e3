"""Threads: runs of one method take turns on its lock; close() waits for runs in flight.

Documented in the README and the Program docstring. A run "in flight" is
simulated by holding the method's lock from the test, so nothing depends on
timing: a thread that must wait is still waiting while the lock is held.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("executorch")

from pyrt.errors import ProgramClosedError  # noqa: E402
from pyrt.runtime.program import Program  # noqa: E402
from tests.fixtures.pte import relu_program  # noqa: E402

WAIT = 0.5  # how long a blocked thread is given to (wrongly) finish; it never decides a pass


@pytest.fixture(scope="module")
def data() -> bytes:
    return relu_program()


@pytest.mark.parametrize("kernels", ["torch", "numpy"])
def test_concurrent_runs_of_one_method_give_each_caller_its_result(data: bytes, kernels: str) -> None:
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((2, 3)).astype(np.float32) for _ in range(64)]
    with Program(data, kernels=kernels) as prog, ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda x: prog(x)[0], xs))
    for x, y in zip(xs, outs, strict=True):
        np.testing.assert_array_equal(y, np.maximum(x, 0))


def _start(fn: object) -> tuple[threading.Thread, list[object]]:
    result: list[object] = []

    def target() -> None:
        try:
            result.append(fn())  # type: ignore[operator]
        except BaseException as exc:  # noqa: B036 - handed to the test thread
            result.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, result


def test_a_run_waits_for_the_run_in_flight(data: bytes) -> None:
    x = np.ones((2, 3), np.float32)
    with Program(data, kernels="numpy") as prog:
        lock = prog._runners["forward"]._lock
        with lock:  # a run in flight
            thread, result = _start(lambda: prog(x))
            thread.join(WAIT)
            assert thread.is_alive() and result == []
        thread.join(60)
        np.testing.assert_array_equal(result[0][0], x)  # type: ignore[index]


def test_close_waits_for_runs_and_a_later_run_sees_the_program_closed(data: bytes) -> None:
    x = np.ones((2, 3), np.float32)
    prog = Program(data, kernels="numpy")
    runner = prog._runners["forward"]  # as a run that looked its method up before close() has it
    with runner._lock:  # a run in flight
        closer, _ = _start(prog.close)
        closer.join(WAIT)
        assert closer.is_alive()  # close() does not free memory under a running method
    closer.join(60)
    assert not closer.is_alive()
    with pytest.raises(ProgramClosedError, match="closed while this run waited"):
        runner((x,))
    with pytest.raises(ProgramClosedError):
        prog(x)
