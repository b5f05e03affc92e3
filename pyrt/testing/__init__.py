"""Test help: tiny architectures, tokenizers and data-dependent models, built in code for tests and benchmarks.

:mod:`pyrt.testing.archs` (small random-init models of real architectures),
:mod:`pyrt.testing.tokenizers` (tokenizers trained in code, no download) and
:mod:`pyrt.testing.datadep_models` (models whose output shapes depend on their data).

The simulated GPU is product code and lives in :mod:`pyrt.sim`; its names
(:func:`~pyrt.sim.simulated_gpus` and the rest) are re-exported here, and
``pyrt.testing.fake_cuda``, ``.fake_tensorrt``, ``.refengine`` and ``.gpu_reference`` still
import, so code written against their old home keeps working:

>>> import pyrt.sim
>>> simulated_gpus is pyrt.sim.simulated_gpus
True

May import: every layer below it, :mod:`pyrt.sim` included; torch, transformers and executorch
only in the functions that need them. Nothing in pyrt imports this package (tests/test_layers.py).
"""

from __future__ import annotations

from pyrt.sim import (
    SECONDS_PER_ROW_ENV,
    SIMULATED_GPUS_ENV,
    DType,
    FakeDriver,
    FakeTensorRT,
    Ref,
    RefEngine,
    RefNode,
    RefProfile,
    RefTensor,
    RefWeight,
    SimulatedGPUs,
    gpus_from_environment,
    install_from_environment,
    seconds_per_row_from_env,
    simulated_devices,
    simulated_gpus,
)

__all__ = [
    "SimulatedGPUs", "simulated_gpus", "simulated_devices", "gpus_from_environment", "install_from_environment",
    "SECONDS_PER_ROW_ENV", "seconds_per_row_from_env", "SIMULATED_GPUS_ENV",
    "FakeDriver", "FakeTensorRT",
    "RefEngine", "RefProfile", "RefTensor", "RefNode", "RefWeight", "Ref", "DType",
]
