"""The reference engine format ("PYRTREF1") and its CPU executor.

A reference engine stands in for serialized TensorRT engine bytes on machines
without a GPU: export writes it, the fake TensorRT runtime deserializes it,
and its graph runs on the CPU with real arithmetic. Layout (little-endian)::

    0   8s  magic        b"PYRTREF1"
    8   u32 version      1
    12  u32 reserved     0
    16  u64 json_len     bytes of UTF-8 JSON that follow
    24  ... JSON, then zero padding up to a multiple of 64
    W   ... weights region (W = align64(24 + json_len)); each weight's
            ``offset`` is relative to W and a multiple of 64; the writer pads
            the last weight to 64 too, readers accept the data without it

The JSON lists ``inputs`` (name, dtype, shape, min_shape, max_shape),
``outputs`` (name, dtype, shape), ``weights`` (name, dtype, shape, offset,
nbytes), ``nodes`` (target such as ``aten::add.Tensor``, args, kwargs,
outputs) and ``weight_streaming``; optionally ``profiles`` (each ``{"shapes": {input: [min, opt,
max]}, "device_memory": bytes}``) and ``device_memory`` (activation bytes of the implicit single
profile; an input's own min/max is then the union of its profiles). An argument is ``{"ref": name}``,
``{"list": [...]}``, ``{"lit": value}`` (finite), ``{"float": "inf" | "-inf" |
"nan"}``, ``{"dtype": "float32"}``, ``{"memory_format": "contiguous_format"}``
or ``{"none": true}``. Targets are ATen ops (``aten::add.Tensor``) or SymInt
arithmetic (``sym::add``, ``sym::mul``, ``sym::floordiv``, ... over ints that
``aten::sym_size.int`` reads from tensors).

>>> import numpy as np
>>> eng = RefEngine(
...     inputs=[RefTensor("x", "float32", (2,))],
...     outputs=[RefTensor("y", "float32", (2,))],
...     weights={"w": np.array([10.0, 20.0], dtype=np.float32)},
...     nodes=[RefNode("aten::add.Tensor", [Ref("x"), Ref("w")], {}, ["y"])],
... )
>>> again = RefEngine.from_bytes(eng.to_bytes())
>>> again.run({"x": np.array([1.0, 2.0], dtype=np.float32)}, backend="numpy")["y"].tolist()
[11.0, 22.0]

The package: :mod:`.model` (the graph's parts, dtypes, errors), :mod:`.blob` (the byte
layout), :mod:`.validation`, :mod:`.backends` (torch or numpy) and :mod:`.engine`
(:class:`RefEngine`). It imports numpy, pyrt.errors and pyrt.format; torch only when a
torch backend is asked for.
"""

from __future__ import annotations

from pyrt.sim.refengine.blob import ALIGN, HEADER, MAGIC, MEMORY_FORMATS, NONFINITE, VERSION
from pyrt.sim.refengine.engine import SYM_OPS, RefEngine
from pyrt.sim.refengine.model import (
    DTYPES,
    DType,
    MemoryFormat,
    Ref,
    RefEngineExecutionError,
    RefEngineFormatError,
    RefNode,
    RefProfile,
    RefTensor,
    RefWeight,
)

__all__ = [
    "RefEngine", "RefProfile", "RefTensor", "RefWeight", "RefNode", "Ref", "DType", "MemoryFormat",
    "RefEngineFormatError", "RefEngineExecutionError", "DTYPES", "MAGIC", "VERSION", "HEADER", "ALIGN",
    "MEMORY_FORMATS", "NONFINITE",
    "SYM_OPS",
]
