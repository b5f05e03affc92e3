"""The fake ``tensorrt`` module itself: :class:`FakeTensorRT`, bound to one fake CUDA driver,
with the binding classes as attributes and ``Runtime(logger)``.
"""

from __future__ import annotations

from typing import TypeAlias

from pyrt.sim.fake_cuda import FakeDriver
from pyrt.sim.fake_tensorrt.bindings import (
    DataType,
    Dims,
    ExecutionContextAllocationStrategy,
    ILogger,
    IOutputAllocator,
    IStreamReaderV2,
    Logger,
    SeekPosition,
    TensorIOMode,
)
from pyrt.sim.fake_tensorrt.failures import FailureInjection
from pyrt.sim.fake_tensorrt.runtime import FakeRuntime

__version__ = "0.0-fake"


class FakeTensorRT(FailureInjection):
    """A fake TensorRT module bound to one fake CUDA driver.

    Use it wherever pyrt takes a ``trt`` module, or through
    :func:`pyrt.sim.simulated_gpus`, which installs it as the default.
    """

    __name__ = "fake_tensorrt"
    __version__ = __version__
    DataType = DataType
    TensorIOMode = TensorIOMode
    ExecutionContextAllocationStrategy = ExecutionContextAllocationStrategy
    ILogger: TypeAlias = ILogger  # an alias, so Runtime's annotation can name it in the class body
    Logger = Logger
    Dims = Dims
    SeekPosition = SeekPosition
    IOutputAllocator = IOutputAllocator

    def __init__(self, driver: FakeDriver) -> None:
        super().__init__(driver)
        # This module's own reader base, so inject_failure("IStreamReaderV2") reaches its constructor.
        self.IStreamReaderV2: type[IStreamReaderV2] = type(
            "IStreamReaderV2", (IStreamReaderV2,),
            {"_fake": self, "__doc__": IStreamReaderV2.__doc__, "__module__": IStreamReaderV2.__module__})

    def Runtime(self, logger: ILogger) -> FakeRuntime:  # noqa: N802 - TensorRT's name
        """``trt.Runtime(logger)``; without a CUDA device this "crashes" (raises loudly)."""
        if not isinstance(logger, ILogger):
            raise TypeError("__init__(): incompatible constructor arguments. The following argument types are "
                            f"supported:\n    1. Runtime(logger: ILogger)\n\nInvoked with: {logger!r}")
        if self.driver.gpus == 0:
            raise RuntimeError(
                "fake tensorrt: Runtime created with no CUDA device (tensorrt_lean would segfault here)"
            )
        return FakeRuntime(self, logger)
