"""Describe a .pte file as plain data (``pyrt.inspect``) or as a text report.

The dict shape is stable (documented in ``docs/inspect.md``); new keys may be
added, none removed.

>>> import pyrt
>>> info = pyrt.inspect("model.pte")                  # doctest: +SKIP
>>> [m["name"] for m in info["methods"]]              # doctest: +SKIP
['forward']
"""

from __future__ import annotations

import os
import stat
from collections import Counter
from typing import Any

from pyrt.errors import BlobFormatError, PteFormatError, PyrtError
from pyrt.format import layer_groups
from pyrt.format.ptd_reader import FILE_IDENTIFIER as PTD_IDENTIFIER
from pyrt.format.ptd_reader import DataSource, ExternalData, PtdFile
from pyrt.format.trt_blob import BACKEND_ID, parse_blob
from pyrt.pte_reader import (
    BackendDelegate,
    DataLocation,
    DelegateCall,
    ExecutionPlan,
    KernelCall,
    PteFile,
    Source,
)
from pyrt.tools import engine_weights

ENGINE_PREVIEW_BYTES = 16
IN_PTE = ".pte"  # a stored tensor's "file" when its bytes are in the program file itself
TENSORS_LISTED = 32  # external tensors named one by one in the text report


def inspect(source: Source | PteFile, *, data: Any = None) -> dict[str, Any]:
    """Everything pyrt can tell about a .pte (or a .ptd data file), as JSON-ready data.

    ``data``: the program's .ptd file(s); each tensor stored in a file then says which one.
    """
    if isinstance(source, PteFile):
        return _with_data(source, data)
    if _is_ptd(source):
        if data is not None:
            raise PteFormatError(f"{source!r} is a .ptd data file: inspect it alone, or inspect its .pte with data=")
        with PtdFile.open(source) as ptd:
            return describe_ptd(ptd)
    with PteFile.open(source) as pte:
        return _with_data(pte, data)


def _is_ptd(source: Any) -> bool:
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(memoryview(source)[4:8]) == PTD_IDENTIFIER
    try:
        path = os.fspath(source)
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the open: PteFile.open reports it
            return False
        with open(path, "rb") as f:
            return f.read(8)[4:8] == PTD_IDENTIFIER
    except (OSError, TypeError, ValueError):
        return False  # PteFile.open reports it


def _with_data(pte: PteFile, data: DataSource | list[DataSource] | None) -> dict[str, Any]:
    if data is None:
        return _describe(pte)
    previous = pte.external
    with ExternalData.open(data) as external:
        pte.attach_data(external)
        try:
            return _describe(pte)
        finally:
            pte.attach_data(previous)


def describe_ptd(ptd: PtdFile) -> dict[str, Any]:
    """A .ptd's header, segments and entries (``pyrt inspect model.ptd``)."""
    h = ptd.header
    return {
        "file": {"source": ptd.source, "size": ptd.size, "identifier": PTD_IDENTIFIER.decode(),
                 "flatbuffer_size": h.flatbuffer_offset + h.flatbuffer_size,
                 "segment_base_offset": h.segment_base_offset, "segment_data_size": h.segment_data_size,
                 "segments": [{"offset": off - h.segment_base_offset, "size": size} for off, size in ptd.segments]},
        "version": ptd.version,
        "entries": [
            {"key": e.key, "segment_index": e.segment_index, "offset": e.offset, "size": e.size,
             "dtype": e.layout.scalar_type.dtype_name if e.layout else None,
             "shape": list(e.layout.sizes) if e.layout else None,
             "dim_order": list(e.layout.dim_order) if e.layout else None}
            for e in ptd.entries.values()
        ],
    }


def _describe(pte: PteFile) -> dict[str, Any]:
    program = pte.program
    info: dict[str, Any] = {
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
    if pte.external is not None:
        info["data_files"] = list(pte.external.sources)
    return info


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
        "tensors": _stored_tensors(pte, plan),
    }


def _stored_tensors(pte: PteFile, plan: ExecutionPlan) -> list[dict[str, Any]]:
    """Every tensor whose bytes come from a file: where they live (a .pte segment or a .ptd entry)."""
    out = []
    for i, v in enumerate(plan.values):
        if v.kind != "Tensor":
            continue
        t = v.tensor
        mutable = t.allocation_info is not None
        if not (t.is_external or t.data_buffer_idx > 0):
            continue
        entry: dict[str, Any] = {"value": i, "dtype": t.scalar_type.dtype_name, "shape": list(t.sizes),
                                 "nbytes": t.nbytes, "mutable": mutable}
        if t.is_external:
            key = t.extra_tensor_info.fully_qualified_name if t.extra_tensor_info else None
            entry.update(location="external", key=key, file=_external_file(pte, key))
        else:
            entry.update(location="mutable_segment" if mutable else "constant_segment"
                         if pte.program.constant_segment and len(pte.program.constant_segment.offsets) > 1
                         else "constant_buffer", key=None, file=IN_PTE)
        out.append(entry)
    return out


def _external_file(pte: PteFile, key: str | None) -> str | None:
    """The file holding external tensor ``key``: a .ptd, this .pte (its own named data), or None (missing)."""
    if not key:
        return None
    found = pte.external.find(key) if pte.external is not None else None
    if found is not None:
        return found[0].source
    return IN_PTE if any(nd.key == key for nd in pte.program.named_data) else None


def _value_spec(value: Any) -> dict[str, Any]:
    if value.kind in ("Int", "Double", "Bool", "String"):  # a literal in the file (a constant method's answer)
        literal = value.value
        return {"kind": value.kind, "value": bytes(literal).decode("utf-8", "replace")
                if isinstance(literal, (bytes, bytearray, memoryview)) else literal}
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
            try:
                info["weights"] = engine_weights.describe([(c.key, c.value) for c in d.compile_specs], trt.engine,
                                                          f"{pte.source}: method {plan.name!r} delegate {index}")
            except PyrtError as exc:
                info["weights_error"] = str(exc)
    return info


def format_size(n: int) -> str:
    value: float = n
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return str(value)


def format_report(info: dict[str, Any]) -> str:
    """A readable text report of :func:`inspect`'s data."""
    f = info["file"]
    if "entries" in info:
        return _format_ptd(info)
    lines = [
        f"{f['source']}: {format_size(f['size'])}, identifier {f['identifier']}, "
        f"{len(f['segments'])} segment(s) at base {f['segment_base_offset']}",
    ]
    if info.get("data_files"):
        lines.append(f"data files: {', '.join(info['data_files'])}")
    for m in info["methods"]:
        lines.append(f"\nmethod {m['name']!r}: {m['num_values']} values")
        for label, specs in (("inputs", m["input_specs"]), ("outputs", m["output_specs"])):
            lines.append(f"  {label}:")
            for idx, spec in zip(m[label], specs, strict=True):
                if spec["kind"] == "Tensor":
                    lines.append(f"    [{idx}] {spec['dtype']}{spec['shape']} {spec['dynamism'].lower()}")
                elif "value" in spec:
                    lines.append(f"    [{idx}] {spec['kind']} = {spec['value']!r}")
                else:
                    lines.append(f"    [{idx}] {spec['kind']}")
        counts = ", ".join(f"{k} {v}" for k, v in sorted(m["instruction_counts"].items())) or "none"
        lines.append(f"  instructions: {len(m['instructions'])} ({counts})")
        if m["operators"]:
            lines.append("  operators:")
            lines.extend(f"    {o['name']}.{o['overload']}" if o["overload"] else f"    {o['name']}"
                         for o in m["operators"])
        for i, d in enumerate(m["delegates"]):
            lines.append(f"  delegate {i}: {d['id']} ({d['location']} {d['index']}, {format_size(d['size'])})")
            for k, v in d["compile_specs"].items():
                lines.append(f"    spec {k} = {v}")
            group = layer_groups.describe(d["compile_specs"], format_size)
            if group:
                lines.append(f"    {group}")
            trt = d["tensorrt"]
            if trt:
                lines.append(
                    f"    {trt['magic']} device {trt['device_id']} {trt['target_platform']}, "
                    f"engine {format_size(trt['engine_size'])} starting {trt['engine_head']}"
                )
                lines.append(f"    inputs  {', '.join(trt['inputs']) or '-'}")
                lines.append(f"    outputs {', '.join(trt['outputs']) or '-'}")
                if "weights" in d:
                    lines.append(f"    {engine_weights.line(d['weights'], format_size)}")
                else:
                    lines.append(f"    invalid weights: {d.get('weights_error')}")
            elif "tensorrt_error" in d:
                lines.append(f"    invalid TensorRT blob: {d['tensorrt_error']}")
        lines.extend(_format_tensors(m.get("tensors", [])))
    lines.extend(_format_constants(info["methods"]))
    return "\n".join(lines)


def _format_constants(methods: list[dict[str, Any]]) -> list[str]:
    """One line for the methods that answer a constant (an LLM file's max_seq_len, vocabulary, EOS ids, slots...)."""
    found = [f"{m['name']} = {', '.join(repr(s['value']) for s in m['output_specs'])}" for m in methods
             if not m["inputs"] and not m["instructions"] and m["output_specs"]
             and all("value" in s for s in m["output_specs"])]
    return ["", "constant methods: " + "; ".join(found)] if found else []


def _format_tensors(tensors: list[dict[str, Any]]) -> list[str]:
    if not tensors:
        return []
    by_where = Counter((t["location"], t["file"]) for t in tensors)
    sizes: Counter[tuple[str, str | None]] = Counter()
    for t in tensors:
        sizes[(t["location"], t["file"])] += t["nbytes"]
    lines = ["  stored tensors:"]
    for (where, file), n in sorted(by_where.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        place = {None: "MISSING (no data file holds them)", IN_PTE: "the .pte"}.get(file, file)
        lines.append(f"    {where}: {n} tensor(s), {format_size(sizes[(where, file)])} in {place}")
    external = [t for t in tensors if t["location"] == "external"]
    for t in external[:TENSORS_LISTED]:
        place = {None: "missing", IN_PTE: "the .pte"}.get(t["file"], os.path.basename(str(t["file"])))
        lines.append(f"      {t['key']}: {t['dtype']}{t['shape']} -> {place}")
    if len(external) > TENSORS_LISTED:
        lines.append(f"      ... and {len(external) - TENSORS_LISTED} more (--json lists them all)")
    return lines


def _format_ptd(info: dict[str, Any]) -> str:
    f = info["file"]
    lines = [f"{f['source']}: {format_size(f['size'])}, identifier {f['identifier']} "
             f"(.ptd, version {info['version']}), "
             f"{len(info['entries'])} entries in {len(f['segments'])} segment(s) at base {f['segment_base_offset']}"]
    for e in info["entries"]:
        layout = f"{e['dtype']}{e['shape']}" if e["dtype"] is not None else "untyped"
        lines.append(f"  {e['key']}: {layout}, {format_size(e['size'])} at offset {e['offset']} (segment "
                     f"{e['segment_index']})")
    return "\n".join(lines)
