"""The server's check of an array given for a method input (its dtype message names the method's
dtype; the shape checks are :func:`pyrt.format.method_io.check_shape`'s).

>>> spec = InputSpec(0, "Tensor", "float32", (8, 3), dynamic=True)
>>> check_array(spec, np.zeros((9, 3), np.float32), "input0")
Traceback (most recent call last):
...
pyrt.errors.InputError: input0: shape [9, 3] exceeds the upper bound [8, 3] in dimension 0
"""

from __future__ import annotations

import numpy as np

from pyrt.errors import InputError
from pyrt.format.method_io import InputSpec, check_shape


def check_array(spec: InputSpec, x: np.ndarray, where: str) -> None:
    """InputError naming ``where`` unless ``x`` has the input's dtype and a shape within its bounds."""
    if x.dtype.name != spec.dtype:
        raise InputError(f"{where}: got {x.dtype.name}{list(x.shape)}, the method takes {spec.dtype}")
    check_shape(spec, tuple(x.shape), where)
