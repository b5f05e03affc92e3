"""The instruction chain of each method as a Graphviz graph (``pyrt inspect --graph``).

Delegates (green boxes) and fallback kernels (grey) are told apart, every
node names the device it works on, and device copies (``et_copy`` ops,
orange) stand out. :func:`write_graph` renders SVG (or PNG, PDF) with
Graphviz's ``dot`` when it is on ``PATH``; without it, or for a ``.dot`` /
``.gv`` path, it writes the DOT text.

>>> from pyrt.pte_reader import PteFile
>>> with PteFile.open("model.pte") as pte:                       # doctest: +SKIP
...     text = to_dot(pte)
>>> write_graph(text, "model.svg")                               # doctest: +SKIP
'model.svg'
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from pyrt.errors import BlobFormatError, PyrtError
from pyrt.format.trt_blob import BACKEND_ID, parse_blob
from pyrt.pte_reader import DelegateCall, DeviceType, ExecutionPlan, FreeCall, JumpFalseCall, KernelCall, PteFile
from pyrt.tools.report import format_size

DOT_SUFFIXES = (".dot", ".gv")
STYLES = {  # node kind -> DOT attributes
    "kernel": 'shape=box, style="rounded,filled", fillcolor="#e8e8e8"',
    "delegate": 'shape=box3d, style=filled, fillcolor="#b6e07a", penwidth=1.5',
    "copy": 'shape=cds, style=filled, fillcolor="#ffb347", color="#d9480f", penwidth=2',
    "control": 'shape=ellipse, style=dashed, fontsize=9',
    "jump": 'shape=diamond, style=filled, fillcolor="#fff3bf"',
    "io": 'shape=note, style=filled, fillcolor="#dbe4ff"',
}


def _q(text: str) -> str:
    """A DOT double-quoted string (``\\n`` in ``text`` stays a line break)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _device_name(kind: DeviceType, index: int) -> str:
    return f"cuda:{index}" if kind == DeviceType.CUDA else "cpu"


def _value_device(plan: ExecutionPlan, i: int) -> str | None:
    if not 0 <= i < len(plan.values):
        return None
    v = plan.values[i]
    if v.kind != "Tensor":
        return None
    alloc = v.tensor.allocation_info
    if alloc is None:
        return "cpu"
    return _device_name(*plan.buffer_device(alloc.memory_id))


def _delegate_device(plan: ExecutionPlan, index: int) -> str:
    d = plan.delegates[index]
    spec = d.spec("target_device")
    if spec is not None:
        return bytes(spec).decode("ascii", "replace")
    if d.id == BACKEND_ID:
        try:
            return f"cuda:{parse_blob(plan.program.delegate_data(d)).device_id}"
        except BlobFormatError:
            return "?"
    return "?"


def _node(plan: ExecutionPlan, ins: Any) -> tuple[str, str]:
    """(style key, label) of one instruction."""
    if isinstance(ins, KernelCall):
        ops = plan.operators
        op = ops[ins.op_index].qualified_name if 0 <= ins.op_index < len(ops) else f"<bad op {ins.op_index}>"
        devices = [d for d in (_value_device(plan, a) for a in ins.args) if d is not None]
        if op.startswith("et_copy::") and len(devices) >= 2:
            return "copy", f"{op}\ncopy {devices[0]} -> {devices[-1]}"
        where = ", ".join(sorted(set(devices))) or "cpu"
        return "kernel", f"{op}\nfallback kernel on {where}"
    if isinstance(ins, DelegateCall):
        if not 0 <= ins.delegate_index < len(plan.delegates):
            return "delegate", f"delegate {ins.delegate_index} (out of range)"
        d = plan.delegates[ins.delegate_index]

        size = format_size(plan.program.delegate_data(d).nbytes)
        device = _delegate_device(plan, ins.delegate_index)
        return "delegate", f"delegate {ins.delegate_index}: {d.id}\non {device}, {size}"
    if isinstance(ins, JumpFalseCall):
        return "jump", f"jump if value {ins.cond_value_index} is false"
    if isinstance(ins, FreeCall):
        return "control", f"free value {ins.value_index}"
    return "control", f"move {ins.move_from} -> {ins.move_to}"


def _io_label(plan: ExecutionPlan, title: str, indices: tuple[int, ...]) -> str:
    lines = [title]
    for pos, i in enumerate(indices):
        v = plan.values[i] if 0 <= i < len(plan.values) else None
        if v is not None and v.kind == "Tensor":
            t = v.tensor
            lines.append(f"{pos}: {t.scalar_type.dtype_name}{list(t.sizes)} on {_value_device(plan, i)}")
        else:
            lines.append(f"{pos}: {v.kind if v is not None else '?'}")
    return "\n".join(lines)


def to_dot(pte: PteFile) -> str:
    """DOT text: one cluster per method, instructions in order, jumps as dashed edges, and a legend."""
    out = ["digraph pyrt {", "  rankdir=TB;", '  node [fontname="Helvetica", fontsize=10];',
           '  edge [fontname="Helvetica", fontsize=9];', f"  label={_q(pte.source)}; labelloc=t;"]
    for m, plan in enumerate(pte.program.execution_plan):
        out += [f"  subgraph cluster_m{m} {{", f"    label={_q(f'method {plan.name!r}')};"]
        first_id, last_ids = f"m{m}_in", list[str]()
        out.append(f"    {first_id} [{STYLES['io']}, label={_q(_io_label(plan, 'inputs', plan.inputs))}];")
        for c, chain in enumerate(plan.chains):
            ids = [f"m{m}_c{c}_{pc}" for pc in range(len(chain.instructions))]
            for pc, ins in enumerate(chain.instructions):
                style, label = _node(plan, ins)
                out.append(f"    {ids[pc]} [{STYLES[style]}, label={_q(f'{pc}. {label}')}];")
            prev = first_id if c == 0 else (last_ids[-1] if last_ids else first_id)
            for node in ids:
                out.append(f"    {prev} -> {node};")
                prev = node
            for pc, ins in enumerate(chain.instructions):
                if isinstance(ins, JumpFalseCall):
                    target = ids[ins.destination_instruction] if ins.destination_instruction < len(ids) \
                        else f"m{m}_out"
                    out.append(f'    {ids[pc]} -> {target} [style=dashed, label="false"];')
            if ids:
                last_ids.append(ids[-1])
        out.append(f"    m{m}_out [{STYLES['io']}, label={_q(_io_label(plan, 'outputs', plan.outputs))}];")
        out.append(f"    {last_ids[-1] if last_ids else first_id} -> m{m}_out;")
        out.append("  }")
    out += ["  subgraph cluster_legend {", '    label="legend"; fontsize=9;',
            f"    legend_d [{STYLES['delegate']}, label=\"TensorRT delegate\"];",
            f"    legend_k [{STYLES['kernel']}, label=\"fallback kernel\"];",
            f"    legend_c [{STYLES['copy']}, label=\"device copy\"];",
            "    legend_d -> legend_k -> legend_c [style=invis];", "  }", "}"]
    return "\n".join(out) + "\n"


def write_graph(dot_text: str, path: str | Path, *, dot: str | None = None) -> tuple[str, str | None]:
    """Write ``dot_text`` to ``path``, rendered by Graphviz for .svg/.png/.pdf (any suffix but .dot/.gv).

    Returns (path written, note): without Graphviz the DOT text goes to ``path`` with a .dot suffix
    and the note says so.
    """
    path = Path(path)
    if path.suffix.lower() in DOT_SUFFIXES:
        path.write_text(dot_text, encoding="utf-8")
        return str(path), None
    exe = dot or shutil.which("dot")
    if exe is None:
        fallback = path.with_suffix(".dot")
        fallback.write_text(dot_text, encoding="utf-8")
        return str(fallback), (f"Graphviz 'dot' is not on PATH: wrote DOT to {fallback} instead of {path} "
                               f"(render it with: dot -T{path.suffix[1:] or 'svg'} {fallback} -o {path})")
    fmt = path.suffix[1:].lower() or "svg"
    try:
        proc = subprocess.run([exe, f"-T{fmt}", "-o", str(path)], input=dot_text, capture_output=True, text=True,
                              timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PyrtError(f"Graphviz {exe!r} failed to render {path}: {exc}") from None
    if proc.returncode != 0:
        raise PyrtError(f"Graphviz {exe!r} could not render {path} (format {fmt!r}): {proc.stderr.strip()}")
    return str(path), None


__all__ = ["to_dot", "write_graph"]
