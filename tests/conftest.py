"""Shared pytest setup: markers, CUDA detection, and real .pte fixtures.

Markers: ``gpu`` (skipped unless the CUDA driver reports a device) and
``slow`` (deselected by default through pyproject's ``-m 'not slow'``).

The .pte fixtures are written by ExecuTorch 1.5.1 once per session into one
temporary directory (see ``tests/fixtures/pte.py`` for what each holds):

>>> def test_example(pte_file):                     # doctest: +SKIP
...     path = pte_file("delegated_segments")
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pyrt.sim import simulated_gpus
from tests.fixtures import pte as ptefixtures


@functools.cache
def cuda_device_count() -> int:
    """Devices the CUDA driver reports, via cuda-python; 0 when there is no driver or no device.

    Never imports TensorRT; any failure (no libcuda, init error) counts as no device.
    """
    try:
        from cuda.bindings import driver
    except Exception:
        return 0
    try:
        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return 0
        err, count = driver.cuDeviceGetCount()
        return int(count) if err == driver.CUresult.CUDA_SUCCESS else 0
    except Exception:
        return 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if gpu_items and cuda_device_count() == 0:
        skip = pytest.mark.skip(reason="needs a CUDA device (cuInit/cuDeviceGetCount found none)")
        for item in gpu_items:
            item.add_marker(skip)


# -- .pte fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def pte_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's directory of generated .pte files."""
    return tmp_path_factory.mktemp("pte")


@pytest.fixture(scope="session")
def pte_file(pte_dir: Path) -> Callable[[str], Path]:
    """``pte_file(name) -> Path``: fixture ``name`` from ptefixtures.BUILDERS, built once per session."""

    def get(name: str) -> Path:
        return ptefixtures.build(name, pte_dir)

    return get


@pytest.fixture(scope="session", params=ptefixtures.ALL)
def any_pte(request: pytest.FixtureRequest, pte_file: Callable[[str], Path]) -> Path:
    """Each ExecuTorch-written fixture in turn."""
    return pte_file(request.param)


@pytest.fixture(scope="session")
def portable_pte(pte_file: Callable[[str], Path]) -> Path:
    return pte_file("portable")


@pytest.fixture(scope="session")
def delegated_pte(pte_file: Callable[[str], Path]) -> Path:
    """TensorRTBackend delegates in segments, with target_device and a baked budget."""
    return pte_file("delegated_segments")


@pytest.fixture(scope="session")
def delegated_inline_pte(pte_file: Callable[[str], Path]) -> Path:
    return pte_file("delegated_inline")


@pytest.fixture(scope="session")
def synthetic_pte(pte_file: Callable[[str], Path]) -> Path:
    return pte_file("synthetic")


# -- the simulated GPU -------------------------------------------------------------------------------
@pytest.fixture
def sim() -> Iterator[Any]:
    """One simulated GPU (``pyrt.sim.simulated_gpus(1)``) that must end the test without a hazard.

    Test files that need more GPUs or memory limits define their own ``sim``."""
    with simulated_gpus(1) as s:
        yield s
        assert s.driver.hazards == []
