"""Moved to :mod:`pyrt.sim.fake_cuda` (the simulated GPU is product code); this name keeps old imports working."""

from pyrt.sim.fake_cuda import *  # noqa: F403
from pyrt.sim.fake_cuda import __all__  # noqa: F401
