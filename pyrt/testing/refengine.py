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
outputs) and ``weight_streaming``. An argument is ``{"ref": name}``,
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
"""

from __future__ import annotations

import io
import itertools
import json
import math
import operator
import struct
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pyrt.errors import EngineError, PyrtError, UnsupportedOperatorError
from pyrt.format.dtypes import itemsize_of

MAGIC = b"PYRTREF1"
VERSION = 1
HEADER = struct.Struct("<8sIIQ")  # magic, version, reserved, json_len
ALIGN = 64
_CHUNK = 64 << 20  # largest single write of weight bytes
# dtype name -> bytes per element; numpy cannot hold bfloat16 (torch can).
DTYPES: dict[str, int] = {
    name: itemsize_of(name)
    for name in ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool")
}


class RefEngineFormatError(EngineError, ValueError):
    """Bytes claiming to be a reference engine are malformed."""


class RefEngineExecutionError(EngineError):
    """A reference graph could not run (bad shapes, wrong output dtype, ...)."""


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


# -- the graph model ---------------------------------------------------------
@dataclass(frozen=True)
class Ref:
    """An argument naming a graph input, a weight or an earlier node output."""

    name: str


@dataclass(frozen=True)
class DType:
    """An argument that is a dtype (e.g. ``_to_copy``'s ``dtype=``)."""

    name: str


@dataclass(frozen=True)
class MemoryFormat:
    """An argument that is a ``torch.memory_format`` (e.g. ``clone``'s ``memory_format=``)."""

    name: str


MEMORY_FORMATS = ("contiguous_format", "preserve_format", "channels_last", "channels_last_3d")
NONFINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}
SYM_OPS: dict[str, Any] = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "floordiv": operator.floordiv,
    "mod": operator.mod, "pow": operator.pow, "neg": operator.neg, "truediv": operator.truediv,
    "max": max, "min": min,
}


@dataclass(frozen=True)
class RefTensor:
    """A graph input or output; -1 marks a dynamic dim (inputs then need min/max)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    min_shape: tuple[int, ...] | None = None
    max_shape: tuple[int, ...] | None = None

    def profile(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(min_shape, max_shape); a static input's are its shape."""
        return tuple(self.min_shape or self.shape), tuple(self.max_shape or self.shape)


@dataclass(frozen=True)
class RefWeight:
    """A constant: raw little-endian bytes of a C-contiguous tensor."""

    dtype: str
    shape: tuple[int, ...]
    data: memoryview

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    @classmethod
    def of(cls, value: Any, *, copy: bool = True) -> RefWeight:
        """From a numpy array or a torch tensor (copied to contiguous CPU bytes).

        ``copy=False`` views the bytes instead where they already are contiguous CPU
        memory, so the weight changes with ``value``.
        """
        if isinstance(value, RefWeight):
            return value
        if hasattr(value, "detach"):  # a torch tensor: bfloat16 survives as raw bytes
            t = value.detach().cpu().contiguous()
            raw = t.reshape(-1).view(__import__("torch").uint8).numpy()
            dtype, shape = str(t.dtype).removeprefix("torch."), tuple(t.shape)
        else:
            raw = np.asarray(value, order="C")  # (ascontiguousarray would make 0-d arrays 1-d)
            dtype, shape = raw.dtype.name, tuple(raw.shape)
        return cls(dtype, shape, memoryview(raw.tobytes() if copy else raw.reshape(-1).view(np.uint8)))


@dataclass(frozen=True)
class RefNode:
    """One op call: ``target`` like ``aten::mm`` or ``aten::add.Tensor``; one output name per result."""

    target: str
    args: list[Any]
    kwargs: dict[str, Any]
    outputs: list[str]


@dataclass
class RefEngine:
    """A reference engine: I/O, weights, nodes and whether its weights stream."""

    inputs: list[RefTensor]
    outputs: list[RefTensor]
    weights: dict[str, Any] = field(default_factory=dict)
    nodes: list[RefNode] = field(default_factory=list)
    weight_streaming: bool = False

    _weights_by_backend: dict[str, dict[str, Any]] = field(default_factory=dict, init=False, repr=False, compare=False)
    _numpy_runs_all: bool | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.weights = {name: RefWeight.of(w) for name, w in self.weights.items()}
        _validate(self, "RefEngine")

    def _auto(self) -> _Backend:
        """torch if it is imported already or this graph needs it, else numpy: a run imports no torch for nothing."""
        if self._numpy_runs_all is None:
            self._numpy_runs_all = "bfloat16" not in repr((self.inputs, self.outputs, self.nodes)) and all(
                w.dtype != "bfloat16" for w in self.weights.values()) and all(
                n.target.startswith("sym::") or (n.target.startswith("aten::") and
                                                 "{1}.{2}".format(*_split_target(n.target)) in _NUMPY_OPS)
                for n in self.nodes)
        return _backend("auto" if "torch" in sys.modules or not self._numpy_runs_all else "numpy")

    def _env(self, be: _Backend) -> dict[str, Any]:
        """A fresh environment holding the weights (converted once per backend)."""
        if be.name not in self._weights_by_backend:
            self._weights_by_backend[be.name] = {n: be.weight(w) for n, w in self.weights.items()}
        return dict(self._weights_by_backend[be.name])

    @property
    def streamable_weights_size(self) -> int:
        """Total weight bytes when weights stream, else 0."""
        return sum(w.nbytes for w in self.weights.values()) if self.weight_streaming else 0

    def to_bytes(self) -> bytes:
        """Serialize (weights 64-aligned after the JSON); :meth:`write_to` streams the same bytes."""
        out = io.BytesIO()
        self.write_to(out)
        return out.getvalue()

    def write_to(self, sink: Any) -> int:
        """Write :meth:`to_bytes`'s bytes to ``sink`` (anything with ``write``); returns their count.

        Weights go out as views of at most 64 MiB each, so a multi-GiB engine never sits in
        memory whole.
        """
        head, offsets, size = self._layout()
        sink.write(head)
        cursor = 0
        for name, w in self.weights.items():
            sink.write(bytes(offsets[name] - cursor))
            data = w.data.cast("B")
            for start in range(0, w.nbytes, _CHUNK):
                sink.write(data[start : start + _CHUNK])
            cursor = offsets[name] + w.nbytes
        sink.write(bytes(size - cursor))  # the last weight is padded too
        return len(head) + size

    def _layout(self) -> tuple[bytes, dict[str, int], int]:
        """(header + JSON + zero padding, each weight's offset in the weights region, the region's size)."""
        offsets, cursor = {}, 0
        for name, w in self.weights.items():
            offsets[name], cursor = cursor, _align(cursor + w.nbytes)
        doc = {
            "inputs": [_tensor_json(t, True) for t in self.inputs],
            "outputs": [_tensor_json(t, False) for t in self.outputs],
            "weights": [
                {"name": n, "dtype": w.dtype, "shape": list(w.shape), "offset": offsets[n], "nbytes": w.nbytes}
                for n, w in self.weights.items()
            ],
            "nodes": [
                {"target": n.target, "args": [_encode_arg(a) for a in n.args],
                 "kwargs": {k: _encode_arg(v) for k, v in n.kwargs.items()}, "outputs": list(n.outputs)}
                for n in self.nodes
            ],
            "weight_streaming": self.weight_streaming,
        }
        try:
            text = json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()
        except ValueError as exc:
            raise RefEngineFormatError(f"RefEngine: a literal argument is not valid JSON: {exc}") from exc
        head = HEADER.pack(MAGIC, VERSION, 0, len(text)) + text
        return head + bytes(_align(len(head)) - len(head)), offsets, cursor

    @classmethod
    def from_bytes(cls, data: Any, *, source: str = "<refengine>") -> RefEngine:
        """Parse and validate; weights are zero-copy views of ``data``."""
        return _parse(memoryview(data).cast("B"), source)

    # -- execution --------------------------------------------------------
    def run(self, inputs: Mapping[str, Any], *, backend: str = "auto") -> dict[str, Any]:
        """Execute on the CPU: torch.ops.aten when torch imports (``"torch"``), else numpy.

        ``inputs`` maps input names to arrays/tensors; returns output name -> value
        (torch tensors from the torch backend, numpy arrays from the numpy one).
        """
        be = _backend(backend)
        env = self._env(be)
        for spec in self.inputs:
            if spec.name not in inputs:
                raise RefEngineExecutionError(f"reference engine input {spec.name!r} was not given")
            value = be.tensor(inputs[spec.name])
            if be.dtype(value) != spec.dtype or not _fits(tuple(value.shape), spec):
                raise RefEngineExecutionError(
                    f"input {spec.name!r} is {be.dtype(value)}{list(value.shape)}, "
                    f"expected {spec.dtype} within {spec.profile()}"
                )
            env[spec.name] = value
        return self._execute(be, env)

    def run_bytes(
        self, inputs: Mapping[str, tuple[np.ndarray, tuple[int, ...]]]
    ) -> dict[str, tuple[np.ndarray, tuple[int, ...]]]:
        """Execute from raw bytes: ``{name: (uint8 array, shape)}`` in and out."""
        be = self._auto()
        env = self._env(be)
        for spec in self.inputs:
            raw, shape = inputs[spec.name]
            env[spec.name] = be.from_raw(raw, spec.dtype, shape)
        out = self._execute(be, env)
        return {name: be.to_raw(value) for name, value in out.items()}

    def infer_output_shapes(self, input_shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
        """Output shapes for given input shapes (declared ones when every output is static)."""
        if all(-1 not in t.shape for t in self.outputs):
            return {t.name: tuple(t.shape) for t in self.outputs}
        be = self._auto()
        env: dict[str, Any] = {n: be.weight(w, meta=True) for n, w in self.weights.items()}
        for spec in self.inputs:
            env[spec.name] = be.empty(tuple(input_shapes[spec.name]), spec.dtype, meta=True)
        try:
            out = self._execute(be, env)
        except RefEngineExecutionError:
            if be.name != "torch":
                raise
            env = self._env(be)
            for spec in self.inputs:
                env[spec.name] = be.empty(tuple(input_shapes[spec.name]), spec.dtype, meta=False)
            out = self._execute(be, env)
        return {name: tuple(int(d) for d in value.shape) for name, value in out.items()}

    def _execute(self, be: _Backend, env: dict[str, Any]) -> dict[str, Any]:
        for node in self.nodes:
            args = [_resolve(a, env, be) for a in node.args]
            kwargs = {k: _resolve(v, env, be) for k, v in node.kwargs.items()}
            result = _sym_call(node.target, args) if node.target.startswith("sym::") else be.call(
                node.target, args, kwargs)
            results = list(result) if isinstance(result, (tuple, list)) else [result]
            if len(results) != len(node.outputs):
                raise RefEngineExecutionError(
                    f"{node.target} returned {len(results)} values for outputs {node.outputs}"
                )
            env.update(zip(node.outputs, results, strict=True))
        out = {}
        for spec in self.outputs:
            value = env[spec.name]
            got_dtype, got_shape = be.dtype(value), tuple(int(d) for d in value.shape)
            if got_dtype != spec.dtype:
                raise RefEngineExecutionError(
                    f"output {spec.name!r} computed as {got_dtype}, declared {spec.dtype}"
                )
            if len(got_shape) != len(spec.shape) or any(
                d != -1 and d != g for d, g in zip(spec.shape, got_shape, strict=True)
            ):
                raise RefEngineExecutionError(
                    f"output {spec.name!r} computed with shape {got_shape}, declared {tuple(spec.shape)}"
                )
            out[spec.name] = value
        return out


def _sym_call(target: str, args: list[Any]) -> Any:
    """SymInt arithmetic on plain ints (``sym::add`` and friends)."""
    fn = SYM_OPS.get(target.removeprefix("sym::"))
    if fn is None:
        raise UnsupportedOperatorError(f"reference executor: unknown size operator {target!r}; "
                                       f"known: {', '.join('sym::' + k for k in SYM_OPS)}")
    try:
        return fn(*(int(a) for a in args))
    except (TypeError, ValueError, ZeroDivisionError) as exc:
        raise RefEngineExecutionError(f"{target}{tuple(args)} failed: {exc}") from exc


# -- argument encoding ----------------------------------------------------------
def _encode_arg(arg: Any) -> dict[str, Any]:
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
        return {"list": [_encode_arg(a) for a in arg]}
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


def _tensor_json(t: RefTensor, is_input: bool) -> dict[str, Any]:
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
    bad_bool = isinstance(value, bool) and kind in (int, (int,))
    if bad_bool or not isinstance(value, kind):
        raise RefEngineFormatError(f"{where}: field {key!r} has the wrong type ({value!r:.60})")
    return value


def _shape(value: Any, where: str, *, dynamic: bool) -> tuple[int, ...]:
    lowest = -1 if dynamic else 0
    if not isinstance(value, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= lowest for d in value
    ):
        raise RefEngineFormatError(f"{where}: shape must be a list of ints >= {lowest}, got {value!r:.80}")
    return tuple(value)


def _parse(data: memoryview, source: str) -> RefEngine:
    size = data.nbytes
    if size < HEADER.size:
        raise RefEngineFormatError(f"{source}: {size} bytes is shorter than the {HEADER.size}-byte header")
    magic, version, reserved, json_len = HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise RefEngineFormatError(f"{source}: bad magic {bytes(magic)!r}, expected {MAGIC!r}")
    if version != VERSION or reserved != 0:
        raise RefEngineFormatError(f"{source}: unsupported version {version} (reserved {reserved}); expected {VERSION}")
    base = _align(HEADER.size + json_len)
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
    inputs = []
    for i, t in enumerate(_field(doc, "inputs", list, source)):
        where = f"{source}: inputs[{i}]"
        inputs.append(RefTensor(
            _field(t, "name", str, where), _field(t, "dtype", str, where),
            _shape(_field(t, "shape", list, where), where, dynamic=True),
            _shape(_field(t, "min_shape", list, where), where + ".min_shape", dynamic=False),
            _shape(_field(t, "max_shape", list, where), where + ".max_shape", dynamic=False),
        ))
    outputs = []
    for i, t in enumerate(_field(doc, "outputs", list, source)):
        where = f"{source}: outputs[{i}]"
        outputs.append(RefTensor(_field(t, "name", str, where), _field(t, "dtype", str, where),
                                 _shape(_field(t, "shape", list, where), where, dynamic=True)))
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
    streaming = _field(doc, "weight_streaming", bool, source)
    try:
        return RefEngine(inputs, outputs, weights, nodes, streaming)
    except RefEngineFormatError as exc:
        raise RefEngineFormatError(f"{source}: {exc}") from None


def _validate(eng: RefEngine, where: str) -> None:
    defined: set[str] = set()

    def define(name: Any, what: str) -> None:
        if not isinstance(name, str) or not name:
            raise RefEngineFormatError(f"{where}: {what} name must be a non-empty string, got {name!r}")
        if name in defined:
            raise RefEngineFormatError(f"{where}: name {name!r} ({what}) is defined twice")
        defined.add(name)

    def check_dtype(dtype: str, what: str) -> None:
        if dtype not in DTYPES:
            raise RefEngineFormatError(f"{where}: {what} has unknown dtype {dtype!r}; known: {sorted(DTYPES)}")

    if not eng.outputs:
        raise RefEngineFormatError(f"{where}: an engine needs at least one output")
    for t in eng.inputs:
        define(t.name, "input")
        check_dtype(t.dtype, f"input {t.name!r}")
        _check_profile(t, where)
    for name, w in eng.weights.items():
        define(name, "weight")
        check_dtype(w.dtype, f"weight {name!r}")
        want = math.prod(w.shape) * DTYPES[w.dtype]
        if w.nbytes != want:
            raise RefEngineFormatError(
                f"{where}: weight {name!r} holds {w.nbytes} bytes, but {w.dtype}{list(w.shape)} needs {want}"
            )
    for i, node in enumerate(eng.nodes):
        if not isinstance(node.target, str) or "::" not in node.target:
            raise RefEngineFormatError(f"{where}: nodes[{i}] target {node.target!r} is not 'namespace::op[.overload]'")
        for ref in _names([node.args, list(node.kwargs.values())], Ref):
            if ref not in defined:
                raise RefEngineFormatError(f"{where}: nodes[{i}] ({node.target}) uses {ref!r} before it is defined")
        for dt in _names([node.args, list(node.kwargs.values())], DType):
            check_dtype(dt, f"nodes[{i}] ({node.target}) dtype argument")
        if not node.outputs:
            raise RefEngineFormatError(f"{where}: nodes[{i}] ({node.target}) names no outputs")
        for out in node.outputs:
            define(out, f"nodes[{i}] output")
    seen_outputs: set[str] = set()
    for t in eng.outputs:
        check_dtype(t.dtype, f"output {t.name!r}")
        if t.name not in defined:
            raise RefEngineFormatError(f"{where}: output {t.name!r} is produced by nothing")
        if t.name in seen_outputs:
            raise RefEngineFormatError(f"{where}: output {t.name!r} is listed twice")
        seen_outputs.add(t.name)
        if any(not isinstance(d, int) or d < -1 for d in t.shape):
            raise RefEngineFormatError(f"{where}: output {t.name!r} shape {t.shape!r} is invalid")


def _fits(shape: tuple[int, ...], spec: RefTensor) -> bool:
    lo, hi = spec.profile()
    return len(shape) == len(lo) and all(a <= d <= b for d, a, b in zip(shape, lo, hi, strict=True))


def _check_profile(t: RefTensor, where: str) -> None:
    if any(not isinstance(d, int) or d < -1 for d in t.shape):
        raise RefEngineFormatError(f"{where}: input {t.name!r} shape {t.shape!r} is invalid")
    if -1 in t.shape and (t.min_shape is None or t.max_shape is None):
        raise RefEngineFormatError(f"{where}: dynamic input {t.name!r} needs min_shape and max_shape")
    lo, hi = t.profile()
    if not len(lo) == len(hi) == len(t.shape):
        raise RefEngineFormatError(
            f"{where}: input {t.name!r} min_shape {lo} / max_shape {hi} do not match the rank of {t.shape}"
        )
    for d, a, b in zip(t.shape, lo, hi, strict=True):
        if a < 0 or a > b or (d != -1 and not a == b == d):
            raise RefEngineFormatError(
                f"{where}: input {t.name!r} profile min {lo} .. max {hi} is inconsistent with shape {t.shape}"
            )


def _names(args: Any, kind: type[Ref] | type[DType]) -> list[str]:
    """The ``name`` of every ``kind`` argument in ``args``, lists searched through."""
    if isinstance(args, kind):
        return [args.name]
    if isinstance(args, (list, tuple)):
        return [r for a in args for r in _names(a, kind)]
    return []


def _resolve(arg: Any, env: dict[str, Any], be: _Backend) -> Any:
    if isinstance(arg, Ref):
        return env[arg.name]
    if isinstance(arg, DType):
        return be.dtype_object(arg.name)
    if isinstance(arg, MemoryFormat):
        return be.memory_format(arg.name)
    if isinstance(arg, list):
        return [_resolve(a, env, be) for a in arg]
    return arg


# -- execution backends ---------------------------------------------------------
class _Backend:
    """What the executor needs from a tensor library (torch or numpy)."""

    name = ""

    def call(self, target: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        raise NotImplementedError

    def dtype(self, value: Any) -> str:
        raise NotImplementedError

    def dtype_object(self, name: str) -> Any:
        raise NotImplementedError

    def memory_format(self, name: str) -> Any:
        return None  # numpy arrays are always contiguous copies

    def tensor(self, value: Any) -> Any:
        raise NotImplementedError

    def from_raw(self, raw: np.ndarray, dtype: str, shape: Sequence[int]) -> Any:
        raise NotImplementedError

    def to_raw(self, value: Any) -> tuple[np.ndarray, tuple[int, ...]]:
        raise NotImplementedError

    def weight(self, w: RefWeight, *, meta: bool = False) -> Any:
        raise NotImplementedError

    def empty(self, shape: tuple[int, ...], dtype: str, *, meta: bool) -> Any:
        raise NotImplementedError


def _backend(choice: str) -> _Backend:
    if choice not in ("auto", "torch", "numpy"):
        raise PyrtError(f"reference executor backend must be 'auto', 'torch' or 'numpy', got {choice!r}")
    if choice in ("auto", "torch"):
        try:
            return _TorchBackend()
        except ImportError:
            if choice == "torch":
                raise
    return _NumpyBackend()


def _split_target(target: str) -> tuple[str, str, str]:
    namespace, _, rest = target.partition("::")
    op, _, overload = rest.partition(".")
    return namespace, op, overload or "default"


class _TorchBackend(_Backend):
    name = "torch"

    def __init__(self) -> None:
        import torch

        self.torch = torch

    def dtype_object(self, name: str) -> Any:
        return getattr(self.torch, name)

    def memory_format(self, name: str) -> Any:
        return getattr(self.torch, name)

    def dtype(self, value: Any) -> str:
        return str(value.dtype).removeprefix("torch.")

    def tensor(self, value: Any) -> Any:
        return value if isinstance(value, self.torch.Tensor) else self.torch.from_numpy(np.asarray(value))

    def from_raw(self, raw: np.ndarray, dtype: str, shape: Sequence[int]) -> Any:
        flat = self.torch.from_numpy(np.array(raw, dtype=np.uint8, copy=True))
        return flat.view(self.dtype_object(dtype)).reshape(tuple(shape))

    def to_raw(self, value: Any) -> tuple[np.ndarray, tuple[int, ...]]:
        t = value.detach().contiguous()
        return t.reshape(-1).view(self.torch.uint8).numpy(), tuple(t.shape)

    def weight(self, w: RefWeight, *, meta: bool = False) -> Any:
        if meta:
            return self.empty(w.shape, w.dtype, meta=True)
        return self.from_raw(np.frombuffer(w.data, dtype=np.uint8), w.dtype, w.shape)

    def empty(self, shape: tuple[int, ...], dtype: str, *, meta: bool) -> Any:
        device = "meta" if meta else "cpu"
        return self.torch.zeros(shape, dtype=self.dtype_object(dtype), device=device)

    def call(self, target: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        namespace, op, overload = _split_target(target)
        try:
            fn = getattr(getattr(getattr(self.torch.ops, namespace), op), overload)
        except (AttributeError, RuntimeError) as exc:
            raise UnsupportedOperatorError(f"reference executor: torch has no operator {target!r}") from exc
        try:
            return fn(*args, **kwargs)
        except (RuntimeError, TypeError, ValueError, IndexError) as exc:
            raise RefEngineExecutionError(f"{target} failed: {exc}") from exc


def _binary(fn: Any) -> Any:
    def run(a: Any, b: Any, alpha: Any = 1) -> Any:
        return fn(a, b if alpha == 1 else b * alpha)

    return run


def _reduce(fn: Any) -> Any:
    def run(x: Any, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Any:
        axis = tuple(dim) if isinstance(dim, list) and dim else (None if dim in (None, []) else dim)
        out = fn(x, axis=axis, keepdims=keepdim)
        return np.asarray(out, dtype=dtype or (x.dtype if x.dtype.kind == "f" else None))

    return run


def _scaled(x: Any, factor: Any) -> Any:
    return x if factor == 1 else x * factor


def _true_div(a: Any, b: Any) -> Any:
    out = np.true_divide(a, b)
    kinds = {np.asarray(v).dtype.kind for v in (a, b)}
    return out.astype(np.float32) if kinds <= {"i", "u", "b"} else out


_NUMPY_OPS: dict[str, Any] = {
    "add.Tensor": _binary(np.add), "add.Scalar": _binary(np.add),
    "sub.Tensor": lambda a, b, alpha=1: np.subtract(a, b if alpha == 1 else b * alpha),
    "sub.Scalar": lambda a, b, alpha=1: np.subtract(a, b if alpha == 1 else b * alpha),
    "mul.Tensor": np.multiply, "mul.Scalar": np.multiply,
    "div.Tensor": _true_div, "div.Scalar": _true_div,
    "relu.default": lambda x: np.maximum(x, np.zeros((), x.dtype)),
    "sigmoid.default": lambda x: (1 / (1 + np.exp(-x))).astype(x.dtype),
    "tanh.default": np.tanh,
    "mm.default": np.matmul, "matmul.default": np.matmul, "bmm.default": np.matmul,
    "addmm.default": lambda bias, a, b, beta=1, alpha=1: _scaled(bias, beta) + _scaled(a @ b, alpha),
    "linear.default": lambda x, w, b=None: x @ w.T if b is None else x @ w.T + b,
    "permute.default": lambda x, dims: np.transpose(x, dims),
    "t.default": lambda x: x.T,
    "transpose.int": lambda x, a, b: np.swapaxes(x, a, b),
    "view.default": lambda x, shape: np.reshape(x, shape),
    "reshape.default": lambda x, shape: np.reshape(x, shape),
    "_unsafe_view.default": lambda x, shape: np.reshape(x, shape),
    "cat.default": lambda tensors, dim=0: np.concatenate(tensors, axis=dim),
    "sum.default": lambda x, dtype=None: _reduce(np.sum)(x, None, False, dtype),
    "sum.dim_IntList": _reduce(np.sum),
    "mean.default": lambda x, dtype=None: _reduce(np.mean)(x, None, False, dtype),
    "mean.dim": _reduce(np.mean),
    "clone.default": lambda x, memory_format=None: np.array(x, copy=True),
    "slice.Tensor": lambda x, dim=0, start=None, end=None, step=1: x[
        (slice(None),) * (dim % x.ndim) + (slice(start, end, step),)],  # a view: big weights stay untouched
    "sym_size.int": lambda x, dim: int(np.shape(x)[dim]),
}


class _NumpyBackend(_Backend):
    """The numpy core set, for machines without torch; refuses anything else by name."""

    name = "numpy"

    def dtype_object(self, name: str) -> Any:
        return np.dtype(self._np_name(name))

    @staticmethod
    def _np_name(dtype: str) -> str:
        if dtype == "bfloat16":
            raise UnsupportedOperatorError("reference executor: numpy cannot hold bfloat16 (install torch)")
        return dtype

    def dtype(self, value: Any) -> str:
        return np.asarray(value).dtype.name

    def tensor(self, value: Any) -> Any:
        return np.asarray(value)

    def from_raw(self, raw: np.ndarray, dtype: str, shape: Sequence[int]) -> Any:
        return np.frombuffer(bytes(raw), dtype=self._np_name(dtype)).reshape(tuple(shape))

    def to_raw(self, value: Any) -> tuple[np.ndarray, tuple[int, ...]]:
        arr = np.asarray(value, order="C")
        return arr.reshape(-1).view(np.uint8), tuple(arr.shape)

    def weight(self, w: RefWeight, *, meta: bool = False) -> Any:
        return np.frombuffer(w.data, dtype=self._np_name(w.dtype)).reshape(w.shape)

    def empty(self, shape: tuple[int, ...], dtype: str, *, meta: bool) -> Any:
        return np.zeros(shape, dtype=self._np_name(dtype))

    def call(self, target: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        namespace, op, overload = _split_target(target)
        fn = _NUMPY_OPS.get(f"{op}.{overload}") if namespace == "aten" else None
        if fn is None:
            raise UnsupportedOperatorError(
                f"reference executor (numpy, torch not installed) cannot run {target!r}; "
                f"it runs aten::{{{', '.join(sorted(_NUMPY_OPS))}}}"
            )
        try:
            out = fn(*args, **kwargs)
            return out if isinstance(out, int) else np.asarray(out)
        except (ValueError, TypeError, IndexError) as exc:
            raise RefEngineExecutionError(f"{target} failed: {exc}") from exc
