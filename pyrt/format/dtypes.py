"""ExecuTorch scalar types and their pyrt / numpy names.

>>> ScalarType.FLOAT.itemsize, ScalarType.FLOAT.dtype_name
(4, 'float32')
>>> scalar_type_from_name("int64")
<ScalarType.LONG: 4>
"""

from __future__ import annotations

import enum

from pyrt.errors import PyrtError


class ScalarType(enum.IntEnum):
    BYTE = 0
    CHAR = 1
    SHORT = 2
    INT = 3
    LONG = 4
    HALF = 5
    FLOAT = 6
    DOUBLE = 7
    BOOL = 11
    QINT8 = 12
    QUINT8 = 13
    QINT32 = 14
    BFLOAT16 = 15
    QUINT4X2 = 16
    QUINT2X4 = 17
    BITS16 = 22
    FLOAT8E5M2 = 23
    FLOAT8E4M3FN = 24
    FLOAT8E5M2FNUZ = 25
    FLOAT8E4M3FNUZ = 26
    UINT16 = 27
    UINT32 = 28
    UINT64 = 29

    @property
    def itemsize(self) -> int:
        return _INFO[self][1]

    @property
    def dtype_name(self) -> str:
        """pyrt's dtype string (numpy's name where numpy has the type)."""
        return _INFO[self][0]


_INFO: dict[ScalarType, tuple[str, int]] = {
    ScalarType.BYTE: ("uint8", 1),
    ScalarType.CHAR: ("int8", 1),
    ScalarType.SHORT: ("int16", 2),
    ScalarType.INT: ("int32", 4),
    ScalarType.LONG: ("int64", 8),
    ScalarType.HALF: ("float16", 2),
    ScalarType.FLOAT: ("float32", 4),
    ScalarType.DOUBLE: ("float64", 8),
    ScalarType.BOOL: ("bool", 1),
    ScalarType.QINT8: ("qint8", 1),
    ScalarType.QUINT8: ("quint8", 1),
    ScalarType.QINT32: ("qint32", 4),
    ScalarType.BFLOAT16: ("bfloat16", 2),
    ScalarType.QUINT4X2: ("quint4x2", 1),
    ScalarType.QUINT2X4: ("quint2x4", 1),
    ScalarType.BITS16: ("bits16", 2),
    ScalarType.FLOAT8E5M2: ("float8_e5m2", 1),
    ScalarType.FLOAT8E4M3FN: ("float8_e4m3fn", 1),
    ScalarType.FLOAT8E5M2FNUZ: ("float8_e5m2fnuz", 1),
    ScalarType.FLOAT8E4M3FNUZ: ("float8_e4m3fnuz", 1),
    ScalarType.UINT16: ("uint16", 2),
    ScalarType.UINT32: ("uint32", 4),
    ScalarType.UINT64: ("uint64", 8),
}
_BY_NAME = {name: st for st, (name, _) in _INFO.items()}


def scalar_type_from_name(name: str) -> ScalarType:
    """Map a dtype string ("float32", "torch.float32", ...) to its ScalarType."""
    key = name.removeprefix("torch.")
    key = {"float": "float32", "half": "float16", "double": "float64", "long": "int64", "int": "int32"}.get(key, key)
    try:
        return _BY_NAME[key]
    except KeyError:
        raise PyrtError(f"dtype {name!r} has no ExecuTorch scalar type") from None


def itemsize_of(name: str) -> int:
    """Bytes per element of a pyrt dtype string."""
    return scalar_type_from_name(name).itemsize
