"""The reference engine: :class:`RefEngine` serialises itself (see :mod:`.blob`) and runs its
graph on the CPU through a backend, checking inputs and outputs against their declarations.
"""

from __future__ import annotations

import io
import json
import operator
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pyrt.errors import PyrtError, UnsupportedOperatorError
from pyrt.sim.refengine import quant
from pyrt.sim.refengine.backends import NUMPY_OPS, Backend, pick_backend, split_target
from pyrt.sim.refengine.blob import HEADER, MAGIC, VERSION, WRITE_CHUNK, align, encode_arg, parse_blob, tensor_json
from pyrt.sim.refengine.model import (
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
from pyrt.sim.refengine.validation import check_profiles, fits, validate_graph

SHAPES_KEPT = 256  # input shapes whose output shapes an engine remembers

SYM_OPS: dict[str, Any] = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "floordiv": operator.floordiv,
    "mod": operator.mod, "pow": operator.pow, "neg": operator.neg, "truediv": operator.truediv,
    "max": max, "min": min,
}


@dataclass
class RefEngine:
    """A reference engine: I/O, weights, nodes and whether its weights stream."""

    inputs: list[RefTensor]
    outputs: list[RefTensor]
    weights: dict[str, Any] = field(default_factory=dict)
    nodes: list[RefNode] = field(default_factory=list)
    weight_streaming: bool = False
    profiles: list[RefProfile] = field(default_factory=list)  # empty: one, the inputs' min/max
    device_memory: int = 0  # activation bytes of the implicit profile (``profiles`` carry their own)

    _weights_by_backend: dict[str, dict[str, Any]] = field(default_factory=dict, init=False, repr=False, compare=False)
    _numpy_runs_all: bool | None = field(default=None, init=False, repr=False, compare=False)
    _shapes_seen: dict[tuple[Any, ...], dict[str, tuple[int, ...]]] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.weights = {name: RefWeight.of(w) for name, w in self.weights.items()}
        validate_graph(self, "RefEngine")
        check_profiles(self, "RefEngine")

    def optimization_profiles(self) -> list[RefProfile]:
        """The engine's optimization profiles (at least one)."""
        return list(self.profiles) or [RefProfile({}, self.device_memory)]

    def _auto(self) -> Backend:
        """torch if it is imported already or this graph needs it, else numpy: a run imports no torch for nothing."""
        if self._numpy_runs_all is None:
            self._numpy_runs_all = "bfloat16" not in repr((self.inputs, self.outputs, self.nodes)) and all(
                w.dtype != "bfloat16" for w in self.weights.values()) and all(
                n.target.startswith("sym::") or n.target == quant.TARGET or (n.target.startswith("aten::") and
                                                 "{1}.{2}".format(*split_target(n.target)) in NUMPY_OPS)
                for n in self.nodes)
        return pick_backend("auto" if "torch" in sys.modules or not self._numpy_runs_all else "numpy")

    def prepare(self) -> None:
        """Pick the library a run will use now (importing torch when the graph needs it) and convert the weights.

        The fake TensorRT calls this when it makes an execution context, i.e. when a Program loads, so a
        first run's time (a first token's, say) measures the run, not a one-time ``import torch``; an
        engine with dynamic output shapes also infers them once, at the first profile's opt shapes (the
        first inference sets up torch's meta machinery, seconds that TensorRT never spends).
        """
        self._env(self._auto())
        if any(-1 in t.shape for t in self.outputs):
            profile = self.optimization_profiles()[0]
            self.infer_output_shapes({t.name: profile.bounds(t)[1] for t in self.inputs})

    def _env(self, be: Backend) -> dict[str, Any]:
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
            for start in range(0, w.nbytes, WRITE_CHUNK):
                sink.write(data[start : start + WRITE_CHUNK])
            cursor = offsets[name] + w.nbytes
        sink.write(bytes(size - cursor))  # the last weight is padded too
        return len(head) + size

    def _layout(self) -> tuple[bytes, dict[str, int], int]:
        """(header + JSON + zero padding, each weight's offset in the weights region, the region's size)."""
        offsets, cursor = {}, 0
        for name, w in self.weights.items():
            offsets[name], cursor = cursor, align(cursor + w.nbytes)
        doc = {
            "inputs": [tensor_json(t, True) for t in self.inputs],
            "outputs": [tensor_json(t, False) for t in self.outputs],
            "weights": [
                {"name": n, "dtype": w.dtype, "shape": list(w.shape), "offset": offsets[n], "nbytes": w.nbytes}
                for n, w in self.weights.items()
            ],
            "nodes": [
                {"target": n.target, "args": [encode_arg(a) for a in n.args],
                 "kwargs": {k: encode_arg(v) for k, v in n.kwargs.items()}, "outputs": list(n.outputs)}
                for n in self.nodes
            ],
            "weight_streaming": self.weight_streaming,
        }
        if self.profiles or self.device_memory:
            doc["device_memory"] = self.device_memory
            doc["profiles"] = [{"shapes": {n: [list(d) for d in b] for n, b in p.shapes.items()},
                                "device_memory": p.device_memory} for p in self.profiles]
        try:
            text = json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()
        except ValueError as exc:
            raise RefEngineFormatError(f"RefEngine: a literal argument is not valid JSON: {exc}") from exc
        head = HEADER.pack(MAGIC, VERSION, 0, len(text)) + text
        return head + bytes(align(len(head)) - len(head)), offsets, cursor

    @classmethod
    def from_bytes(cls, data: Any, *, source: str = "<refengine>") -> RefEngine:
        """Parse and validate; weights are zero-copy views of ``data``."""
        inputs, outputs, weights, nodes, streaming, extra = parse_blob(memoryview(data).cast("B"), source)
        try:
            return RefEngine(inputs, outputs, weights, nodes, streaming, *extra)
        except RefEngineFormatError as exc:
            raise RefEngineFormatError(f"{source}: {exc}") from None

    # -- execution --------------------------------------------------------
    def run(self, inputs: Mapping[str, Any], *, backend: str = "auto") -> dict[str, Any]:
        """Execute on the CPU: torch.ops.aten when torch imports (``"torch"``), else numpy.

        ``inputs`` maps input names to arrays/tensors; returns output name -> value
        (torch tensors from the torch backend, numpy arrays from the numpy one).
        """
        be = pick_backend(backend)
        env = self._env(be)
        for spec in self.inputs:
            if spec.name not in inputs:
                raise RefEngineExecutionError(f"reference engine input {spec.name!r} was not given")
            value = be.tensor(inputs[spec.name])
            if be.dtype(value) != spec.dtype or not fits(tuple(value.shape), spec):
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
        """Output shapes for given input shapes (declared ones when every output is static).

        A dim only the data decides (``nonzero``'s rows) is -1, as TensorRT reports it before
        running: the graph runs on meta tensors, and where an op has no meta kernel, on torch's
        fake tensors with a shape environment, whose data-dependent sizes stay symbolic.
        """
        if all(-1 not in t.shape for t in self.outputs):
            return {t.name: tuple(t.shape) for t in self.outputs}
        be = self._auto()
        key = (be.name, *(tuple(input_shapes[spec.name]) for spec in self.inputs))
        seen = self._shapes_seen.get(key)
        if seen is None:  # TensorRT infers shapes in C++, in microseconds: the meta run is done once per shape
            seen = self._infer_shapes(be, input_shapes)
            if len(self._shapes_seen) < SHAPES_KEPT:
                self._shapes_seen[key] = seen
        return dict(seen)

    def _infer_shapes(self, be: Backend, input_shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
        env: dict[str, Any] = {n: be.weight(w, meta=True) for n, w in self.weights.items()}
        for spec in self.inputs:
            env[spec.name] = be.empty(tuple(input_shapes[spec.name]), spec.dtype, meta=True)
        try:
            out = self._execute(be, env)
        except RefEngineExecutionError:
            if be.name != "torch":
                raise
            symbolic = self._symbolic_shapes(be, input_shapes)
            if symbolic is not None:
                return symbolic
            env = self._env(be)
            for spec in self.inputs:
                env[spec.name] = be.empty(tuple(input_shapes[spec.name]), spec.dtype, meta=False)
            out = self._execute(be, env)
        return {name: tuple(int(d) for d in value.shape) for name, value in out.items()}

    def _symbolic_shapes(self, be: Backend, input_shapes: Mapping[str, Sequence[int]]
                         ) -> dict[str, tuple[int, ...]] | None:
        """Output shapes under torch's FakeTensorMode (-1 for an unbacked size); None if it fails."""
        import torch
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        try:
            with FakeTensorMode(shape_env=ShapeEnv()):
                env: dict[str, Any] = {n: be.empty(w.shape, w.dtype, meta=False) for n, w in self.weights.items()}
                for spec in self.inputs:
                    env[spec.name] = be.empty(tuple(input_shapes[spec.name]), spec.dtype, meta=False)
                out = self._execute(be, env)
        except (PyrtError, RuntimeError):
            return None
        return {name: tuple(d if isinstance(d, int) else -1 for d in value.shape) for name, value in out.items()
                if not isinstance(value, torch.SymInt)}

    def _execute(self, be: Backend, env: dict[str, Any]) -> dict[str, Any]:
        for node in self.nodes:
            args = [_resolve(a, env, be) for a in node.args]
            kwargs = {k: _resolve(v, env, be) for k, v in node.kwargs.items()}
            if node.target.startswith("sym::"):
                result = _sym_call(node.target, args)
            elif node.target == quant.TARGET:
                result = quant.run(be.name, args)
            else:
                result = be.call(node.target, args, kwargs)
            results = list(result) if isinstance(result, (tuple, list)) else [result]
            if len(results) != len(node.outputs):
                raise RefEngineExecutionError(
                    f"{node.target} returned {len(results)} values for outputs {node.outputs}"
                )
            env.update(zip(node.outputs, results, strict=True))
        out = {}
        for spec in self.outputs:
            value = env[spec.name]
            got_dtype, got_shape = be.dtype(value), tuple(d if isinstance(d, int) else -1 for d in value.shape)
            if got_dtype != spec.dtype:
                raise RefEngineExecutionError(
                    f"output {spec.name!r} computed as {got_dtype}, declared {spec.dtype}"
                )
            if len(got_shape) != len(spec.shape) or any(
                d != -1 and g != -1 and d != g for d, g in zip(spec.shape, got_shape, strict=True)
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
        return fn(*(a if type(a).__name__ == "SymInt" else int(a) for a in args))  # symbolic: shape inference
    except (TypeError, ValueError, ZeroDivisionError) as exc:
        raise RefEngineExecutionError(f"{target}{tuple(args)} failed: {exc}") from exc


def _resolve(arg: Any, env: dict[str, Any], be: Backend) -> Any:
    if isinstance(arg, Ref):
        return env[arg.name]
    if isinstance(arg, DType):
        return be.dtype_object(arg.name)
    if isinstance(arg, MemoryFormat):
        return be.memory_format(arg.name)
    if isinstance(arg, list):
        return [_resolve(a, env, be) for a in arg]
    return arg
