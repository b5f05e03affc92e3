"""An engine's weights as ``pyrt inspect`` shows them: dtype, group size, bytes and streamable bytes.

Read from the file alone. A quantized engine names its scheme in the compile spec
:data:`pyrt.format.weight_quant.SPEC_KEY` (checked: an unknown scheme is an error, reported in
``weights_error``). A reference engine (``PYRTREF1``, pyrt's simulated GPU) is parsed and validated
(every quantized weight's packed size, scale shape and scale values), so its bytes and streamable
bytes are measured; a TensorRT engine's streamable bytes are known only once TensorRT deserializes
it on a GPU (``ICudaEngine.streamable_weights_size``), so they are ``None`` here and the bytes are
what the exporter measured when it built the engine.

>>> describe([], b"")
{'dtype': None, 'group_size': None, 'layers': 0, 'per_row': 0, 'quantized_bytes': 0, 'other_bytes': None, 'weight_bytes': None, 'streamable_bytes': None, 'source': 'unknown'}
"""  # noqa: E501 (a doctest's expected dict is one line)

from __future__ import annotations

from typing import Any

from pyrt.errors import PyrtError
from pyrt.format.weight_quant import SPEC_KEY, parse_spec
from pyrt.sim.refengine import MAGIC, RefEngine
from pyrt.sim.refengine.quant import TARGET


def describe(compile_specs: list[tuple[str, bytes]], engine: Any, source: str = "engine") -> dict[str, Any]:
    """The weights of one engine (``engine``: its bytes); raises PyrtError for a malformed spec or engine."""
    specs = [v for k, v in compile_specs if k == SPEC_KEY]
    if len(specs) > 1:
        raise PyrtError(f"{source}: compile spec {SPEC_KEY} appears {len(specs)} times")
    spec = parse_spec(specs[0], source) if specs else None
    out: dict[str, Any] = {
        "dtype": spec.scheme if spec else None, "group_size": spec.group_size if spec else None,
        "layers": spec.layers if spec else 0, "per_row": spec.per_row if spec else 0,
        "quantized_bytes": spec.weight_bytes if spec else 0, "other_bytes": spec.other_bytes if spec else None,
        "weight_bytes": spec.weight_bytes + spec.other_bytes if spec else None, "streamable_bytes": None,
        "source": "compile spec" if spec else "unknown",
    }
    if bytes(engine[:len(MAGIC)]) == MAGIC:
        out.update(_reference(RefEngine.from_bytes(engine, source=source)))
    return out


def _reference(eng: RefEngine) -> dict[str, Any]:
    """Measured from a reference engine: its quantized weights (values + scales) and the rest."""
    quantized = [n for n in eng.nodes if n.target == TARGET]
    stored = {a.name for n in quantized for a in n.args[:2]}
    total = sum(w.nbytes for w in eng.weights.values())
    packed = sum(eng.weights[name].nbytes for name in stored)
    bits = {n.args[2] for n in quantized}
    groups = {n.args[3] for n in quantized}
    return {
        "dtype": f"int{bits.pop()}" if len(bits) == 1 else (None if not bits else "mixed"),
        "group_size": max(groups) if groups else None, "layers": len(quantized),
        "per_row": sum(1 for n in quantized if n.args[3] == n.args[4][1]),
        "quantized_bytes": packed, "other_bytes": total - packed, "weight_bytes": total,
        "streamable_bytes": eng.streamable_weights_size, "source": "reference engine",
    }


def line(w: dict[str, Any], size: Any) -> str:
    """One line of the text report (``size``: bytes -> text)."""
    if w["dtype"] is None and w["weight_bytes"] is None:
        return "weights: not quantized; bytes and streamable bytes known when TensorRT loads it"
    kind = f"{w['dtype']} group {w['group_size']}" if w["dtype"] else "not quantized"
    rows = f", {w['per_row']} per row" if w["per_row"] else ""
    layers = f" ({w['layers']} layers{rows})" if w["layers"] else ""
    total = "?" if w["weight_bytes"] is None else size(w["weight_bytes"])
    stream = "streamable: known when TensorRT loads it" if w["streamable_bytes"] is None else \
        f"streamable {size(w['streamable_bytes'])}"
    return f"weights: {kind}{layers}, {total} ({size(w['quantized_bytes'])} quantized), {stream}"
