"""The fake TensorRT's bookkeeping that every fake object consults: the fake driver it runs on,
how often each call ran, and the failures a test injected.
"""

from __future__ import annotations

from collections import Counter

from pyrt.sim.fake_cuda import FakeDriver


class FailureInjection:
    """The driver, call counts and injected failures of one fake TensorRT module."""

    def __init__(self, driver: FakeDriver) -> None:
        self.driver = driver
        self.calls: Counter[str] = Counter()
        self._failures: Counter[str] = Counter()
        # Data-dependent outputs: bytes added to what the fake asks an output allocator for (a test
        # makes it ask for more than the bound), and every (output name, bytes) it asked for.
        self.ask_extra_bytes = 0
        self.allocations_asked: list[tuple[str, int]] = []
        # A slow GPU: each launch takes this many seconds per row of its first input (its leading dim) before
        # its results are written, so tests can make runs long on purpose (timeouts, overload).
        self.seconds_per_row = 0.0
        # A weight-streamed engine's pass: each launch of an engine built with weight streaming first reads the
        # weights its budget leaves off the device at this many bytes per second (0: free), a cost per pass that
        # does not depend on the tokens in it, as a GPU streaming its weights over PCIe pays.
        self.stream_bytes_per_second = 0.0

    def inject_failure(self, call: str, times: int = 1) -> None:
        """Make the next ``times`` calls of ``call`` fail as TensorRT fails.

        ``call`` is one of deserialize_cuda_engine, create_execution_context,
        weight_streaming_budget_v2 (the setter), set_input_shape, infer_shapes,
        set_tensor_address, execute_async_v3, get_tensor_profile_shape, or
        IStreamReaderV2 (its constructor fails as where libcuda cannot be opened).
        """
        self._failures[call] += times

    def _fails(self, call: str) -> bool:
        self.calls[call] += 1
        if self._failures[call] > 0:
            self._failures[call] -= 1
            return True
        return False
