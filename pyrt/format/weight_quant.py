"""Weight-only quantization: the scheme every builder, kernel and test shares (numpy only).

Weight-only, symmetric, per group of ``group_size`` consecutive input features of each output
row: ``scale = max|w| / (2**(b-1) - 1)`` (stored in the model's dtype), ``q = round-half-to-even(w
/ scale)`` clamped to ``[-(2**(b-1) - 1), 2**(b-1) - 1]``, ``w_hat = q * scale``; activations stay
in the model's dtype. A layer whose input size is not a multiple of ``group_size`` gets one group
per row (per-output-row quantization). A group that is all zeros (or whose scale underflows the
scale's dtype) gets scale 1, so no stored scale is ever zero.

INT4 values are packed two to a byte, row by row, in one of two layouts:

* ``"twos"`` (TensorRT and ONNX ``INT4``, and pyrt's reference engines): element ``2i`` in the low
  nibble of byte ``i``, ``2i + 1`` in the high nibble, two's complement;
* ``"offset8"`` (ExecuTorch's ``quantized_decomposed::embedding_4bit``): element ``2i`` in the high
  nibble, ``2i + 1`` in the low one, each stored as ``q + 8``.

Files name their scheme in the delegate compile spec :data:`SPEC_KEY` (JSON, :func:`parse_spec`).

>>> w = np.array([[2.5, -7.0, 1.5, 0.5]], dtype=np.float32)   # max|w| = 7: scale 1, halves to even
>>> q, s = quantize(w, bits=4, group=4)
>>> q.tolist(), s.tolist()
([[2, -7, 2, 0]], [[1.0]])
>>> pack_int4(q).tolist(), unpack_int4(pack_int4(q), 4).tolist() == q.tolist()
([[146, 2]], True)
>>> dequantize(q, s, 4).tolist()
[[2.0, -7.0, 2.0, 0.0]]
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from pyrt.checks import is_int
from pyrt.errors import PteFormatError

SCHEMES: dict[str, int] = {"int8": 8, "int4": 4}  # quantize= value -> bits
MIN_GROUP_SIZE = 16
DEFAULT_GROUP_SIZE = 128
SPEC_KEY = "pyrt_weight_quantization"  # the delegate compile spec that names an engine's scheme
LAYOUTS = ("twos", "offset8")
SCALE_DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class Scheme:
    """A checked ``quantize=`` / ``group_size=`` pair (``pyrt.export.options.check_quantize`` makes it)."""

    name: str  # "int8" | "int4"
    group_size: int = DEFAULT_GROUP_SIZE

    @property
    def bits(self) -> int:
        return SCHEMES[self.name]

    def group_for(self, in_features: int) -> int:
        return group_for(in_features, self.group_size)


def qmax(bits: int) -> int:
    """The largest stored magnitude: 127 for int8, 7 for int4 (symmetric: -qmax..qmax)."""
    return (1 << (bits - 1)) - 1


def is_group_size(value: Any) -> bool:
    """A power of two >= 16 (bool refused)."""
    return is_int(value, low=MIN_GROUP_SIZE) and int(value) & (int(value) - 1) == 0


def group_for(in_features: int, group_size: int) -> int:
    """The group a layer of ``in_features`` inputs gets: ``group_size``, or the whole row when it does not divide.

    >>> group_for(4096, 128), group_for(96, 128), group_for(200, 16)
    (128, 96, 200)
    """
    return group_size if in_features % group_size == 0 else in_features


# -- the math ------------------------------------------------------------------------------------------


def round_scales(scales: np.ndarray, dtype: str) -> np.ndarray:
    """``scales`` (float32) rounded to the nearest value ``dtype`` holds, as float32; zeros become 1.

    bfloat16 is rounded half to even on the float32 bits (numpy has no bfloat16).
    """
    s = np.asarray(scales, dtype=np.float32)
    if dtype == "float16":
        s = s.astype(np.float16).astype(np.float32)
    elif dtype == "bfloat16":
        raw = s.view(np.uint32).astype(np.uint64)
        s = ((raw + 0x7FFF + ((raw >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
    elif dtype != "float32":
        raise ValueError(f"scale dtype {dtype!r} is not one of {SCALE_DTYPES}")
    return np.where(s > 0, s, np.float32(1.0)).astype(np.float32)


def quantize(w: np.ndarray, *, bits: int, group: int, scale_dtype: str = "float32"
             ) -> tuple[np.ndarray, np.ndarray]:
    """(q int8 [N, K], scales float32 [N, K // group]) of weights ``w`` [N, K] (rows: output features).

    ``scales`` hold exactly the values ``scale_dtype`` stores; ``q`` is computed against them.
    """
    w32 = np.asarray(w, dtype=np.float32)
    rows, cols = w32.shape
    if cols % group:
        raise ValueError(f"group {group} does not divide the {cols} input features")
    if not np.isfinite(w32).all():
        raise ValueError("weights hold inf or NaN; quantization needs finite weights")
    top = qmax(bits)
    blocks = w32.reshape(rows, cols // group, group)
    scales = round_scales(np.abs(blocks).max(axis=2) / np.float32(top), scale_dtype)
    q = np.rint(blocks / scales[:, :, None])
    return np.clip(q, -top, top).astype(np.int8).reshape(rows, cols), scales


def dequantize(q: np.ndarray, scales: np.ndarray, group: int) -> np.ndarray:
    """``q * scale`` per group, float32 [N, K] (cast it to the model's dtype: one rounding)."""
    rows, cols = q.shape
    blocks = q.astype(np.float32).reshape(rows, cols // group, group)
    return (blocks * np.asarray(scales, dtype=np.float32)[:, :, None]).reshape(rows, cols)


def pack_int4(q: np.ndarray, layout: str = "twos") -> np.ndarray:
    """int8 [N, K] values in [-8, 7], K even -> uint8 [N, K // 2] (see the module docstring for layouts)."""
    rows, cols = q.shape
    if cols % 2:
        raise ValueError(f"int4 packing needs an even number of input features, got {cols}")
    pairs = q.astype(np.int16).reshape(rows, cols // 2, 2)
    if layout == "twos":
        nib = (pairs & 0xF).astype(np.uint8)
        return (nib[..., 0] | (nib[..., 1] << 4)).astype(np.uint8)
    if layout == "offset8":
        nib = (pairs + 8).astype(np.uint8)
        return ((nib[..., 0] << 4) | nib[..., 1]).astype(np.uint8)
    raise ValueError(f"int4 layout {layout!r} is not one of {LAYOUTS}")


def unpack_int4(packed: np.ndarray, cols: int, layout: str = "twos") -> np.ndarray:
    """uint8 [N, cols // 2] -> int8 [N, cols]: the inverse of :func:`pack_int4`."""
    p = np.asarray(packed, dtype=np.uint8)
    lo, hi = (p & 0xF).astype(np.int8), (p >> 4).astype(np.int8)
    if layout == "twos":
        first, second = lo - ((lo & 8) << 1), hi - ((hi & 8) << 1)
    elif layout == "offset8":
        first, second = hi - 8, lo - 8
    else:
        raise ValueError(f"int4 layout {layout!r} is not one of {LAYOUTS}")
    return np.stack([first, second], axis=-1).reshape(p.shape[0], cols).astype(np.int8)


def stored_shape(bits: int, rows: int, cols: int) -> tuple[int, int]:
    """The stored values' shape: [N, K] int8, or [N, K // 2] uint8 for int4."""
    return (rows, cols) if bits == 8 else (rows, cols // 2)


def stored_dtype(bits: int) -> str:
    return "int8" if bits == 8 else "uint8"


# -- checks of stored tensors (a file is untrusted) ----------------------------------------------------


Fail = Callable[[str], Exception]


def check_stored(name: str, bits: Any, group: Any, shape: Any, q: tuple[str, tuple[int, ...]],
                 scales: tuple[str, tuple[int, ...]], fail: Fail) -> tuple[int, int, int]:
    """Check a quantized weight's description against its stored values and scales; returns (bits, rows, cols).

    ``q`` and ``scales`` are (dtype, shape); ``fail(message)`` makes the error to raise (each format
    has its own type). Scale *values* are checked by :func:`check_scale_values`.
    """
    if not is_int(bits) or bits not in (4, 8):
        raise fail(f"quantized weight {name!r}: unknown quantization {bits!r} bits (known: 8, 4)")
    if (not isinstance(shape, (list, tuple)) or len(shape) != 2
            or not all(is_int(d, low=1) for d in shape)):
        raise fail(f"quantized weight {name!r}: shape {shape!r} is not [out_features, in_features]")
    rows, cols = int(shape[0]), int(shape[1])
    if not is_int(group, low=1) or cols % group:
        raise fail(f"quantized weight {name!r}: group size {group!r} does not divide {cols} input features")
    if bits == 4 and cols % 2:
        raise fail(f"quantized weight {name!r}: int4 needs an even number of input features, got {cols}")
    want = (stored_dtype(bits), stored_shape(bits, rows, cols))
    if (q[0], tuple(q[1])) != want:
        raise fail(f"quantized weight {name!r}: packed values are {q[0]}{list(q[1])}, int{bits} [{rows}, {cols}] "
                   f"needs {want[0]}{list(want[1])}")
    if scales[0] not in SCALE_DTYPES or tuple(scales[1]) != (rows, cols // group):
        raise fail(f"quantized weight {name!r}: scales are {scales[0]}{list(scales[1])}, group {group} needs "
                   f"a float [{rows}, {cols // group}]")
    return int(bits), rows, cols


def check_scale_values(name: str, scales: np.ndarray, fail: Fail) -> None:
    """Every scale finite and > 0 (a zero scale would erase a group; NaN would poison every output)."""
    s = np.asarray(scales, dtype=np.float32)
    bad = ~(np.isfinite(s) & (s > 0))
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise fail(f"quantized weight {name!r}: scale {list(where)} is {float(s[where])!r}; scales must be "
                   "finite and > 0")


# -- the compile spec ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpecInfo:
    """What an engine's :data:`SPEC_KEY` compile spec says: scheme, group size, layers and bytes."""

    scheme: str
    group_size: int
    layers: int = 0
    per_row: int = 0
    weight_bytes: int = 0  # packed values + scales of the quantized layers
    other_bytes: int = 0  # the engine's weights left in the model's dtype (norms, embeddings, ...)

    def to_json(self) -> str:
        return json.dumps({"scheme": self.scheme, "group_size": self.group_size, "layers": self.layers,
                           "per_row": self.per_row, "weight_bytes": self.weight_bytes,
                           "other_bytes": self.other_bytes}, separators=(",", ":"))


def parse_spec(raw: bytes | bytearray | memoryview | str, source: str) -> SpecInfo:
    """A :data:`SPEC_KEY` compile spec, checked; PteFormatError naming ``source`` otherwise.

    >>> parse_spec(b'{"scheme":"int4","group_size":128}', "delegate 0").scheme
    'int4'
    >>> parse_spec(b'{"scheme":"int3","group_size":128}', "delegate 0")
    Traceback (most recent call last):
    ...
    pyrt.errors.PteFormatError: delegate 0 compile spec pyrt_weight_quantization: unknown quantization 'int3' \
(known: int8, int4)
    """
    where = f"{source} compile spec {SPEC_KEY}"
    try:
        doc = json.loads(bytes(raw).decode("utf-8") if not isinstance(raw, str) else raw)
    except (UnicodeDecodeError, ValueError):
        raise PteFormatError(f"{where}: not JSON: {bytes(raw[:64]) if not isinstance(raw, str) else raw[:64]!r}"
                             ) from None
    if not isinstance(doc, dict):
        raise PteFormatError(f"{where}: expected a JSON object, got {type(doc).__name__}")
    scheme = doc.get("scheme")
    if scheme not in SCHEMES:
        raise PteFormatError(f"{where}: unknown quantization {scheme!r} (known: {', '.join(SCHEMES)})")
    if not is_group_size(doc.get("group_size")):
        raise PteFormatError(f"{where}: group_size {doc.get('group_size')!r} is not a power of two >= 16")
    counts = {k: doc.get(k, 0) for k in ("layers", "per_row", "weight_bytes", "other_bytes")}
    for key, value in counts.items():
        if not is_int(value, low=0, end=1 << 63):
            raise PteFormatError(f"{where}: {key} {value!r} is not a count >= 0")
    return SpecInfo(scheme, doc["group_size"], **counts)
