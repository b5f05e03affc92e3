"""Weight-only quantized weights in reference engines: the ``pyrt::dequantize_weight`` node.

What a TensorRT engine does with an INT8 / INT4 constant and an ``IDequantizeLayer`` with a block
shape, a reference engine does with this node: its weights hold the packed values and the scales
(so :attr:`RefEngine.streamable_weights_size` counts the packed bytes), and the node dequantizes
them before the matrix product reads the result. Arguments::

    [Ref(values), Ref(scales), bits, group_size, [out_features, in_features], transposed]

``values``: int8 ``[N, K]`` (8 bits) or uint8 ``[N, K // 2]`` (4 bits, ``"twos"`` layout of
:mod:`pyrt.format.weight_quant`); ``scales``: ``[N, K // group_size]`` in the result's dtype; the
result is ``[N, K]``, or ``[K, N]`` when ``transposed`` (a weight a product reads as ``x @ W``).
Validation refuses an unknown bit width, a packed tensor of the wrong size, scales of the wrong shape
or dtype, and any scale that is zero, negative, infinite or NaN, naming the weight.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pyrt.errors import UnsupportedOperatorError
from pyrt.format.weight_quant import check_scale_values, check_stored, dequantize, unpack_int4
from pyrt.kernels.quantized import torch_dequantize
from pyrt.sim.refengine.model import Ref, RefEngineFormatError, RefNode, RefWeight

TARGET = "pyrt::dequantize_weight"
NAMESPACE = "pyrt::"


def check(node: RefNode, weights: dict[str, RefWeight], where: str) -> None:
    """RefEngineFormatError unless ``node`` is a well-formed dequantization of two of ``weights``."""
    if node.target != TARGET:
        raise RefEngineFormatError(f"{where}: unknown operator {node.target!r} (pyrt's own: {TARGET})")
    args = node.args
    if len(args) != 6 or node.kwargs or len(node.outputs) != 1:
        raise RefEngineFormatError(f"{where}: {TARGET} takes [values, scales, bits, group_size, shape, transposed] "
                                   f"and gives one output; got {len(args)} arguments, {len(node.outputs)} outputs")
    values, scales, bits, group, shape, transposed = args
    name = values.name.removesuffix("_values") if isinstance(values, Ref) else node.outputs[0]
    for ref, what in ((values, "values"), (scales, "scales")):
        if not isinstance(ref, Ref) or ref.name not in weights:
            raise RefEngineFormatError(f"{where}: quantized weight {name!r}: its {what} {ref!r} are not a weight")
    if not isinstance(transposed, bool):
        raise RefEngineFormatError(f"{where}: quantized weight {name!r}: transposed={transposed!r} is not a bool")
    q, s = weights[values.name], weights[scales.name]

    def fail(message: str) -> RefEngineFormatError:
        return RefEngineFormatError(f"{where}: {message}")

    check_stored(name, bits, group, shape, (q.dtype, q.shape), (s.dtype, s.shape), fail)
    check_scale_values(name, scale_values(s), fail)


def scale_values(w: RefWeight) -> np.ndarray:
    """A scales weight as float32 (bfloat16 widened from its bits: numpy has no bfloat16)."""
    if w.dtype == "bfloat16":
        return (np.frombuffer(w.data, np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(w.shape)
    return np.frombuffer(w.data, w.dtype).reshape(w.shape).astype(np.float32)


def run(backend: str, args: list[Any]) -> Any:
    """The dequantized weight, with the ``backend``'s tensors ("torch" or "numpy")."""
    values, scales, bits, group, shape, transposed = args
    rows, cols = int(shape[0]), int(shape[1])
    if backend == "torch":
        out = torch_dequantize(values, scales.reshape(rows, cols // group), bits=bits, cols=cols, layout="twos",
                               dtype=scales.dtype)
        return out.t() if transposed else out
    if backend != "numpy":
        raise UnsupportedOperatorError(f"{TARGET}: no {backend!r} implementation")
    q = unpack_int4(values, cols, "twos") if bits == 4 else np.asarray(values)
    out = dequantize(q, np.asarray(scales, np.float32), group).astype(np.asarray(scales).dtype)
    return out.T if transposed else out
