"""FX plumbing: resolve lifted objects, unlift a program, inline submodules, re-derive dims.

Three of the export traps live here (formats.md §4):

* lifted custom objects are found through
  ``ExportGraphSignature.inputs_to_lifted_custom_objs`` (placeholder name -> FQN),
  falling back to the node's name/target only when a program has no such
  mapping at all, and a ``FakeScriptObject`` is unwrapped to its real object;
* fallback submodules are inlined with their placeholders wired to the call's
  arguments *by position* (node names are not stable: FX renames ``getitem``);
* nothing here turns tensors into source literals.

>>> import torch
>>> gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.ReLU()))
>>> inline_submodules(gm)
0
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Mapping
from typing import Any, cast

import torch
import torch.fx as fx
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind
from torch.fx.passes.tools_common import legalize_graph

from pyrt.errors import ExportError
from pyrt.export._graph.spec import linear_size

log = logging.getLogger("pyrt.export")
_STATE_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


def unwrap_script_object(obj: Any) -> Any:
    """The real object behind a ``FakeScriptObject`` (anything else unchanged)."""
    if type(obj).__name__ == "FakeScriptObject":
        return object.__getattribute__(obj, "real_obj")
    return obj


def resolve_custom_obj(
    node: fx.Node,
    *,
    signature: Any = None,
    constants: Mapping[str, Any] | None = None,
    root: torch.nn.Module | None = None,
) -> Any | None:
    """The object an engine-argument node stands for, or None when it cannot be known.

    ``get_attr`` nodes read ``root``. Placeholders go through the signature's
    ``inputs_to_lifted_custom_objs``; only a program without that mapping falls
    back to the node's name/target (with and without the ``obj_`` prefix). A
    mapping that exists but lacks this placeholder yields None rather than a
    guess, because guessing by name picks the wrong engine when names collide.
    """
    if node.op == "get_attr":
        obj = _get_path(root, str(node.target)) if root is not None else None
        return unwrap_script_object(obj)
    if node.op != "placeholder":
        return None
    constants = constants or {}
    mapping = getattr(signature, "inputs_to_lifted_custom_objs", None) if signature is not None else None
    if mapping:
        fqn = mapping.get(node.name)
        return None if fqn is None else unwrap_script_object(constants.get(fqn))
    for key in _legacy_keys(node):
        if key in constants:
            return unwrap_script_object(constants[key])
    return None


def _legacy_keys(node: fx.Node) -> list[str]:
    keys = [node.name, str(node.target)]
    return keys + [k.removeprefix("obj_") for k in keys if k.startswith("obj_")]


def _get_path(root: Any, target: str) -> Any:
    obj = root
    for part in target.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


# -- unlifting ---------------------------------------------------------------------------------


class _Attrs:
    """Attribute names on the new root, unique and valid identifiers."""

    def __init__(self, root: torch.nn.Module) -> None:
        self.root = root
        self.used: set[str] = set()

    def add(self, fqn: str, value: Any, kind: Any = None, persistent: bool = True) -> str:
        base = "".join(c if c.isalnum() else "_" for c in fqn).strip("_") or "attr"
        base = base if not base[0].isdigit() else f"_{base}"
        name, i = base, 0
        while name in self.used or hasattr(self.root, name):
            i += 1
            name = f"{base}_{i}"
        self.used.add(name)
        if kind == InputKind.PARAMETER:
            self.root.register_parameter(name, torch.nn.Parameter(value, requires_grad=False))
        elif kind == InputKind.BUFFER:
            self.root.register_buffer(name, value, persistent=persistent)
        else:
            setattr(self.root, name, value)
        return name


def unlift(ep: ExportedProgram) -> fx.GraphModule:
    """A flat GraphModule of ``ep``: states become ``get_attr``, user I/O keeps ep's pytree specs.

    Custom objects are resolved with :func:`resolve_custom_obj` (so the engine
    objects of a Torch-TensorRT program are the real ones). A buffer mutation
    becomes ``aten.copy_(buffer, new value)`` at the end of the graph (re-exporting
    turns it back into a buffer mutation); ``gm.meta["mutable_buffers"]`` names those
    buffers' attributes. Programs that mutate their inputs are refused.
    """
    sig = ep.graph_signature
    specs = {s.arg.name: s for s in sig.input_specs if hasattr(s.arg, "name")}
    root = torch.nn.Module()
    attrs = _Attrs(root)
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    mutable: list[str] = []
    for node in ep.graph.nodes:
        if node.op == "placeholder":
            env[node] = _unlift_placeholder(node, specs.get(node.name), ep, graph, attrs)
        elif node.op == "output":
            user = _write_back(sig, list(node.args[0]), env, graph, mutable)
            graph.output(tuple(user))
        else:
            env[node] = graph.node_copy(node, env.__getitem__)
    gm = fx.GraphModule(root, graph)
    gm.meta["mutable_buffers"] = frozenset(mutable)
    if ep.call_spec.in_spec is not None:  # keep the program's (args, kwargs) / output structure
        from torch.fx.graph import _PyTreeCodeGen, _PyTreeInfo

        names = _forward_arg_names(ep)
        gm.graph._codegen = _PyTreeCodeGen(_PyTreeInfo(names, ep.call_spec.in_spec, ep.call_spec.out_spec))
    gm.meta["range_constraints"] = dict(ep.range_constraints)
    gm.recompile()
    return gm


def _unlift_placeholder(node: fx.Node, spec: Any, ep: ExportedProgram, graph: fx.Graph, attrs: _Attrs) -> fx.Node:
    if _is_custom_obj(node) and (spec is None or spec.kind != InputKind.CUSTOM_OBJ):
        obj = resolve_custom_obj(node, signature=ep.graph_signature, constants=ep.constants)  # legacy program
        if obj is None:
            raise ExportError(f"custom object input {node.name!r} is not declared in the graph signature and no "
                              "constant matches its name")
        new = graph.get_attr(attrs.add(node.name, obj))
    elif spec is None or spec.kind == InputKind.USER_INPUT:
        new = graph.placeholder(node.name)
    elif spec.kind in _STATE_KINDS:
        value = ep.state_dict[spec.target] if spec.target in ep.state_dict else ep.constants[spec.target]
        name = attrs.add(spec.target, value, spec.kind, bool(getattr(spec, "persistent", True)))
        new = graph.get_attr(name)
    elif spec.kind == InputKind.CUSTOM_OBJ:
        obj = resolve_custom_obj(node, signature=ep.graph_signature, constants=ep.constants)
        if obj is None:
            raise ExportError(f"custom object input {node.name!r} ({spec.target!r}) is not in the program's constants")
        new = graph.get_attr(attrs.add(spec.target, obj))
    else:
        raise ExportError(f"program input {node.name!r} has kind {spec.kind.name}, which pyrt cannot export")
    new.meta = dict(node.meta)
    return new


def _is_custom_obj(node: fx.Node) -> bool:
    val = node.meta.get("val")
    return type(val).__name__ in ("CustomObjArgument", "FakeScriptObject", "ScriptObject")


def _write_back(sig: Any, outputs: list[Any], env: dict[fx.Node, fx.Node], graph: fx.Graph,
                mutable: list[str]) -> list[Any]:
    """``copy_`` each mutated buffer's new value into it; returns the user outputs (env-mapped)."""
    placeholders = {s.target: s.arg.name for s in sig.input_specs if s.kind == InputKind.BUFFER}
    by_name = {n.name: n for n in env}
    user = []
    for spec, value in zip(sig.output_specs, outputs, strict=True):
        if spec.kind == OutputKind.USER_OUTPUT:
            user.append(fx.map_arg(value, env.__getitem__))
        elif spec.kind == OutputKind.BUFFER_MUTATION and spec.target in placeholders:
            buffer = env[by_name[placeholders[spec.target]]]
            new = env[value]
            copy = graph.call_function(torch.ops.aten.copy_.default, (buffer, new))
            copy.meta["val"] = buffer.meta.get("val")
            mutable.append(str(buffer.target))
        else:
            raise ExportError(
                f"the program's output {spec.arg} is a {spec.kind.name}; pyrt exports programs whose only "
                "side effects are buffer mutations (return the new value instead of mutating an input)")
    return user


def _forward_arg_names(ep: ExportedProgram) -> list[str]:
    sig = ep.module_call_graph[0].signature if ep.module_call_graph else None
    names = getattr(sig, "forward_arg_names", None)
    if names:
        return list(names)
    args_spec, kwargs_spec = ep.call_spec.in_spec.children()
    return [f"arg_{i}" for i in range(args_spec.num_children)] + list(kwargs_spec.context)


# -- inlining ----------------------------------------------------------------------------------


def inline_submodules(gm: fx.GraphModule, keep: Any = None) -> int:
    """Inline every ``call_module`` of an ``fx.GraphModule`` submodule into ``gm``'s graph.

    Returns how many calls were inlined (nested ones included). ``keep(module) -> bool``
    names GraphModules to leave as calls. Each submodule's i-th placeholder is wired
    to the call's i-th argument (kwargs by placeholder name, as FX passes them);
    node *names* are never used to find values, because FX renames nodes (a
    submodule's ``getitem`` may be the parent's ``getitem_8``). Only ``gm``'s graph
    changes: submodules are read, not modified; their attributes are reached by
    qualified name (``sub.weight``).
    """
    count = 0
    while True:
        calls = [n for n in gm.graph.nodes if n.op == "call_module" and _inlinable(gm, n, keep)]
        if not calls:
            break
        for call in calls:
            sub = cast(fx.GraphModule, gm.get_submodule(str(call.target)))  # _inlinable checked the type
            _inline_one(gm, call, sub)
            count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
    return count


def _inlinable(gm: fx.GraphModule, node: fx.Node, keep: Any) -> bool:
    sub = gm.get_submodule(str(node.target))
    return isinstance(sub, fx.GraphModule) and not (keep is not None and keep(sub))


def _inline_one(gm: fx.GraphModule, call: fx.Node, sub: fx.GraphModule) -> None:
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    if len(call.args) > len(placeholders):
        raise ExportError(f"call to {call.target!r} passes {len(call.args)} arguments to {len(placeholders)} inputs")
    env: dict[fx.Node, Any] = {}
    for i, ph in enumerate(placeholders):
        if i < len(call.args):
            env[ph] = call.args[i]
        elif ph.name in call.kwargs:
            env[ph] = call.kwargs[ph.name]
        elif ph.args:  # placeholder default value
            env[ph] = ph.args[0]
        else:
            raise ExportError(f"call to {call.target!r} gives no value for input {i} ({ph.name!r})")
    result: Any = None
    prefix = str(call.target)
    with gm.graph.inserting_before(call):
        for node in sub.graph.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "output":
                result = fx.map_arg(node.args[0], env.__getitem__)
            elif node.op in ("get_attr", "call_module"):
                args = fx.map_arg(node.args, env.__getitem__)
                kwargs = fx.map_arg(node.kwargs, env.__getitem__)
                env[node] = gm.graph.create_node(node.op, f"{prefix}.{node.target}", args, kwargs)
                env[node].meta = dict(node.meta)
            else:
                env[node] = gm.graph.node_copy(node, env.__getitem__)
    _replace_call_uses(gm, call, result)


def _replace_call_uses(gm: fx.GraphModule, call: fx.Node, result: Any) -> None:
    """Uses of the call become the inlined result; ``getitem(call, i)`` becomes element i."""
    for user in list(call.users):
        if user.op == "call_function" and user.target is operator.getitem and isinstance(result, (tuple, list)):
            user.replace_all_uses_with(result[user.args[1]])  # type: ignore[index]  # fx: getitem's index is an int
            gm.graph.erase_node(user)
    if call.users:
        if not isinstance(result, fx.Node):
            raise ExportError(f"the result of {call.target!r} is a {type(result).__name__} used as a whole")
        call.replace_all_uses_with(result)
    gm.graph.erase_node(call)


def graph_copy(gm: fx.GraphModule) -> fx.GraphModule:
    """A new GraphModule over a copy of ``gm``'s graph, sharing ``gm``'s submodules and tensors."""
    graph = fx.Graph()
    graph._codegen = gm.graph._codegen
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    return fx.GraphModule(gm, graph)


def finish(gm: fx.GraphModule) -> None:
    """Topologically order the graph, drop dead nodes and the states only engines used."""
    legalize_graph(gm)
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    used = {str(n.target) for n in gm.graph.nodes if n.op == "get_attr"}
    for name, _ in list(gm.named_parameters(recurse=False)) + list(gm.named_buffers(recurse=False)):
        if name not in used:
            delattr(gm, name)
    gm.recompile()


# -- dynamic shapes for re-export ----------------------------------------------------------------


def dynamic_shapes_of(ep: ExportedProgram) -> Any:
    """A ``dynamic_shapes`` argument that reproduces ``ep``'s symbolic user-input dims, or None.

    Each free symbol becomes one ``Dim`` with the program's value range; a
    dimension ``a*s + b`` becomes the derived ``a*Dim + b``.
    """
    from torch.export import Dim

    user = [n for n in ep.graph.nodes if n.op == "placeholder" and n.name in set(ep.graph_signature.user_inputs)]
    dims: dict[str, Any] = {}
    leaves: list[Any] = []
    any_dynamic = False
    for node in user:
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            leaves.append(None)
            continue
        spec: dict[int, Any] = {}
        for d, size in enumerate(val.shape):
            if isinstance(size, int):
                continue
            lin = linear_size(size)
            if lin is None:
                raise ExportError(f"input {node.name!r} dim {d} has size {size}, which pyrt cannot re-declare")
            sym, coeff, offset = lin
            if sym not in dims:
                lo, hi = _range(ep, size, sym)
                dims[sym] = Dim(f"d_{sym}", min=lo, max=hi)
            spec[d] = dims[sym] if (coeff, offset) == (1, 0) else coeff * dims[sym] + offset
            any_dynamic = True
        leaves.append(spec or None)
    if not any_dynamic:
        return None
    args, kwargs = torch.utils._pytree.tree_unflatten(leaves, ep.call_spec.in_spec)
    if not kwargs:
        return tuple(args)
    names = _forward_arg_names(ep)
    return {**dict(zip(names, args, strict=False)), **kwargs}  # names also lists the kwargs


def _range(ep: ExportedProgram, size: Any, sym: str) -> tuple[int, int]:
    """The declared range of ``sym`` (range_constraints), else the shape environment's."""
    rng = next((r for s, r in ep.range_constraints.items() if str(s) == sym), None)
    if rng is None:
        env = size.node.shape_env
        rng = next((r for s, r in env.var_to_range.items() if str(s) == sym), None)
    if rng is None:
        raise ExportError(f"symbol {sym} has no value range")
    lo, hi = rng.lower, rng.upper
    if not getattr(hi, "is_finite", True) or str(hi) in ("oo", "int_oo"):
        raise ExportError(
            f"dynamic dimension {sym} has no upper bound; give torch.export.Dim(..., max=N) so engines "
            "and memory planning know the largest shape"
        )
    return int(lo), int(hi)
