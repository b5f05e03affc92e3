"""Moved to :mod:`pyrt.sim.refengine` (the simulated GPU is product code); this name keeps old imports working."""

from pyrt.sim.refengine import *  # noqa: F403
from pyrt.sim.refengine import __all__  # noqa: F401
