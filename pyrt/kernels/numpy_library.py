"""The numpy kernel library: the modules that register numpy kernels, behind one lookup.

>>> from pyrt.pte_reader import Operator
>>> NumpyLibrary().lookup(Operator("aten::add", "out")).name
'aten::add.out'
>>> "aten::softmax.out" in supported() or "aten::_softmax.out" in supported()
True
"""

from __future__ import annotations

from pyrt.kernels import (  # noqa: F401  (importing them registers their kernels)
    numpy_elementwise,
    numpy_index,
    numpy_nn,
    numpy_reduce,
    numpy_shape,
    quantized,
)
from pyrt.kernels.base import RANDOM_OPS, Kernel
from pyrt.kernels.numpy_base import OPS, build_step
from pyrt.pte_reader import Operator


class NumpyLibrary:
    """Lookup into the numpy core set."""

    name = "numpy"

    def lookup(self, operator: Operator) -> Kernel | None:
        spec = OPS.get(operator.qualified_name)
        if spec is None:
            return None
        return Kernel(operator.qualified_name, build=lambda site: build_step(spec, site),
                      writes=lambda args: args[spec.n_in:spec.n_in + spec.n_out],
                      pure=operator.name not in RANDOM_OPS)


def supported() -> list[str]:
    """Names of every operator in the numpy core set."""
    return sorted(OPS)
