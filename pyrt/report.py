"""Describe a .pte file as plain data (``pyrt.inspect``) or as a text report.

The dict shape is stable (documented in ``docs/inspect.md``); new keys may be
added, none removed.

>>> import pyrt
>>> info = pyrt.inspect("model.pte")                  # doctest: +SKIP
>>> [m["name"] for m in info["methods"]]              # doctest: +SKIP
['forward']
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from pyrt.errors import BlobFormatError
from pyrt.pte_reader import BackendDelegate, DataLocation, DelegateCall, ExecutionPlan, KernelCall, PteFile, Source
from pyrt.trt_blob import BACKEND_ID, parse_blob

ENGINE_PREVIEW_BYTES = 16


def inspect(source: Source | PteFile) -> dict[str, Any]:
    """Everything pyrt can tell about a .pte, as JSON-ready data."""
    if isinstance(source, PteFile):
        return _describe(source)
    with PteFile.open(source) as pte:
        return _describe(pte)


def _describe(pte: PteFile) -> dict[str, Any]:
    program = pte.program
    return {
        "file": {
            "source": pte.source,
            "size": pte.size,
            "identifier": pte.identifier,
            "program_size": pte.extended_header.program_size if pte.extended_header else pte.size,
            "segment_base_offset": pte.segment_base_offset,
            "segments": [{"offset": s.offset, "size": s.size} for s in program.segments],
        },
        "version": program.version,
        "methods": [_method(pte, plan) for plan in program.execution_plan],
    }


def _method(pte: PteFile, plan: ExecutionPlan) -> dict[str, Any]:
    values = plan.values
    instructions = [ins for chain in plan.chains for ins in chain.instructions]
    return {
        "name": plan.name,
        "inputs": list(plan.inputs),
        "outputs": list(plan.outputs),
        "input_specs": [_value_spec(values[i]) for i in plan.inputs],
        "output_specs": [_value_spec(values[i]) for i in plan.outputs],
        "num_values": len(values),
        "operators": [{"name": op.name, "overload": op.overload} for op in plan.operators],
        "instructions": [_instruction(plan, ins) for ins in instructions],
        "instruction_counts": dict(Counter(ins.kind for ins in instructions)),
        "non_const_buffer_sizes": list(plan.non_const_buffer_sizes),
        "non_const_buffer_device": [
            {"buffer_idx": d.buffer_idx, "device_type": d.device_type.name, "device_index": d.device_index}
            for d in plan.non_const_buffer_device
        ],
        "delegates": [_delegate(pte, plan, i, d) for i, d in enumerate(plan.delegates)],
    }


def _value_spec(value: Any) -> dict[str, Any]:
    if value.kind != "Tensor":
        return {"kind": value.kind}
    t = value.value
    return {
        "kind": "Tensor",
        "dtype": t.scalar_type.dtype_name,
        "shape": list(t.sizes),
        "dynamism": t.shape_dynamism.name,
    }


def _instruction(plan: ExecutionPlan, ins: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": ins.kind}
    if isinstance(ins, KernelCall):
        ops = plan.operators
        out["op"] = ops[ins.op_index].qualified_name if 0 <= ins.op_index < len(ops) else f"<bad op {ins.op_index}>"
    elif isinstance(ins, DelegateCall):
        out["delegate"] = ins.delegate_index
    return out


def _delegate(pte: PteFile, plan: ExecutionPlan, index: int, d: BackendDelegate) -> dict[str, Any]:
    blob = pte.program.delegate_data(d)
    info: dict[str, Any] = {
        "id": d.id,
        "location": "segment" if d.location == DataLocation.SEGMENT else "inline",
        "index": d.index,
        "size": blob.nbytes,
        "compile_specs": {c.key: c.text() for c in d.compile_specs},
        "tensorrt": None,
    }
    if d.id == BACKEND_ID:
        try:
            trt = parse_blob(blob, source=f"{pte.source}: method {plan.name!r} delegate {index}")
        except BlobFormatError as exc:
            info["tensorrt_error"] = str(exc)
        else:
            info["tensorrt"] = {
                "magic": trt.magic,
                "device_id": trt.device_id,
                "inputs": [b.name for b in trt.inputs],
                "outputs": [b.name for b in trt.outputs],
                "io_bindings": [b.to_json() for b in trt.io_bindings],
                "aliased_io": [a.to_json() for a in trt.aliased_io],
                "hardware_compatible": trt.hardware_compatible,
                "engine_size": trt.engine.nbytes,
                "engine_head": bytes(trt.engine[:ENGINE_PREVIEW_BYTES]).hex(),
                "target_platform": trt.target_platform,
            }
    return info


def _size(n: int) -> str:
    value: float = n
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return str(value)


def format_report(info: dict[str, Any]) -> str:
    """A readable text report of :func:`inspect`'s data."""
    f = info["file"]
    lines = [
        f"{f['source']}: {_size(f['size'])}, identifier {f['identifier']}, "
        f"{len(f['segments'])} segment(s) at base {f['segment_base_offset']}",
    ]
    for m in info["methods"]:
        lines.append(f"\nmethod {m['name']!r}: {m['num_values']} values")
        for label, specs in (("inputs", m["input_specs"]), ("outputs", m["output_specs"])):
            lines.append(f"  {label}:")
            for idx, spec in zip(m[label], specs, strict=True):
                if spec["kind"] == "Tensor":
                    lines.append(f"    [{idx}] {spec['dtype']}{spec['shape']} {spec['dynamism'].lower()}")
                else:
                    lines.append(f"    [{idx}] {spec['kind']}")
        counts = ", ".join(f"{k} {v}" for k, v in sorted(m["instruction_counts"].items())) or "none"
        lines.append(f"  instructions: {len(m['instructions'])} ({counts})")
        if m["operators"]:
            lines.append("  operators:")
            lines.extend(f"    {o['name']}.{o['overload']}" if o["overload"] else f"    {o['name']}"
                         for o in m["operators"])
        for i, d in enumerate(m["delegates"]):
            lines.append(f"  delegate {i}: {d['id']} ({d['location']} {d['index']}, {_size(d['size'])})")
            for k, v in d["compile_specs"].items():
                lines.append(f"    spec {k} = {v}")
            trt = d["tensorrt"]
            if trt:
                lines.append(
                    f"    {trt['magic']} device {trt['device_id']} {trt['target_platform']}, "
                    f"engine {_size(trt['engine_size'])} starting {trt['engine_head']}"
                )
                lines.append(f"    inputs  {', '.join(trt['inputs']) or '-'}")
                lines.append(f"    outputs {', '.join(trt['outputs']) or '-'}")
            elif "tensorrt_error" in d:
                lines.append(f"    invalid TensorRT blob: {d['tensorrt_error']}")
    return "\n".join(lines)
