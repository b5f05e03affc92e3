"""Moved to :mod:`pyrt.sim.fake_tensorrt` (the simulated GPU is product code); this name keeps old imports working."""

from pyrt.sim.fake_tensorrt import *  # noqa: F403
from pyrt.sim.fake_tensorrt import __all__  # noqa: F401
