"""Shared helpers for the export tests, plus checks of the helpers themselves.

* :class:`StandInEngine`: an engine object with Torch-TensorRT's serialized
  state (13 strings, ABI "10", engine base64), holding a *reference* engine so
  converted programs run on the CPU.
* :func:`torchtrt_program`: a hand-built ExportedProgram shaped like a saved
  Torch-TensorRT program (``tensorrt::execute_engine`` nodes, engine objects
  lifted as ``obj_``-prefixed custom-object placeholders).
* :func:`delegates`: what ExecuTorch's own deserializer sees in a .pte.
"""

from __future__ import annotations

import base64
import hashlib
import operator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode

from pyrt.sim.refengine import Ref, RefEngine, RefNode, RefTensor

torch_tensorrt_missing = not hasattr(torch.ops, "tensorrt") or not hasattr(torch.ops.tensorrt, "execute_engine")
if torch_tensorrt_missing:  # a stand-in schema with Torch-TensorRT's name (the real one takes a TorchBind Engine)
    _LIB = torch.library.Library("tensorrt", "FRAGMENT")
    _LIB.define("execute_engine(Tensor[] input_tensors, Any engine) -> Tensor[]")
EXECUTE_ENGINE = torch.ops.tensorrt.execute_engine.default


class StandInEngine:
    """Torch-TensorRT's ``tensorrt.Engine`` serialized-state layout, nothing else."""

    def __init__(self, state: list[str]) -> None:
        self._state = list(state)

    def __getstate__(self) -> list[str]:
        return list(self._state)

    def __setstate__(self, state: list[str]) -> None:
        self._state = list(state)


def standin(engine: bytes, *, device: int = 0, inputs: tuple[str, ...] = ("x",),
            outputs: tuple[str, ...] = ("y",), name: str = "eng", aliased: str = "") -> StandInEngine:
    state = ["10", name, f"{device}%8%9%0%Fake GPU", base64.b64encode(engine).decode("ascii"),
             "%".join(inputs), "%".join(outputs), "0", "bWV0YQ==", "linux_x86_64", "0", "1", "0", aliased]
    return StandInEngine(state)


def affine_engine(scale: float, shift: float, shape: tuple[int, ...] = (2, 3), *, inp: str = "x",
                  out: str = "y") -> bytes:
    """A reference engine computing ``out = inp * scale + shift`` (float32)."""
    w = np.full(shape, scale, dtype=np.float32)
    b = np.full(shape, shift, dtype=np.float32)
    eng = RefEngine(
        inputs=[RefTensor(inp, "float32", shape)],
        outputs=[RefTensor(out, "float32", shape)],
        weights={"w": w, "b": b},
        nodes=[RefNode("aten::mul.Tensor", [Ref(inp), Ref("w")], {}, ["t"]),
               RefNode("aten::add.Tensor", [Ref("t"), Ref("b")], {}, [out])],
    )
    return eng.to_bytes()


def torchtrt_program(engines: list[tuple[Any, str, str]], shape: tuple[int, ...] = (2, 3),
                     mapping: bool = True) -> torch.export.ExportedProgram:
    """``x -> engine0 -> relu -> engine1 -> ...``; ``engines`` = (object, placeholder name, FQN).

    With ``mapping=False`` the custom-object inputs are not declared in the
    signature (a legacy program): only node names can find the objects.
    """
    from torch.export import ExportedProgram
    from torch.export.graph_signature import (
        CustomObjArgument,
        ExportGraphSignature,
        InputKind,
        InputSpec,
        OutputKind,
        OutputSpec,
        TensorArgument,
    )

    fake = FakeTensorMode()
    graph = fx.Graph()
    objs = []
    for _, ph_name, _ in engines:
        ph = graph.placeholder(ph_name)
        ph.meta["val"] = CustomObjArgument(ph.name, "__torch__.torch.classes.tensorrt.Engine")
        objs.append(ph)
    x = graph.placeholder("x")
    with fake:
        x.meta["val"] = torch.empty(shape)
    value = x
    for i, ph in enumerate(objs):
        if i:
            value = graph.call_function(torch.ops.aten.relu.default, (value,))
            with fake:
                value.meta["val"] = torch.empty(shape)
        call = graph.call_function(EXECUTE_ENGINE, ([value], ph))
        with fake:
            call.meta["val"] = [torch.empty(shape)]
        value = graph.call_function(operator.getitem, (call, 0))
        value.meta["val"] = call.meta["val"][0]
    graph.output((value,))
    gm = fx.GraphModule(torch.nn.Module(), graph)
    specs = [InputSpec(InputKind.CUSTOM_OBJ, CustomObjArgument(ph.name, "__torch__.torch.classes.tensorrt.Engine"),
                       fqn) for ph, (_, _, fqn) in zip(objs, engines, strict=True)] if mapping else []
    specs.append(InputSpec(InputKind.USER_INPUT, TensorArgument(x.name), None))
    if not mapping:
        specs = [InputSpec(InputKind.USER_INPUT, TensorArgument(ph.name), None) for ph in objs] + specs
    signature = ExportGraphSignature(specs, [OutputSpec(OutputKind.USER_OUTPUT, TensorArgument(value.name), None)])
    constants = {fqn: obj for obj, _, fqn in engines}
    return ExportedProgram(root=gm, graph=gm.graph, graph_signature=signature, state_dict={},
                           range_constraints={}, module_call_graph=[], constants=constants,
                           verifiers=None if mapping else [])


def delegates(path: str | Path) -> list[dict[str, Any]]:
    """Every delegate as ExecuTorch's own deserializer reads it: id, compile specs, blob."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    pte = deserialize_pte_binary(Path(path).read_bytes())
    program = pte.program
    out = []
    for plan in program.execution_plan:
        for d in plan.delegates:
            blob = bytes(program.backend_delegate_data[d.processed.index].data)
            out.append({"id": d.id, "compile_specs": {c.key: bytes(c.value) for c in d.compile_specs},
                        "blob": blob, "sha256": hashlib.sha256(blob).hexdigest()})
    return out


def run_pte(path: str | Path, *inputs: torch.Tensor, gpus: int = 2) -> list[torch.Tensor]:
    """Run a .pte with pyrt.Program on simulated GPUs (skips the test while pyrt.Program is missing)."""
    program_cls = pytest.importorskip("pyrt.runtime.program").Program
    from pyrt.sim import simulated_gpus

    with simulated_gpus(gpus), program_cls(path) as prog:
        out = prog.run(*inputs)
    return list(out) if isinstance(out, (list, tuple)) else [out]


# -- checks of the helpers ---------------------------------------------------------------------


def test_standin_state_has_torchtrt_layout() -> None:
    from pyrt.export.torchtrt import decode_state

    state = standin(b"\x00ENGINE\xff", device=3, inputs=("a", "b"), outputs=("c",)).__getstate__()
    assert len(state) == 13 and all(isinstance(s, str) for s in state)
    decoded = decode_state(state, "stand-in")
    assert (decoded.device_index, decoded.engine, decoded.input_names, decoded.output_names) == (
        3, b"\x00ENGINE\xff", ["a", "b"], ["c"])


def test_affine_engine_computes() -> None:
    eng = RefEngine.from_bytes(affine_engine(2.0, 1.0))
    out = eng.run({"x": np.ones((2, 3), np.float32)}, backend="numpy")["y"]
    np.testing.assert_array_equal(out, np.full((2, 3), 3.0, np.float32))


@pytest.mark.parametrize("mapping", [True, False])
def test_torchtrt_program_builds(mapping: bool) -> None:
    ep = torchtrt_program([(standin(affine_engine(1, 0)), "obj_a", "a")], mapping=mapping)
    assert [n.op for n in ep.graph.nodes].count("placeholder") == 2


class RuntimeModule(torch.nn.Module):
    """Like Torch-TensorRT's runtime module: an nn.Module whose ``engine`` attribute is the engine."""

    def __init__(self, engine: Any) -> None:
        super().__init__()
        self.engine = engine

    def forward(self, *args: Any) -> Any:
        raise RuntimeError("a stand-in runtime module only carries its engine")


def two_output_engine(shape: tuple[int, ...] = (2, 3)) -> bytes:
    """A reference engine: ``y = x * 2 + 1`` and ``z = x * 10``."""
    eng = RefEngine(
        inputs=[RefTensor("x", "float32", shape)],
        outputs=[RefTensor("y", "float32", shape), RefTensor("z", "float32", shape)],
        weights={"two": np.full(shape, 2.0, np.float32), "one": np.ones(shape, np.float32),
                 "ten": np.full(shape, 10.0, np.float32)},
        nodes=[RefNode("aten::mul.Tensor", [Ref("x"), Ref("two")], {}, ["t"]),
               RefNode("aten::add.Tensor", [Ref("t"), Ref("one")], {}, ["y"]),
               RefNode("aten::mul.Tensor", [Ref("x"), Ref("ten")], {}, ["z"])],
    )
    return eng.to_bytes()


def torchtrt_split_module(shape: tuple[int, ...] = (2, 3)) -> fx.GraphModule:
    """A Torch-TensorRT-style split module: ``_run_on_acc_0`` (engine, outputs y and z) feeds the
    fallback submodule ``_run_on_gpu_1`` with ``(getitem_1, getitem)``, i.e. (z, y), whose own
    placeholders are named ``getitem`` and ``getitem_1``: wiring by name swaps them.
    Correct result: ``z - 0.5 * y`` = ``10x - 0.5 (2x + 1)``.
    """
    fake = FakeTensorMode()
    with fake:
        t = torch.empty(shape)
    sub = fx.Graph()
    a, b = sub.placeholder("getitem"), sub.placeholder("getitem_1")
    half = sub.call_function(torch.ops.aten.mul.Tensor, (b, 0.5))
    diff = sub.call_function(torch.ops.aten.sub.Tensor, (a, half))
    for n in (a, b, half, diff):
        n.meta["val"] = t
    sub.output(diff)
    main = fx.Graph()
    x = main.placeholder("x")
    acc = main.call_module("_run_on_acc_0", (x,))
    y = main.call_function(operator.getitem, (acc, 0))
    z = main.call_function(operator.getitem, (acc, 1))
    gpu = main.call_module("_run_on_gpu_1", (z, y))
    main.output(gpu)
    for n in (x, y, z, gpu):
        n.meta["val"] = t
    acc.meta["val"] = (t, t)
    root = torch.nn.Module()
    root._run_on_acc_0 = RuntimeModule(standin(two_output_engine(shape), outputs=("y", "z")))
    root._run_on_gpu_1 = fx.GraphModule(torch.nn.Module(), sub)
    gm = fx.GraphModule(root, main)
    assert [y.name, z.name] == ["getitem", "getitem_1"]  # the names the submodule also uses
    return gm
