"""CUDA device names and the ``device_map`` remapping: a leaf module (imports only errors).

>>> parse_device("cuda:2", "target_device"), parse_device(1, "x"), parse_device("cuda", "x")
(2, 1, 0)
>>> remap_device(1, {"cuda:1": "cuda:0"}), remap_device(0, {"cuda:1": "cuda:0"}), remap_device(3, None)
(0, 0, 3)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyrt.checks import is_int
from pyrt.errors import DeviceError

DeviceMap = Mapping[Any, Any]  # {0: 1} or {"cuda:0": "cuda:1"}


def parse_device(value: Any, what: str) -> int:
    """``2``, ``"cuda:2"``, ``"cuda"`` or a torch.device -> the CUDA ordinal; DeviceError naming ``what``."""
    if is_int(value, low=0):
        return int(value)
    text = str(value)
    if text.startswith("cuda:") and text[5:].isdigit():
        return int(text[5:])
    if text == "cuda":
        return 0
    raise DeviceError(f"{what} {value!r} is not a CUDA device (expected an int >= 0 or 'cuda:N')")


def remap_device(index: int, device_map: DeviceMap | None) -> int:
    """Apply ``device_map`` to a CUDA ordinal (unmapped ordinals stay)."""
    if not device_map:
        return index
    for key in (index, f"cuda:{index}"):
        if key in device_map:
            return parse_device(device_map[key], "device_map value")
    return index
