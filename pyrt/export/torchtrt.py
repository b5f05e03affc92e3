"""Torch-TensorRT compiled programs as export input (formats.md §4).

Such a program calls ``tensorrt::execute_engine(inputs, engine)``, ``engine``
being a TorchBind object whose serialized state is a list of strings (ABI
"10"): 0 ABI, 1 name, 2 device ``gpu_id%major%minor%device_type%name``,
3 engine (base64 in TorchBind's pickled state; raw bytes are accepted too),
4/5 input/output binding names joined by ``%``, 6 hardware-compatible flag,
7 serialized metadata, 8 target platform, 9 requires-output-allocator,
10 resource allocation strategy, 11 requires-native-multidevice, 12 aliased
I/O ``out@in@kind`` joined by ``%`` (slots 11 and 12 are absent in older
programs). Nothing here needs torch_tensorrt: any object with that state
(``__getstate__`` or ``__obj_flatten__``) converts.

>>> state = ["10", "e", "1%8%9%0%GPU", "QUJD", "x", "y", "0", "", "linux_x86_64", "0", "0", "0", ""]
>>> eng = decode_state(state, "engine")
>>> eng.device_index, eng.engine, eng.input_names
(1, b'ABC', ['x'])
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

from pyrt.errors import ExportError
from pyrt.export._graph.fx import unwrap_script_object
from pyrt.format.trt_blob import ALIAS_KINDS, PLATFORMS, AliasedIO

ABI_VERSION = "10"
EXECUTE_ENGINE = "tensorrt::execute_engine"
MIN_SLOTS = 11  # ABI 10 programs written before slots 11/12 existed
SLOTS = 13
_FLATTEN_KEYS = ("version", "name", "device_info", "serialized_engine", "in_binding_names", "out_binding_names",
                 "hardware_compatible", "serialized_metadata", "target_platform", "requires_output_allocator",
                 "resource_allocation_strategy", "requires_native_multidevice", "aliased_io")


@dataclass(frozen=True)
class TorchTRTEngine:
    """A decoded Torch-TensorRT engine object."""

    name: str
    device_index: int
    engine: bytes
    input_names: list[str]
    output_names: list[str]
    hardware_compatible: bool
    serialized_metadata: str
    target_platform: str
    aliased_io: tuple[AliasedIO, ...]


def is_execute_engine(target: Any) -> bool:
    """True for ``tensorrt::execute_engine`` (any overload)."""
    schema = getattr(target, "_schema", None)
    return schema is not None and schema.name == EXECUTE_ENGINE


def engine_state(obj: Any, where: str) -> Sequence[Any]:
    """The serialized-state list of an engine object."""
    obj = unwrap_script_object(obj)
    getstate = getattr(obj, "__getstate__", None)
    state = getstate() if callable(getstate) else None
    if not _is_state(state):
        flatten = getattr(obj, "__obj_flatten__", None)
        if callable(flatten):
            items = dict(flatten())
            state = [items.get(k, "") for k in _FLATTEN_KEYS]
    if not _is_state(state):
        raise ExportError(
            f"{where}: {type(obj).__name__} is not a Torch-TensorRT engine (no {SLOTS}-slot serialized state)")
    return state


def _is_state(state: Any) -> TypeGuard[Sequence[Any]]:
    return isinstance(state, (list, tuple)) and len(state) >= MIN_SLOTS and all(
        isinstance(s, (str, bytes)) for s in state)


def decode_state(state: Sequence[Any], where: str) -> TorchTRTEngine:
    """Validate and decode a serialized-state list (see the module docstring)."""
    if not _is_state(state):
        raise ExportError(f"{where}: serialized state must be a list of at least {MIN_SLOTS} strings")
    text = [s.decode("utf-8", "replace") if isinstance(s, bytes) and i != 3 else s for i, s in enumerate(state)]
    if text[0] != ABI_VERSION:
        raise ExportError(f"{where}: Torch-TensorRT ABI version {text[0]!r}, pyrt reads ABI {ABI_VERSION!r}")
    return TorchTRTEngine(
        name=text[1],
        device_index=_device_index(text[2], where),
        engine=_engine_bytes(state[3], where),
        input_names=_names(text[4]),
        output_names=_names(text[5]),
        hardware_compatible=_flag(text[6], where, "hardware-compatible"),
        serialized_metadata=text[7],
        target_platform=text[8] if text[8] in PLATFORMS else "unknown",
        aliased_io=_aliases(text[12] if len(text) > 12 else "", where),
    )


def _device_index(info: str, where: str) -> int:
    gpu_id = info.split("%", 1)[0]
    if not gpu_id.isdigit():
        raise ExportError(f"{where}: device info {info!r} does not start with a GPU id")
    return int(gpu_id)


def _engine_bytes(raw: Any, where: str) -> bytes:
    if isinstance(raw, bytes):
        data = raw
    else:
        try:
            data = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ExportError(f"{where}: engine slot is neither bytes nor valid base64 ({exc})") from None
    if not data:
        raise ExportError(f"{where}: engine slot is empty")
    return data


def _names(joined: str) -> list[str]:
    return joined.split("%") if joined else []


def _flag(value: str, where: str, what: str) -> bool:
    if value not in ("0", "1"):
        raise ExportError(f"{where}: {what} flag is {value!r}, expected '0' or '1'")
    return value == "1"


def _aliases(joined: str, where: str) -> tuple[AliasedIO, ...]:
    out = []
    for record in _names(joined):
        parts = record.split("@")
        if len(parts) != 3 or parts[2] not in ALIAS_KINDS:
            raise ExportError(f"{where}: aliased I/O record {record!r} is not 'output@input@kind'")
        out.append(AliasedIO(*parts))
    return tuple(out)
