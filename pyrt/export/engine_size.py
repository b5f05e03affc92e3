"""How big each of a decoder's engines may be: ``max_engine_size`` as asked, or chosen from the host's memory.

Building an engine holds about :data:`BUILD_FACTOR` times its weights in host memory (TensorRT-RTX keeps
about twice an engine while it builds it, plus the graph and ONNX model it is built from), on top of what
the export's imports take (:data:`IMPORT_BYTES`). Without ``max_engine_size`` the decoder is one engine when
that estimate fits the host's available memory with :data:`MARGIN` to spare, else it is cut into the fewest
layer groups whose estimate does. :class:`EngineSize` says which, and why (the summary's ``grouping``).

>>> choose_engine_size(None, weight_bytes=1 << 30, available=16 << 30).limit is None
True
>>> choose_engine_size(None, weight_bytes=8 << 30, available=16 << 30).limit
4853313044
>>> choose_engine_size(1 << 28, weight_bytes=8 << 30, available=None).reason
'max_engine_size=256.0 MiB asked for'
"""

from __future__ import annotations

from dataclasses import dataclass

BUILD_FACTOR = 2.5  # host bytes per engine weight byte while an engine builds (README "Export an LLM")
IMPORT_BYTES = 1536 << 20  # torch, transformers, ExecuTorch and TensorRT imported
MARGIN = 0.8  # the share of the available memory an export plans to use
MIN_AUTO_SIZE = 64 << 20  # the smallest engine size chosen automatically


@dataclass(frozen=True)
class EngineSize:
    """``limit``: the most weight bytes per engine (None: one engine); ``reason``: why, in words."""

    limit: int | None
    reason: str


def available_host_bytes() -> int | None:
    """``MemAvailable`` of /proc/meminfo (None where there is none to read)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def estimated_peak(weight_bytes: int) -> int:
    """The host memory an export of one engine of ``weight_bytes`` needs at its peak."""
    return IMPORT_BYTES + int(BUILD_FACTOR * weight_bytes)


def choose_engine_size(asked: int | None, *, weight_bytes: int, available: int | None, devices: int = 1
                       ) -> EngineSize:
    """``asked`` (checked already) when given; else one engine when :func:`estimated_peak` fits ``MARGIN`` of
    ``available``, else the largest engine size whose estimate fits (at least :data:`MIN_AUTO_SIZE`). Over
    ``devices`` > 1 GPUs, at most a ``1/devices`` share of the weights, so every GPU can get a group."""
    if asked is not None:
        return EngineSize(asked, f"max_engine_size={_size(asked)} asked for")
    chosen = _for_host(weight_bytes, available)
    if devices <= 1:
        return chosen
    share = -(-weight_bytes // devices)
    if chosen.limit is not None and chosen.limit <= share:
        return chosen
    return EngineSize(share, f"layer groups of at most {_size(share)}: a 1/{devices} share of the weights, one or "
                             f"more groups per GPU ({chosen.reason})")


def _for_host(weight_bytes: int, available: int | None) -> EngineSize:
    peak = estimated_peak(weight_bytes)
    if available is None:
        return EngineSize(None, f"one engine: the host's available memory is unknown (estimated peak {_size(peak)})")
    room = int(MARGIN * available)
    if peak <= room:
        return EngineSize(None, f"one engine: its estimated peak {_size(peak)} fits the host's available memory "
                                f"{_size(available)} with a {1 - MARGIN:.0%} margin")
    limit = max(MIN_AUTO_SIZE, int((room - IMPORT_BYTES) / BUILD_FACTOR))
    return EngineSize(limit, f"layer groups of at most {_size(limit)}: one engine's estimated peak {_size(peak)} "
                             f"does not fit the host's available memory {_size(available)} with a "
                             f"{1 - MARGIN:.0%} margin")


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} B"


__all__ = ["EngineSize", "available_host_bytes", "choose_engine_size", "estimated_peak", "BUILD_FACTOR",
           "IMPORT_BYTES", "MARGIN"]
