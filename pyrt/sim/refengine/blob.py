"""The PYRTREF1 byte layout: header, JSON metadata (arguments encoded and decoded), 64-aligned
weights; :func:`parse_blob` reads bytes back step by step, naming the field at fault.
"""

from __future__ import annotations

import itertools
import json
import math
import struct
from typing import Any

from pyrt.checks import is_int
from pyrt.sim.refengine.model import (
    DType,
    MemoryFormat,
    Ref,
    RefEngineFormatError,
    RefNode,
    RefProfile,
    RefTensor,
    RefWeight,
)

MAGIC = b"PYRTREF1"
VERSION = 1
HEADER = struct.Struct("<8sIIQ")  # magic, version, reserved, json_len
ALIGN = 64
WRITE_CHUNK = 64 << 20  # largest single write of weight bytes


def align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


MEMORY_FORMATS = ("contiguous_format", "preserve_format", "channels_last", "channels_last_3d")
NONFINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


# -- argument encoding ----------------------------------------------------------
def encode_arg(arg: Any) -> dict[str, Any]:
    if isinstance(arg, Ref):
        return {"ref": arg.name}
    if isinstance(arg, DType):
        return {"dtype": arg.name}
    if isinstance(arg, MemoryFormat):
        return {"memory_format": arg.name}
    if isinstance(arg, float) and not math.isfinite(arg):
        return {"float": "nan" if math.isnan(arg) else ("inf" if arg > 0 else "-inf")}
    if arg is None:
        return {"none": True}
    if isinstance(arg, (list, tuple)):
        return {"list": [encode_arg(a) for a in arg]}
    if isinstance(arg, (bool, int, float, str)):
        return {"lit": arg}
    raise RefEngineFormatError(f"RefEngine: cannot encode argument {arg!r} ({type(arg).__name__})")


def _decode_arg(obj: Any, where: str) -> Any:
    if not isinstance(obj, dict) or len(obj) != 1:
        raise RefEngineFormatError(f"{where}: an argument must be an object with one key, got {obj!r:.80}")
    (key, value), = obj.items()
    if key == "ref" and isinstance(value, str):
        return Ref(value)
    if key == "dtype" and isinstance(value, str):
        return DType(value)
    if key == "memory_format" and value in MEMORY_FORMATS:
        return MemoryFormat(value)
    if key == "float" and value in NONFINITE:
        return NONFINITE[value]
    if key == "none" and value is True:
        return None
    if key == "list" and isinstance(value, list):
        return [_decode_arg(v, where) for v in value]
    if key == "lit" and _is_literal(value):
        return value
    raise RefEngineFormatError(f"{where}: invalid argument {obj!r:.80}")


def _is_literal(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, (bool, int, str)):
        return True
    return isinstance(value, list) and all(_is_literal(v) for v in value)


def tensor_json(t: RefTensor, is_input: bool) -> dict[str, Any]:
    doc: dict[str, Any] = {"name": t.name, "dtype": t.dtype, "shape": list(t.shape)}
    if is_input:
        lo, hi = t.profile()
        doc.update(min_shape=list(lo), max_shape=list(hi))
    return doc


# -- parsing and validation --------------------------------------------------------
def _field(obj: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(obj, dict):
        raise RefEngineFormatError(f"{where}: expected an object, got {type(obj).__name__}")
    if key not in obj:
        raise RefEngineFormatError(f"{where}: missing field {key!r}")
    value = obj[key]
    if not (is_int(value) if kind in (int, (int,)) else isinstance(value, kind)):
        raise RefEngineFormatError(f"{where}: field {key!r} has the wrong type ({value!r:.60})")
    return value


def _shape(value: Any, where: str, *, dynamic: bool) -> tuple[int, ...]:
    lowest = -1 if dynamic else 0
    if not isinstance(value, list) or not all(is_int(d, low=lowest) for d in value):
        raise RefEngineFormatError(f"{where}: shape must be a list of ints >= {lowest}, got {value!r:.80}")
    return tuple(value)


def parse_blob(
    data: memoryview, source: str
) -> tuple[list[RefTensor], list[RefTensor], dict[str, RefWeight], list[RefNode], bool, tuple[Any, ...]]:
    """(inputs, outputs, weights, nodes, weight_streaming, (profiles, device_memory)) of the engine in
    ``data``; weights are views of it."""
    base, doc = _read_header(data, source)
    return (_parse_inputs(doc, source), _parse_outputs(doc, source), _parse_weights(doc, data, base, source),
            _parse_nodes(doc, source), _field(doc, "weight_streaming", bool, source), _parse_profiles(doc, source))


def _parse_profiles(doc: dict[str, Any], source: str) -> tuple[list[RefProfile], int]:
    """Optional keys (engines written before profiles have neither): ``profiles``, ``device_memory``."""
    if "profiles" not in doc and "device_memory" not in doc:
        return [], 0
    profiles = []
    for i, p in enumerate(_field(doc, "profiles", list, source)):
        where = f"{source}: profiles[{i}]"
        shapes = {}
        for name, bounds in _field(p, "shapes", dict, where).items():
            if not isinstance(bounds, list) or len(bounds) != 3:
                raise RefEngineFormatError(f"{where}: shapes[{name!r}] must be [min, opt, max], got {bounds!r:.80}")
            lo, opt, hi = (_shape(b, f"{where}.shapes[{name!r}]", dynamic=False) for b in bounds)
            shapes[str(name)] = (lo, opt, hi)
        profiles.append(RefProfile(shapes, _field(p, "device_memory", int, where)))
    return profiles, _field(doc, "device_memory", int, source)


def _read_header(data: memoryview, source: str) -> tuple[int, dict[str, Any]]:
    """Check the header and the padding after the JSON: (where the weights region starts, the JSON)."""
    size = data.nbytes
    if size < HEADER.size:
        raise RefEngineFormatError(f"{source}: {size} bytes is shorter than the {HEADER.size}-byte header")
    magic, version, reserved, json_len = HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise RefEngineFormatError(f"{source}: bad magic {bytes(magic)!r}, expected {MAGIC!r}")
    if version != VERSION or reserved != 0:
        raise RefEngineFormatError(f"{source}: unsupported version {version} (reserved {reserved}); expected {VERSION}")
    base = align(HEADER.size + json_len)
    if base > size:
        raise RefEngineFormatError(
            f"{source}: JSON of {json_len} bytes at offset {HEADER.size} plus padding to {base} "
            f"overruns the data (length {size})"
        )
    if any(data[HEADER.size + json_len : base]):
        raise RefEngineFormatError(
            f"{source}: padding after the JSON (offsets {HEADER.size + json_len}..{base}) is not zero"
        )
    try:
        doc = json.loads(bytes(data[HEADER.size : HEADER.size + json_len]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise RefEngineFormatError(f"{source}: JSON metadata is invalid: {exc}") from exc
    if not isinstance(doc, dict):
        raise RefEngineFormatError(f"{source}: JSON metadata must be an object")
    return base, doc


def _parse_inputs(doc: dict[str, Any], source: str) -> list[RefTensor]:
    inputs = []
    for i, t in enumerate(_field(doc, "inputs", list, source)):
        where = f"{source}: inputs[{i}]"
        inputs.append(RefTensor(
            _field(t, "name", str, where), _field(t, "dtype", str, where),
            _shape(_field(t, "shape", list, where), where, dynamic=True),
            _shape(_field(t, "min_shape", list, where), where + ".min_shape", dynamic=False),
            _shape(_field(t, "max_shape", list, where), where + ".max_shape", dynamic=False),
        ))
    return inputs


def _parse_outputs(doc: dict[str, Any], source: str) -> list[RefTensor]:
    outputs = []
    for i, t in enumerate(_field(doc, "outputs", list, source)):
        where = f"{source}: outputs[{i}]"
        outputs.append(RefTensor(_field(t, "name", str, where), _field(t, "dtype", str, where),
                                 _shape(_field(t, "shape", list, where), where, dynamic=True)))
    return outputs


def _parse_weights(doc: dict[str, Any], data: memoryview, base: int, source: str) -> dict[str, RefWeight]:
    """The weights, as views of ``data``: each inside the weights region, none overlapping another."""
    size = data.nbytes
    weights, spans = {}, []
    for i, w in enumerate(_field(doc, "weights", list, source)):
        where = f"{source}: weights[{i}]"
        name, dtype = _field(w, "name", str, where), _field(w, "dtype", str, where)
        shape = _shape(_field(w, "shape", list, where), where, dynamic=False)
        offset, nbytes = _field(w, "offset", int, where), _field(w, "nbytes", int, where)
        if offset < 0 or nbytes < 0 or offset % ALIGN:
            raise RefEngineFormatError(f"{where} {name!r}: offset {offset} must be >= 0 and a multiple of {ALIGN}")
        if base + offset + nbytes > size:
            raise RefEngineFormatError(
                f"{where} {name!r}: offset {offset} size {nbytes} overruns the weights region "
                f"(starts at {base}, data length {size})"
            )
        if name in weights:
            raise RefEngineFormatError(f"{where}: duplicate weight name {name!r}")
        spans.append((offset, offset + nbytes, name))
        weights[name] = RefWeight(dtype, shape, data[base + offset : base + offset + nbytes])
    spans.sort()
    for (_, end, a), (start, _, b) in itertools.pairwise(spans):
        if start < end:
            raise RefEngineFormatError(f"{source}: weights {a!r} and {b!r} overlap (offset {start} < {end})")
    return weights


def _parse_nodes(doc: dict[str, Any], source: str) -> list[RefNode]:
    nodes = []
    for i, n in enumerate(_field(doc, "nodes", list, source)):
        where = f"{source}: nodes[{i}]"
        kwargs = _field(n, "kwargs", dict, where)
        out_names = _field(n, "outputs", list, where)
        if not all(isinstance(o, str) for o in out_names):
            raise RefEngineFormatError(f"{where}: outputs must be a list of names")
        nodes.append(RefNode(
            _field(n, "target", str, where),
            [_decode_arg(a, where) for a in _field(n, "args", list, where)],
            {str(k): _decode_arg(v, f"{where}.kwargs[{k!r}]") for k, v in kwargs.items()},
            out_names,
        ))
    return nodes
