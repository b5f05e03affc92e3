"""The description an engine node carries: I/O, device, budget and output shapes.

It travels as a small JSON string argument of ``pyrt::execute_engine`` (the
engine itself is a separate uint8 tensor reached by ``get_attr``, never a
literal). Output dimensions that depend on dynamic input dimensions are kept
as tiny expression trees over *symbols*, each symbol read back from one input
dimension (``dim = coeff * symbol + offset``), so the op's fake kernel gives
torch.export the exact symbolic shapes on every retrace.

>>> spec = EngineSpec(key="engine_0", device="cuda:1",
...                   inputs=(IOBinding("input_0", "float32", (-1, 4), True),),
...                   outputs=(IOBinding("output_0", "float32", (-1, 8), False),),
...                   output_dims=((["*", 2, ["sym", "s0"]], 8),), symbols={"s0": (0, 0, 1, 0)})
>>> EngineSpec.from_json(spec.to_json()) == spec
True
>>> evaluate(["+", ["*", 2, ["sym", "s0"]], 1], {"s0": 5})
11
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pyrt.errors import ExportError
from pyrt.format.trt_blob import AliasedIO, IOBinding

# A dimension: an int, or a nested list expression ["sym", name] | [op, dim, ...] (op one of _OPS).
Dim = int | list[Any]
_OPS = ("+", "*", "//", "%", "max", "min", "pow")


@dataclass(frozen=True)
class EngineSpec:
    """Everything preprocess needs besides the engine bytes (those ride in a tensor)."""

    key: str
    device: str
    inputs: tuple[IOBinding, ...]
    outputs: tuple[IOBinding, ...]
    output_dims: tuple[tuple[Dim, ...], ...]
    symbols: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)
    budget: int | None = None
    flavour: str = "reference"
    streamable: bool = False
    aliased_io: tuple[AliasedIO, ...] = ()
    hardware_compatible: bool = False
    serialized_metadata: str = ""
    target_platform: str | None = None
    data_dependent: dict[str, int] = field(default_factory=dict)  # unbacked symbol -> upper bound
    quantization: str = ""  # the engine's weight quantization (pyrt.format.weight_quant.SpecInfo JSON), or ""
    layers: str = ""  # max_engine_size: the decoder layers of the engine's group ("0-3", "4-7+head"), or ""
    weight_bytes: int = 0  # with ``layers``: the bytes of the group's weights (before quantization)

    def to_json(self) -> str:
        doc: dict[str, Any] = {
            "key": self.key, "device": self.device, "budget": self.budget, "flavour": self.flavour,
            "streamable": self.streamable,
            "inputs": [b.to_json() for b in self.inputs], "outputs": [b.to_json() for b in self.outputs],
            "output_dims": [list(d) for d in self.output_dims],
            "symbols": {k: list(v) for k, v in self.symbols.items()},
            "aliased_io": [a.to_json() for a in self.aliased_io],
            "hardware_compatible": self.hardware_compatible,
            "serialized_metadata": self.serialized_metadata, "target_platform": self.target_platform,
        }
        if self.data_dependent:
            doc["data_dependent"] = dict(self.data_dependent)
        if self.quantization:
            doc["quantization"] = self.quantization
        if self.layers:
            doc["layers"], doc["weight_bytes"] = self.layers, self.weight_bytes
        return json.dumps(doc, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> EngineSpec:
        try:
            doc = json.loads(text)
            return cls(
                key=doc["key"], device=doc["device"], budget=doc["budget"], flavour=doc["flavour"],
                streamable=doc["streamable"],
                inputs=tuple(IOBinding(b["name"], b["dtype"], tuple(b["shape"]), True) for b in doc["inputs"]),
                outputs=tuple(IOBinding(b["name"], b["dtype"], tuple(b["shape"]), False) for b in doc["outputs"]),
                output_dims=tuple(tuple(d) for d in doc["output_dims"]),
                symbols={k: tuple(v) for k, v in doc["symbols"].items()},
                aliased_io=tuple(AliasedIO(**a) for a in doc["aliased_io"]),
                hardware_compatible=doc["hardware_compatible"],
                serialized_metadata=doc["serialized_metadata"], target_platform=doc["target_platform"],
                data_dependent={str(k): int(v) for k, v in doc.get("data_dependent", {}).items()},
                quantization=str(doc.get("quantization", "")),
                layers=str(doc.get("layers", "")), weight_bytes=int(doc.get("weight_bytes", 0)),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ExportError(f"pyrt::execute_engine spec is malformed ({exc}): {text[:200]!r}") from None

    def blob_metadata(self) -> dict[str, Any]:
        """Keyword arguments for ``pyrt.format.trt_blob.encode_metadata`` (minus io_bindings)."""
        return {
            "aliased_io": self.aliased_io, "hardware_compatible": self.hardware_compatible,
            "device_id": int(self.device.partition(":")[2]),
            "serialized_metadata": self.serialized_metadata, "target_platform": self.target_platform,
        }


def evaluate(expr: Dim, env: dict[str, Any]) -> Any:
    """Evaluate a dimension expression; works on ints and on torch SymInts alike."""
    if isinstance(expr, int):
        return expr
    op, *args = expr
    if op == "sym":
        return env[args[0]]
    vals = [evaluate(a, env) for a in args]
    if op == "+":
        return _fold(vals, lambda a, b: a + b)
    if op == "*":
        return _fold(vals, lambda a, b: a * b)
    if op == "//":
        return vals[0] // vals[1]
    if op == "%":
        return vals[0] % vals[1]
    if op == "pow":
        return vals[0] ** vals[1]
    import torch

    return _fold(vals, torch.sym_max if op == "max" else torch.sym_min)


def _fold(vals: list[Any], fn: Any) -> Any:
    out = vals[0]
    for v in vals[1:]:
        out = fn(out, v)
    return out


@dataclass
class Symbols:
    """How each symbol of the inputs' shapes is read back from an input dim.

    ``table``: name -> (input, dim, coeff, offset), meaning ``dim = coeff * name + offset``
    (``v<i>_<d>`` names stand for a whole input dim such as ``s0 + s1``); ``subs``:
    sympy substitutions that rewrite other symbols in terms of those.
    """

    table: dict[str, tuple[int, int, int, int]]
    subs: dict[Any, Any]


def symbols_from_inputs(input_shapes: list[tuple[Any, ...]]) -> Symbols:
    """Map each free symbol to one input dim it can be read back from."""
    found: dict[str, tuple[int, int, int, int]] = {}
    for pure in (True, False):  # prefer dims that are the bare symbol
        for i, shape in enumerate(input_shapes):
            for d, size in enumerate(shape):
                linear = linear_size(size)
                if linear and linear[0] not in found and (not pure or linear[1:] == (1, 0)):
                    found[linear[0]] = (i, d, linear[1], linear[2])
    subs: dict[Any, Any] = {}
    for i, shape in enumerate(input_shapes):
        for d, size in enumerate(shape):
            expr = getattr(getattr(size, "node", None), "expr", None)
            if expr is not None and linear_size(size) is None:
                _eliminate(expr, f"v{i}_{d}", (i, d), found, subs)
    return Symbols(found, subs)


def _eliminate(expr: Any, var: str, where: tuple[int, int], found: dict[str, Any], subs: dict[Any, Any]) -> None:
    """Record ``var := expr`` and solve it for one still-unknown symbol of ``expr``."""
    import sympy

    unknown = sorted((s for s in expr.free_symbols if str(s) not in found and s not in subs), key=str)
    if not unknown:
        return
    v = sympy.Symbol(var, integer=True)
    solutions = sympy.solve(sympy.Eq(expr.xreplace(subs), v), unknown[0])
    if len(solutions) == 1:
        found[var] = (where[0], where[1], 1, 0)
        subs[unknown[0]] = solutions[0]


def dim_expr(size: Any, symbols: Symbols, where: str, unbacked: dict[str, int] | None = None) -> Dim:
    """An int, or the expression tree of a SymInt over ``symbols``.

    With ``unbacked`` (a dict to fill), a symbol no input determines but whose range has
    a finite upper bound (a data-dependent size such as ``nonzero``'s) is kept as
    ``["sym", name]`` and its bound recorded there; without it, such a size is an ExportError.
    """
    if isinstance(size, int):
        return size
    node = getattr(size, "node", None)
    if node is None:
        raise ExportError(f"{where}: dimension {size!r} is neither an int nor a SymInt")
    expr = node.expr
    if symbols.subs:
        import sympy

        expr = sympy.expand(expr.xreplace(symbols.subs))
    table: dict[str, Any] = symbols.table
    if unbacked is not None:
        bounds = {str(s): symbol_bound(node, s) for s in expr.free_symbols if str(s) not in table}
        found = {k: v for k, v in bounds.items() if v is not None}
        table = {**table, **found}
        tree = _to_tree(expr, table, where)
        unbacked.update(found)
        return tree
    return _to_tree(expr, table, where)


def symbol_bound(node: Any, symbol: Any) -> int | None:
    """The finite upper bound of ``symbol`` in the shape environment of SymNode ``node``, else None."""
    from torch.utils._sympy.value_ranges import bound_sympy

    upper = bound_sympy(symbol, node.shape_env.var_to_range).upper
    return int(upper) if getattr(upper, "is_Integer", False) else None


def linear_size(size: Any) -> tuple[str, int, int] | None:
    """(symbol, coeff, offset) when ``size`` is a SymInt ``coeff * s + offset``."""
    node = getattr(size, "node", None)
    expr = getattr(node, "expr", None)
    if expr is None or len(expr.free_symbols) != 1:
        return None
    (sym,) = expr.free_symbols
    poly = expr.as_poly(sym)
    if poly is None or poly.degree() != 1:
        return None
    coeff, offset = (poly.coeff_monomial(sym), poly.coeff_monomial(1))
    if not (coeff.is_Integer and offset.is_Integer) or int(coeff) == 0:
        return None
    return str(sym), int(coeff), int(offset)


def _to_tree(expr: Any, symbols: dict[str, Any], where: str) -> Dim:
    import sympy

    name = type(expr).__name__
    if expr.is_Integer:
        return int(expr)
    if expr.is_Rational:
        raise ExportError(f"{where}: cannot express the symbolic size {expr} (a fraction)")
    if expr.is_Symbol:
        if str(expr) not in symbols:
            raise ExportError(
                f"{where}: output size depends on {expr}, which no engine input dimension determines "
                "(a data-dependent shape); such ops must run outside TensorRT"
            )
        return ["sym", str(expr)]
    args = [_to_tree(a, symbols, where) for a in expr.args]
    if isinstance(expr, sympy.Add):
        return ["+", *args]
    if isinstance(expr, sympy.Mul):
        return ["*", *args]
    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and int(expr.exp) >= 0:
        return ["pow", *args]
    table = {"FloorDiv": "//", "Mod": "%", "PythonMod": "%", "Max": "max", "Min": "min"}
    if name in table:
        return [table[name], *args]
    raise ExportError(f"{where}: cannot express the symbolic size {expr} ({name}) for the engine's shape function")
