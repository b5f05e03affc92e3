"""Which TensorRT builds: the flavour (``tensorrt``, ``tensorrt_rtx`` or a module), its builder
session with the logger that collects its errors, and the checked build options.

Used by :mod:`pyrt.export.trt_builder`; tensorrt is imported only when a session opens.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from pyrt.checks import is_int
from pyrt.device.tensorrt_seam import FLAVOURS, shared_logger
from pyrt.errors import ExportError

RUNTIME_ONLY_FLAVOURS = ("tensorrt_lean", "tensorrt_dispatch")  # TensorRT packages without a Builder
# The flavours that build engines, in the order "auto" tries them: pyrt.device's table of flavours
# (one list for the runtime and the builder) less the runtime-only ones.
BUILDER_FLAVOURS = tuple(name for name in FLAVOURS if name not in RUNTIME_ONLY_FLAVOURS)


@dataclass
class Session:
    """One flavour's builder with the logger that collects its error lines."""

    trt: ModuleType
    name: str
    logger: Any
    builder: Any


@dataclass(frozen=True)
class BuildOptions:
    """The checked options of one engine build (:func:`build_options`)."""

    weight_streaming: bool
    workspace: int | None
    compute_capabilities: tuple[str, ...] | None  # ComputeCapability member names


def open_session(flavour: str | ModuleType, options: BuildOptions) -> Session:
    if isinstance(flavour, ModuleType):
        return _session_for(flavour, options)
    if flavour == "auto":
        return _auto_session(options)
    if flavour in RUNTIME_ONLY_FLAVOURS:
        raise ExportError(_runtime_only(flavour))
    if flavour not in BUILDER_FLAVOURS:
        raise ExportError(f"flavour {flavour!r} is not one of 'auto', {', '.join(map(repr, BUILDER_FLAVOURS))}")
    return _session_for(_import(flavour), options)


def resolve_flavour(flavour: str | ModuleType = "auto") -> ModuleType:
    """The TensorRT module that builds for ``flavour``; ExportError says why none can.

    >>> resolve_flavour("tensorrt_lean")
    Traceback (most recent call last):
    ...
    pyrt.errors.ExportError: flavour 'tensorrt_lean' is a runtime-only TensorRT package and has no builder; use 'tensorrt' or 'tensorrt_rtx' to build engines
    """  # noqa: E501 (a doctest's expected message is one line)
    return open_session(flavour, build_options(False, None, None)).trt


def _auto_session(options: BuildOptions) -> Session:
    reasons = []
    for name in BUILDER_FLAVOURS:
        try:
            return _session_for(_import(name), options)
        except ExportError as exc:
            reasons.append(str(exc))
    raise ExportError("flavour 'auto' found no TensorRT that can build engines ("
                      + "; ".join(reasons) + "; tensorrt_lean and tensorrt_dispatch are runtime-only)")


def _import(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ExportError(f"flavour {name!r} is not importable: {exc}") from exc


def _session_for(trt: ModuleType, options: BuildOptions) -> Session:
    name = trt.__name__.split(".")[0]
    if name in RUNTIME_ONLY_FLAVOURS:
        raise ExportError(_runtime_only(name))
    missing = [a for a in ("Builder", "OnnxParser", "ILogger") if not hasattr(trt, a)]
    if missing:
        raise ExportError(f"flavour {name!r} has no {', '.join(missing)}: it cannot build engines from ONNX")
    if options.compute_capabilities is not None and not hasattr(trt, "ComputeCapability"):
        raise ExportError(f"compute_capabilities was given but flavour {name!r} has no ComputeCapability "
                          "API (only TensorRT-RTX targets compute capabilities)")

    logger = shared_logger(trt)  # TensorRT keeps one logger per process: share the runtime's
    logger.messages.take()
    try:
        builder = trt.Builder(logger)
    except Exception as exc:  # TensorRT raises for a failed factory (e.g. no GPU for tensorrt)
        raise ExportError(f"{name}.Builder() failed: {exc} {logged_errors(logger)}".rstrip()) from exc
    if builder is None:
        raise ExportError(f"{name}.Builder() returned None {logged_errors(logger)}".rstrip())
    return Session(trt, name, logger, builder)


def _runtime_only(name: str) -> str:
    return (f"flavour {name!r} is a runtime-only TensorRT package and has no builder; "
            "use 'tensorrt' or 'tensorrt_rtx' to build engines")


def logged_errors(logger: Any) -> str:
    text = logger.messages.take()
    return f"; TensorRT said: {text}" if text else ""


def build_options(weight_streaming: bool, workspace: int | None, caps: Sequence[str] | None) -> BuildOptions:
    if not isinstance(weight_streaming, bool):
        raise ExportError(f"weight_streaming must be a bool, got {weight_streaming!r}")
    if workspace is not None and not is_int(workspace, low=1):
        raise ExportError(f"workspace must be a positive number of bytes, got {workspace!r}")
    return BuildOptions(weight_streaming, workspace, None if caps is None else parse_compute_capabilities(caps))


def parse_compute_capabilities(caps: Sequence[str]) -> tuple[str, ...]:
    """Normalise target names to TensorRT-RTX ComputeCapability member names.

    >>> parse_compute_capabilities(["sm86", "8.9", "SM_120"])
    ('SM86', 'SM89', 'SM120')
    """
    if isinstance(caps, (str, bytes)) or not isinstance(caps, Sequence) or not caps:
        raise ExportError(f"compute_capabilities must be a non-empty list such as ['sm86'], got {caps!r}")
    names = tuple(_capability_name(c, i) for i, c in enumerate(caps))
    if len(set(names)) != len(names):
        raise ExportError(f"compute_capabilities {list(caps)!r} repeats a target")
    if "CURRENT" in names and len(names) > 1:
        raise ExportError(f"compute_capabilities {list(caps)!r}: 'current' must be the only target")
    return names


_KNOWN_CAPABILITIES = ("CURRENT", "SM75", "SM80", "SM86", "SM89", "SM120", "SM121")


def _capability_name(cap: Any, index: int) -> str:
    text = getattr(cap, "name", cap)
    if not isinstance(text, str):
        raise ExportError(f"compute_capabilities[{index}] = {cap!r} is not a string such as 'sm86'")
    key = text.strip().upper().replace("_", "").replace(".", "")
    key = "SM" + key if key.isdigit() else key
    if key not in _KNOWN_CAPABILITIES:
        raise ExportError(f"compute_capabilities[{index}] = {cap!r} is not one of "
                          f"{', '.join(k.lower() for k in _KNOWN_CAPABILITIES)}")
    return key
