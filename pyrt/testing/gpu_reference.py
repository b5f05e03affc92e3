"""Moved to :mod:`pyrt.sim.gpu_reference` (the simulated GPU is product code); this name keeps old imports working."""

from pyrt.sim.gpu_reference import DeviceMemory, reference_tensorrt

__all__ = ["DeviceMemory", "reference_tensorrt"]
