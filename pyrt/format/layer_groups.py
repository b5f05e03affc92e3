"""A layer group's compile specs: which decoder layers an engine of a file cut by ``max_engine_size`` holds.

``pyrt export --max-engine-size`` writes, beside each delegate's ``target_device``, ``layers`` (``"0-3"``,
``"4-7+head"``: the final norm and LM head too, ``"head"``: those alone) and ``weight_bytes`` (ASCII decimal: the
bytes of the group's weights as the model held them, before quantization). Runtimes need neither; ``pyrt inspect``
shows them.

>>> describe({"target_device": "cuda:1", "layers": "4-7+head", "weight_bytes": "1048576"}, lambda n: f"{n} B")
'layer group: layers 4-7+head, 1048576 B of weights, on cuda:1'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

SPEC_LAYERS = "layers"
SPEC_WEIGHT_BYTES = "weight_bytes"
SPEC_DEVICE = "target_device"


def describe(specs: Mapping[str, str], size: Callable[[int], str]) -> str:
    """One line for a delegate whose compile specs (key -> text) name its layer group, else ""."""
    layers = specs.get(SPEC_LAYERS)
    if not layers:
        return ""
    count = specs.get(SPEC_WEIGHT_BYTES, "")
    weights = f", {size(int(count))} of weights" if count.isdigit() else ""
    return f"layer group: layers {layers}{weights}, on {specs.get(SPEC_DEVICE, '?')}"


__all__ = ["SPEC_LAYERS", "SPEC_WEIGHT_BYTES", "describe"]
