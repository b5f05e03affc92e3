"""Fuzzing ``Program()`` + ``run()``: mutated programs may raise only PyrtError subclasses, and never hang.

The corpus is real programs written by ExecuTorch 1.5.1 (the portable fixture
with constants, mutable buffers and a dynamic method; a ``torch.cond``
program; a ``map`` loop with backward jumps; a ``pyrt.export`` program with two
reference engines on two simulated GPUs, ``et_copy`` ops and a dynamic batch).
Each example deep-copies one, applies a few structural mutations to
ExecuTorch's ``Program`` dataclass (values, tensor fields, list items, chain
instructions, operators, container specs, arena sizes, I/O indices, device
tags, delegate references and compile specs), re-serializes it with
ExecuTorch's serializer and sometimes flips bytes of the result. pyrt then
loads it (torch or numpy kernels, under ``pyrt.sim.simulated_gpus``) and
runs every method twice with inputs shaped from the file's declarations.

Guards keep a bad example from harming the machine, and report it as a finding:
``$PYRT_MAX_HOST_BYTES`` is 256 MiB, ``RLIMIT_DATA`` allows 2 GiB more than
the process holds, and a watchdog interrupts a run that takes longer than
:data:`HANG_SECONDS`. An interrupted run of a program that jumps backwards is
counted as a loop (its own control flow may never end, as in ExecuTorch's
runtime: pyrt refuses at load only loops whose condition nothing changes);
any other hang fails the example with its reproducer.

Examples per corpus program: ``$PYRT_FUZZ_EXAMPLES`` (default 60; ``-m slow``
runs 20x). ``$PYRT_FUZZ_STATS=path`` appends counts of outcomes as JSON lines.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import resource
import signal
import threading
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("executorch")

from pyrt.errors import PyrtError  # noqa: E402
from pyrt.kernels.allowlist import allowed_operators  # noqa: E402
from pyrt.runtime.program import Program  # noqa: E402
from pyrt.sim import simulated_gpus  # noqa: E402

EXAMPLES = int(os.environ.get("PYRT_FUZZ_EXAMPLES", "60"))
HANG_SECONDS = 10
MAX_HOST_BYTES = 256 << 20
DATA_HEADROOM = 2 << 30
INTERESTING_INTS = (0, 1, 2, 3, 7, -1, -2, 255, 256, 1 << 16, (1 << 31) - 1, -(1 << 31), 1 << 32, (1 << 62), -(1 << 63))
I32 = st.one_of(st.sampled_from([i for i in INTERESTING_INTS if -(1 << 31) <= i < 1 << 31]),
                st.integers(-4, 64), st.integers(-(1 << 31), (1 << 31) - 1))
U32 = st.one_of(st.sampled_from([0, 1, 2, 4, 8, 16, 24, 64, 1 << 20, (1 << 32) - 1]), st.integers(0, (1 << 32) - 1))
I64 = st.one_of(st.sampled_from(INTERESTING_INTS), st.integers(-(1 << 63), (1 << 63) - 1))
STATS: Counter[str] = Counter()


class Hang(BaseException):
    """Raised by the watchdog inside a run that takes too long (a BaseException: no handler converts it)."""


# -- corpus ------------------------------------------------------------------------------------------------


class Loop(torch.nn.Module):
    def forward(self, xs: Any, y: Any) -> Any:
        from torch._higher_order_ops.map import map as tmap

        return tmap(lambda x, y: torch.relu(x * y) + 1, xs, y)


class Cond(torch.nn.Module):
    def forward(self, x: Any) -> Any:
        return torch.cond(x.sum() > 0, lambda x: x * 2, lambda x: x - 1, (x,))


class Delegated(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(4, 8)
        self.l2 = torch.nn.Linear(8, 3)

    def forward(self, x: Any) -> Any:
        return self.l2(torch.sin(torch.relu(self.l1(x)))) * 2


def _edge_program(model: torch.nn.Module, args: tuple[Any, ...]) -> bytes:
    from executorch.exir import to_edge

    return bytes(to_edge(torch.export.export(model, args)).to_executorch().buffer)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory, pte_file: Callable[[str], Any]) -> dict[str, Any]:
    """name -> ExecuTorch PTEFile (segments restored), the programs every example starts from."""
    from executorch.exir._serialize._program import deserialize_pte_binary
    from torch.export import Dim

    from pyrt.export import to_pte

    directory = tmp_path_factory.mktemp("fuzz-corpus")
    torch.manual_seed(0)
    files = {
        "portable": pte_file("portable").read_bytes(),  # the session's copy, shared with other tests
        "loop": _edge_program(Loop(), (torch.randn(3, 4), torch.randn(4))),
        "cond": _edge_program(Cond(), (torch.randn(2, 3),)),
    }
    delegated = directory / "delegated.pte"
    to_pte(Delegated().eval(), delegated, (torch.randn(3, 4),), builder="reference",
           torch_executed_ops=["aten.sin.default"], dynamic_shapes={"x": {0: Dim("b", min=1, max=6)}},
           device={0: "cuda:0", 1: "cuda:1"}, weight_streaming=True, progress=False)
    files["delegated"] = delegated.read_bytes()
    return {name: deserialize_pte_binary(data) for name, data in files.items()}


# -- mutations -----------------------------------------------------------------------------------------------


def _schema() -> Any:
    from executorch.exir import schema

    return schema


def _scalar_types() -> list[Any]:
    from executorch.exir.scalar_type import ScalarType

    return list(ScalarType)


def _text(draw: Callable[[Any], Any]) -> str:
    return draw(st.one_of(st.sampled_from(["", "a\0b", "cuda:0", "cuda:99", "-5", "1e400", "[1, {}]", "☃" * 3]),
                          st.text(max_size=12)))


def _random_evalue(draw: Callable[[Any], Any], n_values: int) -> Any:
    s = _schema()
    index = st.integers(-3, n_values + 2)
    kind = draw(st.sampled_from(["Null", "Int", "Bool", "Double", "String", "IntList", "DoubleList", "BoolList",
                                 "TensorList", "OptionalTensorList", "Tensor"]))
    if kind == "Null":
        val: Any = s.Null()
    elif kind == "Int":
        val = s.Int(draw(I64))
    elif kind == "Bool":
        val = s.Bool(draw(st.booleans()))
    elif kind == "Double":
        val = s.Double(draw(st.floats(allow_nan=True, allow_infinity=True)))
    elif kind == "String":
        val = s.String(_text(draw))
    elif kind == "DoubleList":
        val = s.DoubleList(draw(st.lists(st.floats(allow_nan=True), max_size=4)))
    elif kind == "BoolList":
        val = s.BoolList(draw(st.lists(st.booleans(), max_size=4)))
    elif kind == "Tensor":
        sizes = draw(st.lists(st.integers(0, 6) | I32, max_size=4))
        alloc = draw(st.none() | st.tuples(U32, U32, st.sampled_from([0, 0, 0, 1, (1 << 32) - 1])))
        val = s.Tensor(scalar_type=draw(st.sampled_from(_scalar_types())), storage_offset=0, sizes=sizes,
                       dim_order=list(range(len(sizes))), requires_grad=False, layout=0,
                       data_buffer_idx=draw(st.sampled_from([0, 0, 1, 2, 99])),
                       allocation_info=None if alloc is None else s.AllocationDetails(*alloc),
                       shape_dynamism=draw(st.sampled_from(list(s.TensorShapeDynamism))))
    else:
        items = draw(st.lists(index, max_size=5))
        val = getattr(s, kind)(items if kind != "IntList" else [i for i in items])
    return s.EValue(val)


def _mutate_tensor(draw: Callable[[Any], Any], t: Any, n_values: int) -> None:
    s = _schema()
    field = draw(st.sampled_from(["sizes", "dim", "dim_order", "scalar_type", "alloc", "alloc_none", "buffer_idx",
                                  "dynamism", "external", "device"]))
    if field == "sizes" and t.sizes:
        t.sizes[draw(st.integers(0, len(t.sizes) - 1))] = draw(I32)
    elif field == "dim":
        if t.sizes and draw(st.booleans()):
            t.sizes.pop()
        else:
            t.sizes.append(draw(st.integers(0, 5)))
        if draw(st.booleans()):
            t.dim_order = list(range(len(t.sizes)))
    elif field == "dim_order":
        t.dim_order = draw(st.lists(st.integers(0, 255), max_size=5)) if draw(st.booleans()) else \
            draw(st.permutations(list(range(len(t.sizes)))))
    elif field == "scalar_type":
        t.scalar_type = draw(st.sampled_from(_scalar_types()))
    elif field == "alloc":
        t.allocation_info = s.AllocationDetails(draw(st.integers(0, 4) | U32), draw(U32),
                                                draw(st.sampled_from([0, 0, 1, (1 << 32) - 1])))
    elif field == "alloc_none":
        t.allocation_info = None
    elif field == "buffer_idx":
        t.data_buffer_idx = draw(st.integers(0, 4) | U32)
    elif field == "dynamism":
        t.shape_dynamism = draw(st.sampled_from(list(s.TensorShapeDynamism)))
    elif field == "external":
        t.extra_tensor_info = s.ExtraTensorInfo(fully_qualified_name=_text(draw),
                                                location=draw(st.sampled_from(list(s.TensorDataLocation))),
                                                mutable_data_segments_idx=draw(st.integers(0, 3)))
    else:
        t.extra_tensor_info = s.ExtraTensorInfo(device_type=draw(st.sampled_from(list(s.DeviceType))),
                                                device_index=draw(st.integers(-2, 7)))


def _mutate_value(draw: Callable[[Any], Any], plan: Any) -> str:
    if not plan.values:
        plan.values.append(_random_evalue(draw, 1))
        return "value: appended"
    i = draw(st.integers(0, len(plan.values) - 1))
    val = plan.values[i].val
    kind = type(val).__name__
    how = draw(st.sampled_from(["replace", "field", "field", "field"]))
    if how == "replace":
        plan.values[i] = _random_evalue(draw, len(plan.values))
        return f"value {i}: {kind} replaced by {type(plan.values[i].val).__name__}"
    if kind == "Tensor":
        _mutate_tensor(draw, val, len(plan.values))
    elif kind in ("IntList", "TensorList", "OptionalTensorList"):
        if val.items and draw(st.booleans()):
            val.items[draw(st.integers(0, len(val.items) - 1))] = draw(st.integers(-3, len(plan.values) + 2) | I32)
        else:
            val.items.append(draw(st.integers(-3, len(plan.values) + 2)))
    elif kind == "Int":
        val.int_val = draw(I64)
    elif kind == "Double":
        plan.values[i] = _schema().EValue(_schema().Double(draw(st.floats(allow_nan=True, allow_infinity=True))))
    elif kind == "Bool":
        val.bool_val = not val.bool_val
    elif kind == "String":
        val.string_val = _text(draw)
    return f"value {i} ({kind}): field"


def _random_instruction(draw: Callable[[Any], Any], plan: Any, n_instr: int) -> Any:
    s = _schema()
    n = len(plan.values)
    idx = st.integers(-2, n + 1)
    kind = draw(st.sampled_from(["KernelCall", "DelegateCall", "MoveCall", "JumpFalseCall", "FreeCall"]))
    if kind == "KernelCall":
        return s.KernelCall(op_index=draw(st.integers(-1, len(plan.operators) + 1)),
                            args=draw(st.lists(idx, max_size=8)))
    if kind == "DelegateCall":
        return s.DelegateCall(delegate_index=draw(st.integers(-1, len(plan.delegates) + 1)),
                              args=draw(st.lists(idx, max_size=6)))
    if kind == "MoveCall":
        return s.MoveCall(move_from=draw(idx), move_to=draw(idx))
    if kind == "JumpFalseCall":
        return s.JumpFalseCall(cond_value_index=draw(idx), destination_instruction=draw(st.integers(-1, n_instr + 1)))
    return s.FreeCall(value_index=draw(idx))


def _mutate_chain(draw: Callable[[Any], Any], plan: Any) -> str:
    s = _schema()
    if not plan.chains:
        return "chain: none"
    chain = plan.chains[draw(st.integers(0, len(plan.chains) - 1))]
    ins = chain.instructions
    how = draw(st.sampled_from(["args", "args", "index", "insert", "delete", "duplicate"]))
    if how == "insert" or not ins:
        at = draw(st.integers(0, len(ins)))
        ins.insert(at, s.Instruction(_random_instruction(draw, plan, len(ins))))
        return f"chain: inserted {type(ins[at].instr_args).__name__} at {at}"
    pc = draw(st.integers(0, len(ins) - 1))
    body = ins[pc].instr_args
    if how == "delete":
        del ins[pc]
        return f"chain: deleted {pc}"
    if how == "duplicate":
        ins.insert(draw(st.integers(0, len(ins))), copy.deepcopy(ins[pc]))
        return f"chain: duplicated {pc}"
    n = len(plan.values)
    if how == "args" and hasattr(body, "args"):
        if body.args and draw(st.booleans()):
            body.args[draw(st.integers(0, len(body.args) - 1))] = draw(st.integers(-2, n + 1) | I32)
        elif body.args and draw(st.booleans()):
            body.args.pop()
        else:
            body.args.append(draw(st.integers(0, max(n - 1, 0))))
        return f"chain: args of {pc}"
    field = draw(st.sampled_from([f for f in body.__dataclass_fields__ if f != "args"] or ["args"]))
    if field == "args":
        body.args = []
    else:
        setattr(body, field, draw(st.integers(-2, n + 2) | I32))
    return f"chain: {type(body).__name__} {pc}.{field}"


def _mutate_operator(draw: Callable[[Any], Any], plan: Any) -> str:
    s = _schema()
    pool = sorted(allowed_operators())
    name = draw(st.one_of(st.sampled_from(pool), st.sampled_from(["aten::from_file", "aten::_print", "::", "x"])))
    qualified, _, overload = name.partition(".")
    op = s.Operator(name=qualified, overload=overload)
    if plan.operators and draw(st.booleans()):
        plan.operators[draw(st.integers(0, len(plan.operators) - 1))] = op
    else:
        plan.operators.append(op)
    return f"operator: {name}"


_LEAF = {"type": None, "context": None, "children_spec": []}


def _spec_tree(draw: Callable[[Any], Any], depth: int) -> Any:
    if depth <= 0 or draw(st.integers(0, 3)) == 0:
        return draw(st.sampled_from([_LEAF, {"type": None}, {"type": 5}, 7, None, {"children_spec": {}}]))
    kind = draw(st.sampled_from(["builtins.tuple", "builtins.list", "builtins.dict", "custom.Type", None]))
    kids = [_spec_tree(draw, depth - 1) for _ in range(draw(st.integers(0, 3)))]
    context = json.dumps([f"k{i}" for i in range(len(kids) + draw(st.integers(-1, 1)))]) if kind == "builtins.dict" \
        else draw(st.sampled_from(["null", None, "[]", 3]))
    return {"type": kind, "context": context, "children_spec": kids}


def _mutate_container(draw: Callable[[Any], Any], plan: Any) -> str:
    how = draw(st.sampled_from(["tree", "tree", "deep", "garbage"]))
    if how == "tree":
        text = json.dumps([1, _spec_tree(draw, draw(st.integers(0, 4)))])
    elif how == "deep":
        depth = draw(st.sampled_from([63, 64, 65, 200, 5000]))
        node = '{"type": "builtins.tuple", "context": "null", "children_spec": ['
        text = "[1, " + node * depth + json.dumps(_LEAF) + "]}" * depth + "]"
    else:
        text = _text(draw)
    meta = plan.container_meta_type
    if draw(st.booleans()):
        meta.encoded_inp_str = text
    else:
        meta.encoded_out_str = text
    return f"container: {how}"


def _mutate_memory(draw: Callable[[Any], Any], plan: Any) -> str:
    s = _schema()
    how = draw(st.sampled_from(["size", "size", "append", "truncate", "device"]))
    sizes = plan.non_const_buffer_sizes
    if how == "size" and len(sizes) > 1:
        sizes[draw(st.integers(0, len(sizes) - 1))] = draw(st.sampled_from([0, 1, 4, 1 << 20, 1 << 29, 1 << 40,
                                                                            1 << 50, (1 << 63) - 1, -1]))
    elif how == "append":
        sizes.append(draw(st.integers(0, 1 << 12)))
    elif how == "truncate" and sizes:
        sizes.pop()
    else:
        plan.non_const_buffer_device = (plan.non_const_buffer_device or []) + [s.NonConstBufferDevice(
            buffer_idx=draw(st.integers(-1, len(sizes) + 1)), device_type=draw(st.sampled_from(list(s.DeviceType))),
            device_index=draw(st.integers(-1, 4)))]
    return f"memory: {how}"


def _mutate_io(draw: Callable[[Any], Any], plan: Any) -> str:
    target = plan.inputs if draw(st.booleans()) else plan.outputs
    n = len(plan.values)
    if target and draw(st.booleans()):
        target[draw(st.integers(0, len(target) - 1))] = draw(st.integers(-1, n))
    elif target and draw(st.booleans()):
        target.pop()
    else:
        target.append(draw(st.integers(0, max(n - 1, 0))))
    return "io"


def _mutate_delegate(draw: Callable[[Any], Any], plan: Any, program: Any) -> str:
    s = _schema()
    if not plan.delegates:
        return "delegate: none"
    d = plan.delegates[draw(st.integers(0, len(plan.delegates) - 1))]
    how = draw(st.sampled_from(["index", "location", "spec", "id", "blob"]))
    if how == "index":
        d.processed.index = draw(st.integers(0, 4) | U32)
    elif how == "location":
        d.processed.location = draw(st.sampled_from(list(s.DataLocation)))
    elif how == "spec":
        key = draw(st.sampled_from(["target_device", "weight_streaming_budget", "other"]))
        d.compile_specs.append(s.CompileSpec(key, _text(draw).encode()))
    elif how == "id":
        d.id = draw(st.sampled_from(["XnnpackBackend", "", "TensorRTBackend"]))
    elif program.backend_delegate_data:
        entry = program.backend_delegate_data[draw(st.integers(0, len(program.backend_delegate_data) - 1))]
        blob = bytearray(entry.data)
        for _ in range(draw(st.integers(1, 4))):
            if blob:
                blob[draw(st.integers(0, len(blob) - 1))] = draw(st.integers(0, 255))
        entry.data = bytes(blob)
    return f"delegate: {how}"


def _mutate_argument(draw: Callable[[Any], Any], plan: Any) -> str:
    """Point one argument of a kernel or delegate call at a value of another kind, or past the values."""
    calls = [(ci, pc, ins.instr_args) for ci, chain in enumerate(plan.chains)
             for pc, ins in enumerate(chain.instructions) if hasattr(ins.instr_args, "args") and ins.instr_args.args]
    if not calls or not plan.values:
        return "argument: none"
    ci, pc, body = calls[draw(st.integers(0, len(calls) - 1))]
    j = draw(st.integers(0, len(body.args) - 1))
    kinds = [type(v.val).__name__ for v in plan.values]
    was = kinds[body.args[j]] if 0 <= body.args[j] < len(kinds) else "?"
    other = [i for i, k in enumerate(kinds) if k != was]
    how = draw(st.sampled_from(["other kind", "other kind", "past the end", "drop", "extra"]))
    if how == "other kind" and other:
        body.args[j] = draw(st.sampled_from(other))
    elif how == "past the end":
        body.args[j] = len(plan.values) + draw(st.integers(0, 3))
    elif how == "drop":
        del body.args[j]
    else:
        body.args.insert(j, draw(st.integers(0, len(plan.values) - 1)))
    return f"argument: chain {ci} instruction {pc} argument {j} ({was}): {how}"


# Byte counts around the limits a load checks: below and above what the address-space limit leaves the
# subprocess runs (:data:`AS_HEADROOM`), near 4 GiB, and up to and past pyrt's 2**48-byte limit per item.
DECLARED = (1 << 20, 1 << 28, 3 << 29, 1 << 31, (1 << 32) - 8, 1 << 32, 1 << 36, 1 << 44, (1 << 48) - 8, 1 << 48,
            (1 << 48) + 8)


def _mutate_declared_size(draw: Callable[[Any], Any], plan: Any) -> str:
    """Declare a large size: an arena's, or a tensor's (planned or unplanned) through its sizes."""
    nbytes = draw(st.sampled_from(DECLARED))
    tensors = [i for i, v in enumerate(plan.values) if type(v.val).__name__ == "Tensor"]
    if draw(st.booleans()) and len(plan.non_const_buffer_sizes) > 1:
        mem = draw(st.integers(1, len(plan.non_const_buffer_sizes) - 1))
        plan.non_const_buffer_sizes[mem] = nbytes
        return f"declared: arena {mem} = {nbytes} bytes"
    if not tensors:
        return "declared: none"
    i = draw(st.sampled_from(tensors))
    t = plan.values[i].val
    elements = max(nbytes // 4, 1)
    t.sizes = [elements] if draw(st.booleans()) else [1 << 10, max(elements >> 10, 1)]
    t.dim_order = list(range(len(t.sizes)))
    if draw(st.booleans()):
        t.allocation_info = None  # unplanned: pyrt allocates it unless it is an input
    return f"declared: tensor {i} sizes {t.sizes} ({'planned' if t.allocation_info else 'unplanned'})"


MUTATORS = {"value": _mutate_value, "chain": _mutate_chain, "operator": _mutate_operator,
            "container": _mutate_container, "memory": _mutate_memory, "io": _mutate_io,
            "argument": _mutate_argument, "declared": _mutate_declared_size}


def mutate(draw: Callable[[Any], Any], pte: Any) -> list[str]:
    program = pte.program
    notes = []
    for _ in range(draw(st.integers(1, 3))):
        plan = program.execution_plan[draw(st.integers(0, len(program.execution_plan) - 1))]
        what = draw(st.sampled_from([*MUTATORS, "delegate"]))
        if what == "delegate":
            notes.append(_mutate_delegate(draw, plan, program))
        else:
            notes.append(MUTATORS[what](draw, plan))
    return notes


def serialize(pte: Any) -> bytes | None:
    from executorch.exir._serialize._program import serialize_pte_binary

    try:
        cord = serialize_pte_binary(pte, extract_delegate_segments=True)
        buf = io.BytesIO()
        cord.write_to_file(buf)
    except Exception:  # ExecuTorch's serializer refuses values its schema cannot hold
        return None
    return buf.getvalue()


# -- running -----------------------------------------------------------------------------------------------


def _inputs(plan: Any, rng: np.random.Generator) -> list[Any]:
    from pyrt.memory.layout import numpy_dtype

    out: list[Any] = []
    for i in plan.inputs:
        if not 0 <= i < len(plan.values):
            out.append(None)
            continue
        val = plan.values[i].val
        kind = type(val).__name__
        if kind == "Tensor":
            sizes = [max(int(d), 0) for d in val.sizes]
            if int(np.prod(sizes, dtype=object)) > 1 << 16:
                out.append(np.zeros((1,), np.float32))  # too big to make: a wrong-shape input instead
                continue
            try:
                dtype = numpy_dtype(_pyrt_scalar_type(val.scalar_type))
            except Exception:
                dtype = np.dtype(np.float32)
            arr = rng.integers(0, 3, size=sizes) if dtype.kind in "iub" else rng.standard_normal(sizes)
            out.append(np.asarray(arr).astype(dtype))
        elif kind in ("Int", "Bool", "String"):
            out.append(next(iter(vars(val).values())))
        elif kind == "Double":
            out.append(float(val.double_val))
        else:
            out.append(None)
    return out


def _pyrt_scalar_type(st_: Any) -> Any:
    from pyrt.format.dtypes import ScalarType

    return ScalarType(int(st_))


@contextlib.contextmanager
def guarded() -> Iterator[None]:
    """RLIMIT_DATA headroom and a watchdog for one example (restored afterwards)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    limit = _vm_data() + DATA_HEADROOM
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    main = threading.current_thread() is threading.main_thread()

    def fire(signum: int, frame: Any) -> None:
        raise Hang(f"a run took over {HANG_SECONDS} s")

    previous = signal.signal(signal.SIGALRM, fire) if main else None
    if main:
        signal.setitimer(signal.ITIMER_REAL, HANG_SECONDS)
    try:
        yield
    finally:
        if main:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def _vm_data() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    return 0


def exercise(data: bytes, kernels: str, pte: Any, rng: np.random.Generator) -> str:
    """Load and run every method twice; return the outcome ("ran", "loaded", or the PyrtError class name)."""
    outcome = "ran"
    try:
        with Program(data, kernels=kernels) as prog:
            outcome = "loaded"
            for plan in pte.program.execution_plan:
                if plan.name not in prog.method_names:
                    continue
                for _ in range(2):
                    prog.run(*_inputs(plan, rng), method=plan.name)
            outcome = "ran"
    except PyrtError as exc:
        return f"{outcome}->{type(exc).__name__}" if outcome == "loaded" else type(exc).__name__
    return outcome


def has_loop(pte: Any) -> bool:
    """Whether any method jumps backwards (a loop, which may legitimately never end)."""
    s = _schema()
    return any(isinstance(ins.instr_args, s.JumpFalseCall) and ins.instr_args.destination_instruction <= pc
               for plan in pte.program.execution_plan for chain in plan.chains
               for pc, ins in enumerate(chain.instructions))


def fuzz_one(corpus: dict[str, Any], name: str, data: st.DataObject) -> None:
    pte = copy.deepcopy(corpus[name])
    notes = mutate(data.draw, pte)
    blob = serialize(pte)
    if blob is None:
        STATS["unserializable"] += 1
        return
    if data.draw(st.integers(0, 4)) == 0:  # and sometimes corrupt the bytes too
        raw = bytearray(blob)
        for _ in range(data.draw(st.integers(1, 8))):
            raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
        blob = bytes(raw)
        notes.append("bytes flipped")
    kernels = data.draw(st.sampled_from(["torch", "numpy"]))
    rng = np.random.default_rng(data.draw(st.integers(0, 1 << 16)))
    try:
        with guarded(), simulated_gpus(2):
            outcome = exercise(blob, kernels, pte, rng)
    except Hang:
        if has_loop(pte):  # the program's own control flow never ends: ExecuTorch's runtime would spin too
            STATS["loops"] += 1
            return
        STATS["hang"] += 1
        _report(f"{name}: hang with kernels={kernels} after mutations {notes}")
        pytest.fail(f"{name}: hang with kernels={kernels} after mutations {notes}")
    except BaseException as exc:  # noqa: B036 - anything but a PyrtError is the finding
        STATS["crash"] += 1
        _report(f"{name}: {type(exc).__name__}: {exc} with kernels={kernels} after mutations {notes}")
        pytest.fail(f"{name}: {type(exc).__name__} escaped with kernels={kernels} after mutations {notes}:\n"
                    f"{''.join(traceback.format_exception(exc))[-3000:]}")
    STATS["cases"] += 1
    STATS[f"outcome:{outcome}"] += 1


def _report(line: str) -> None:
    """Findings go to ``$PYRT_FUZZ_FINDINGS`` as they happen (before hypothesis shrinks them)."""
    path = os.environ.get("PYRT_FUZZ_FINDINGS")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line.replace("\n", " ")[:2000] + "\n")


def _settings(n: int) -> Any:
    return settings(max_examples=n, database=None, derandomize=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])


@pytest.fixture(autouse=True)
def _fuzz_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("PYRT_MAX_HOST_BYTES", str(MAX_HOST_BYTES))
    yield
    path = os.environ.get("PYRT_FUZZ_STATS")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(dict(STATS)) + "\n")


CORPUS = ("portable", "loop", "cond", "delegated")


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", CORPUS)
def test_fuzz_program_and_run(corpus: dict[str, Any], name: str) -> None:
    STATS.clear()

    @_settings(EXAMPLES)
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        fuzz_one(corpus, name, data)

    run()
    assert STATS["cases"] + STATS["unserializable"] > 0


@pytest.mark.slow
@pytest.mark.timeout(7200)
@pytest.mark.parametrize("name", CORPUS)
def test_fuzz_program_and_run_long(corpus: dict[str, Any], name: str) -> None:
    STATS.clear()

    @_settings(EXAMPLES * 20)
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        fuzz_one(corpus, name, data)

    run()


def test_unmutated_corpus_runs(corpus: dict[str, Any]) -> None:
    """The harness itself: every corpus program serializes, loads and runs with both kernel sets."""
    rng = np.random.default_rng(0)
    for name, pte in corpus.items():
        blob = serialize(copy.deepcopy(pte))
        assert blob is not None, name
        for kernels in ("torch", "numpy"):
            with guarded(), simulated_gpus(2):
                assert exercise(blob, kernels, pte, rng) == "ran", (name, kernels)


# -- in a subprocess, under an address-space limit ------------------------------------------------------------
#
# Services and sandboxes run with ``ulimit -v`` (RLIMIT_AS): there a declared size that fits the machine's
# memory may not fit the process, and the allocator, not pyrt's estimate, has the last word. Mutated files
# (the mutations above, with argument indices and declared sizes weighted up) are written to disk and a
# child process, started under ``RLIMIT_AS`` (``preexec_fn``) and without ``$PYRT_MAX_HOST_BYTES``, runs
# ``pyrt.inspect``, ``Program`` and every method twice on each. Only PyrtError subclasses may escape; a child
# killed by a signal (a crash), a run past its watchdog (a hang, unless the program loops) or a child that stops
# answering is a finding naming the case. Cases: ``$PYRT_FUZZ_AS_EXAMPLES`` per corpus program (default 50).

AS_EXAMPLES = int(os.environ.get("PYRT_FUZZ_AS_EXAMPLES", "50"))
AS_HEADROOM = 1 << 30  # address space the child may map beyond what this (larger) process maps now

AS_CHILD = r"""
import os, pickle, signal, sys, traceback
import numpy as np
import torch  # both kernel sets available, as in the parent
import pyrt
from pyrt.errors import PyrtError
from pyrt.runtime.program import Program
from pyrt.sim import simulated_gpus

class Hang(BaseException):
    pass

def fire(signum, frame):
    raise Hang()

signal.signal(signal.SIGALRM, fire)
directory, first, hang_seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
names = sorted(n for n in os.listdir(directory) if n.endswith(".case"))
for n in names[first:]:
    with open(os.path.join(directory, n), "rb") as f:
        case = pickle.load(f)
    print("start", n, flush=True)
    outcome = "ran"
    signal.setitimer(signal.ITIMER_REAL, hang_seconds)
    try:
        try:
            pyrt.inspect(case["blob"])
        except PyrtError:
            pass
        with simulated_gpus(2), Program(case["blob"], kernels=case["kernels"]) as prog:
            outcome = "loaded"
            for method, inputs in case["inputs"].items():
                if method in prog.method_names:
                    for _ in range(2):
                        prog.run(*inputs, method=method)
            outcome = "ran"
    except Hang:
        outcome = "loop" if case["loop"] else "HANG"
    except PyrtError as exc:
        outcome = f"{outcome}->{type(exc).__name__}" if outcome == "loaded" else type(exc).__name__
    except BaseException as exc:
        outcome = "UNTYPED " + "".join(traceback.format_exception_only(exc)).strip().replace("\n", " ")[:500]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    print("done", n, outcome, flush=True)
"""


def _as_cases(corpus: dict[str, Any], directory: Any, per_program: int) -> int:
    """Write ``per_program`` mutated cases of every corpus program to ``directory``; how many were written."""
    import pickle

    written = [0]

    def one(name: str, data: st.DataObject) -> None:
        pte = copy.deepcopy(corpus[name])
        notes = mutate(data.draw, pte)
        for _ in range(data.draw(st.integers(0, 2))):  # and argument indices or declared sizes on top
            plan = pte.program.execution_plan[0]
            notes.append(data.draw(st.sampled_from([_mutate_argument, _mutate_declared_size]))(data.draw, plan))
        blob = serialize(pte)
        if blob is None:
            return
        rng = np.random.default_rng(data.draw(st.integers(0, 1 << 16)))
        inputs = {plan.name: _inputs(plan, rng) for plan in pte.program.execution_plan}
        case = {"blob": blob, "kernels": data.draw(st.sampled_from(["torch", "numpy"])), "inputs": inputs,
                "loop": has_loop(pte), "notes": [name, *notes]}
        with open(directory / f"{written[0]:06d}.case", "wb") as f:
            pickle.dump(case, f)
        written[0] += 1

    @_settings(per_program * len(CORPUS))
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        one(data.draw(st.sampled_from(CORPUS)), data)

    run()
    return written[0]


def _limit_address_space(limit: int) -> Callable[[], None]:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return apply


def run_under_address_space_limit(directory: Any, n: int) -> tuple[Counter[str], list[str]]:
    """Run the ``n`` cases in ``directory`` in children under RLIMIT_AS: (outcome counts, findings)."""
    import pickle
    import subprocess
    import sys

    limit = _vm_size() + AS_HEADROOM
    env = {k: v for k, v in os.environ.items() if k != "PYRT_MAX_HOST_BYTES"}
    names = sorted(p.name for p in directory.glob("*.case"))
    counts: Counter[str] = Counter()
    findings: list[str] = []
    first = 0
    while first < n:
        proc = subprocess.Popen([sys.executable, "-c", AS_CHILD, str(directory), str(first), str(HANG_SECONDS)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                preexec_fn=_limit_address_space(limit))
        try:
            out, err = proc.communicate(timeout=60 + (n - first) * (HANG_SECONDS + 5))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        started, done = None, first
        for line in out.splitlines():
            word, _, rest = line.partition(" ")
            case, _, outcome = rest.partition(" ")
            if word == "start":
                started = case
            elif word == "done":
                started, done = None, done + 1
                key = outcome if outcome.startswith(("UNTYPED", "HANG")) else outcome.split(" ")[0]
                counts["cases"] += 1
                counts[f"outcome:{key.split(' ')[0]}"] += 1
                if outcome.startswith(("UNTYPED", "HANG")):
                    notes = pickle.loads((directory / case).read_bytes())["notes"]
                    findings.append(f"{case}: {outcome} after {notes}")
        if started is not None or proc.returncode != 0:  # the child died or stopped answering in a case
            bad = started or (names[done] if done < n else "?")
            notes = pickle.loads((directory / bad).read_bytes())["notes"] if bad in names else []
            findings.append(f"{bad}: child ended with {proc.returncode} ({err.strip().splitlines()[-1:]}) "
                            f"after {notes}")
            counts["crash"] += 1
            done = (names.index(bad) + 1) if bad in names else n
        first = done
    return counts, findings


def _vm_size() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


@pytest.mark.timeout(3600)
def test_fuzz_under_address_space_limit(corpus: dict[str, Any], tmp_path: Any) -> None:
    """Mutated files in a child under RLIMIT_AS: only PyrtError subclasses, no crash, no hang."""
    n = _as_cases(corpus, tmp_path, AS_EXAMPLES)
    assert n > 0
    counts, findings = run_under_address_space_limit(tmp_path, n)
    for line in findings:
        _report(line)
    path = os.environ.get("PYRT_FUZZ_STATS")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"address_space_limit": dict(counts), "findings": len(findings)}) + "\n")
    assert not findings, "\n".join(findings[:20])
    assert counts["cases"] == n, counts
