"""Shared pytest setup: CUDA detection, the workers' groups, and real .pte fixtures.

Marks (registered in pyproject.toml) say what a test does: ``gpu`` (skipped unless the CUDA driver
reports a device), ``export`` (exports a model of a real architecture or builds a TensorRT engine),
``ray``, ``soak``, ``mutants``, ``slow``; ``scripts/test.sh`` runs the fast tier (none of the last
five) or, with ``--all``, everything. Under pytest-xdist's ``--dist loadgroup``, tests that share an
expensive fixture or a machine-wide resource stay on one worker (:func:`worker_group`).

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


# Test modules that share the session's LLM exports (functools caches of one process): their tests run on one
# worker, which exports each file once.
LLM_EXPORTS = ("tests.fixtures.llm_models", "tests.fixtures.llm_serve")


def worker_group(item: pytest.Item) -> str | None:
    """The pytest-xdist group ``item`` runs in: "ray" (one Ray, its ports and network namespaces at a time), or
    "llm-exports" (the LLM files a session exports once), else None (any worker)."""
    if item.get_closest_marker("ray") is not None:
        return "ray"
    module = getattr(item, "module", None)
    used = {getattr(v, "__name__", None) for v in vars(module).values()} if module is not None else set()
    return "llm-exports" if used & set(LLM_EXPORTS) else None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        group = worker_group(item)
        if group is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))
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
