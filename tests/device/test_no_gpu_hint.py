"""Where no GPU is, the error says what runs without one: a CPU export (``--builder portable`` / ``reference``),
and reference engines on simulated GPUs (issue 46: it suggested PYRT_SIMULATED_GPUS=1 alone, which then failed on
the TensorRT-RTX engines of the default export)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pyrt.device.driver import CudaDriver


def test_no_devices_names_a_cpu_export_and_the_simulated_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYRT_SIMULATED_GPUS", raising=False)
    said = CudaDriver(SimpleNamespace(cuInit=lambda flags: (100,))).describe_devices()  # 100: CUDA_ERROR_NO_DEVICE
    assert said.startswith("no CUDA devices are present (cuInit failed with ")
    assert "export with --builder portable" in said and "or --builder reference" in said
    assert "set PYRT_SIMULATED_GPUS=1 before pyrt is imported" in said
