"""The ``pyrt::execute_engine`` operator that engine nodes call before lowering.

Schema: ``execute_engine(Tensor[] inputs, Tensor engine, str spec) -> Tensor[]``.
``engine`` is the serialized engine as a 1-D uint8 tensor (an attribute reached
by ``get_attr``), ``spec`` a small JSON :class:`~pyrt.export._graph.spec.EngineSpec`.
The fake kernel gives torch.export the output shapes; the eager kernel runs
reference engines on the CPU (so an intermediate graph can be checked against
eager PyTorch) and refuses real TensorRT engines.

>>> import torch
>>> op = execute_engine_op()
>>> op.name()
'pyrt::execute_engine'
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from pyrt.errors import ExportError
from pyrt.export._graph.spec import EngineSpec, evaluate
from pyrt.sim.refengine import RefEngine

NAMESPACE = "pyrt"
OP_NAME = "execute_engine"
QUALIFIED = f"{NAMESPACE}::{OP_NAME}"

_lib = torch.library.Library(NAMESPACE, "FRAGMENT")
_lib.define(f"{OP_NAME}(Tensor[] inputs, Tensor engine, str spec) -> Tensor[]")


@functools.lru_cache(maxsize=256)
def parse_spec(text: str) -> EngineSpec:
    return EngineSpec.from_json(text)


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


@torch.library.register_fake(QUALIFIED, lib=_lib)
def _fake(inputs: list[torch.Tensor], engine: torch.Tensor, spec: str) -> list[torch.Tensor]:
    s = parse_spec(spec)
    env: dict[str, Any] = {name: (inputs[i].shape[d] - off) // coeff for name, (i, d, coeff, off) in s.symbols.items()}
    if s.data_dependent:  # sizes only the engine's run knows: fresh unbacked sizes with the recorded bounds
        ctx = torch.library.get_ctx()
        env.update({name: ctx.new_dynamic_size(min=0, max=bound) for name, bound in s.data_dependent.items()})
    device = inputs[0].device if inputs else engine.device
    return [
        torch.empty([evaluate(d, env) for d in dims], dtype=_dtype(b.dtype), device=device)
        for b, dims in zip(s.outputs, s.output_dims, strict=True)
    ]


def _eager(inputs: list[torch.Tensor], engine: torch.Tensor, spec: str) -> list[torch.Tensor]:
    s = parse_spec(spec)
    raw = engine.detach().cpu().numpy()
    if bytes(raw[:8]) != b"PYRTREF1":
        raise ExportError(
            f"engine {s.key!r} is a real TensorRT engine; run the exported .pte with pyrt.Program instead"
        )

    ref = RefEngine.from_bytes(raw, source=f"engine {s.key!r}")
    feed = {b.name: x for b, x in zip(s.inputs, inputs, strict=True)}
    out = ref.run(feed, backend="torch")
    return [out[b.name].clone() for b in s.outputs]


_lib.impl(OP_NAME, _eager, "CompositeExplicitAutograd")


def execute_engine_op() -> Any:
    """The registered OpOverload ``torch.ops.pyrt.execute_engine.default``."""
    return torch.ops.pyrt.execute_engine.default


def is_engine_call(target: Any) -> bool:
    """True for ``pyrt::execute_engine`` in ATen or edge dialect form."""
    if target is execute_engine_op():
        return True
    schema = getattr(target, "_schema", None)
    return schema is not None and schema.name == QUALIFIED
