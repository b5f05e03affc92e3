"""A method's pytree I/O specs (``container_meta_type``): validated once, then used to arrange I/O.

ExecuTorch writes ``torch.utils._pytree``'s JSON (``[protocol, node]``, each node
``{"type", "context", "children_spec"}``); its runtime never reads it, pyrt uses
it only to flatten caller arguments and to nest outputs like tuples/lists. The
text comes from an untrusted file, so :func:`parse_spec` checks the whole tree
iteratively before anything walks it recursively: not JSON, a node of the wrong
shape, a dict without its key list, or nesting deeper than :data:`MAX_SPEC_DEPTH`
is a :class:`~pyrt.errors.PteFormatError` naming the method and field.

>>> spec = parse_spec('[1, {"type": "builtins.tuple", "context": "null", "children_spec": '
...                   '[{"type": null, "context": null, "children_spec": []}]}]', "method 'f' output spec")
>>> output_builder(spec, 1)([7])
(7,)
>>> parse_spec('[1, {"type": "builtins.tuple", "children_spec": 5}]', "method 'f' output spec")
Traceback (most recent call last):
...
pyrt.errors.PteFormatError: method 'f' output spec: node at depth 0: children_spec is a int, not a list
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from pyrt.errors import InputError, PteFormatError

MAX_SPEC_DEPTH = 64  # nesting of containers in one method's inputs or outputs; real models use a handful
Spec = dict[str, Any]

_CONTAINERS = (list, tuple, dict)
_SEQ_TYPES: dict[str, type] = {"builtins.tuple": tuple, "builtins.list": list,
                               "torch.fx.immutable_collections.immutable_list": list}
_DICT_TYPE = "builtins.dict"


def parse_spec(text: str, what: str) -> Spec | None:
    """The root node of a pytree spec (None for an empty string), validated; PteFormatError otherwise."""
    if not text:
        return None
    try:
        obj = json.loads(text)
    except RecursionError:
        raise PteFormatError(f"{what}: JSON nested too deeply to decode") from None
    except ValueError as exc:
        raise PteFormatError(f"{what}: not a JSON pytree spec: {exc}") from None
    if not (isinstance(obj, list) and len(obj) == 2 and isinstance(obj[1], dict)):
        raise PteFormatError(f"{what}: expected [protocol, node], got a {type(obj).__name__}")
    _check_tree(obj[1], what)
    return obj[1]


def _check_tree(root: Any, what: str) -> None:
    stack: list[tuple[Any, int]] = [(root, 0)]
    while stack:
        node, depth = stack.pop()
        where = f"{what}: node at depth {depth}"
        if depth > MAX_SPEC_DEPTH:
            raise PteFormatError(f"{what}: containers nest deeper than {MAX_SPEC_DEPTH} levels")
        if not isinstance(node, dict):
            raise PteFormatError(f"{where} is a {type(node).__name__}, not an object")
        kind, kids = node.get("type"), node.get("children_spec")
        if kind is not None and not isinstance(kind, str):
            raise PteFormatError(f"{where}: type is a {type(kind).__name__}, not a string")
        if kids is None:
            kids = node["children_spec"] = []
        if not isinstance(kids, list):
            raise PteFormatError(f"{where}: children_spec is a {type(kids).__name__}, not a list")
        if kind == _DICT_TYPE:
            node["keys"] = _dict_keys(node.get("context"), len(kids), where)
        stack.extend((k, depth + 1) for k in kids)


def _dict_keys(context: Any, n: int, where: str) -> list[Any]:
    try:
        keys = json.loads(context) if isinstance(context, str) else None
    except (ValueError, RecursionError):
        keys = None
    if not isinstance(keys, list) or len(keys) != n or not all(isinstance(k, (str, int)) for k in keys):
        raise PteFormatError(f"{where}: a dict's context must be a JSON list of its {n} keys, got {context!r:.80}")
    return keys


def _leaves(spec: Spec) -> int:
    kids = spec["children_spec"]
    return 1 if spec.get("type") is None and not kids else sum(_leaves(k) for k in kids)


def _simple(spec: Spec) -> bool:
    t = spec.get("type")
    if t is None:
        return not spec["children_spec"]
    return t in _SEQ_TYPES and all(_simple(k) for k in spec["children_spec"])


def _unflatten(spec: Spec, it: Any) -> Any:
    t = spec.get("type")
    if t is None:
        return next(it)
    return _SEQ_TYPES[t](_unflatten(k, it) for k in spec["children_spec"])


def output_builder(spec: Spec | None, n: int) -> Callable[[list[Any]], Any]:
    """Arrange flat outputs like the method's output pytree (tuple/list nesting), else a flat tuple."""
    if spec is None or _leaves(spec) != n or not _simple(spec):
        return tuple
    if spec.get("type") is None:
        return lambda outs: outs[0]
    if all(k.get("type") is None for k in spec["children_spec"]):  # a flat tuple or list: its constructor
        return _SEQ_TYPES[spec["type"]]

    def build(outs: list[Any]) -> Any:
        return _unflatten(spec, iter(outs))

    return build


def input_flattener(spec: Spec | None, n: int, method: str) -> Callable[[Sequence[Any]], Sequence[Any]]:
    """Flatten caller arguments along the method's input pytree (args tuple of tuples/lists/dicts)."""
    args_spec = None
    if spec is not None and spec.get("type") == "builtins.tuple" and spec["children_spec"]:
        args_spec = spec["children_spec"][0]

    def flatten(inputs: Sequence[Any]) -> Sequence[Any]:
        if len(inputs) == n:
            for x in inputs:
                if type(x) in _CONTAINERS:
                    break
            else:
                return inputs
        if args_spec is not None:
            out: list[Any] = []
            if _flatten_into(args_spec, tuple(inputs), out) and len(out) == n:
                return out
        raise InputError(f"method {method!r} takes {n} inputs (flattened), got {len(inputs)} arguments")

    return flatten


def _flatten_into(spec: Spec, x: Any, out: list[Any]) -> bool:
    t = spec.get("type")
    kids = spec["children_spec"]
    if t is None and not kids:
        out.append(x)
        return True
    if t in _SEQ_TYPES:
        if not isinstance(x, (list, tuple)) or len(x) != len(kids):
            return False
        return all(_flatten_into(k, v, out) for k, v in zip(kids, x, strict=True))
    if t == _DICT_TYPE:
        keys = spec["keys"]
        if not isinstance(x, dict):
            return False
        by_name = {str(key): v for key, v in x.items()}
        if sorted(by_name) != sorted(map(str, keys)):
            return False
        return all(_flatten_into(k, by_name[str(key)], out) for k, key in zip(kids, keys, strict=True))
    return False


__all__ = ["MAX_SPEC_DEPTH", "parse_spec", "output_builder", "input_flattener"]
