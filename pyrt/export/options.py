"""One export's options: :class:`ExportOptions`, each checked once by :func:`make_options` before any work.

The outermost entry point (``to_pte``, ``decoder_to_pte``, ``checkpoint_to_pte``, ``pt2_to_pte``, so
``pyrt export``) makes one and passes it down as it is: nothing below checks a field again or
derives it anew, and each default is written here once. Rules between fields are
:func:`check_together`'s alone. Public here too: :data:`BUILDERS` and :class:`PartitionInfo`
(what a per-partition ``device`` or budget callable receives). Every check raises a typed pyrt
error naming the value and the option it came from; nothing here imports torch at module import time.

>>> options = make_options(builder="reference", device=1, quantize="int4", group_size=64, progress=False)
>>> options.device(PartitionInfo(0, "engine_0", ())), options.quantize
('cuda:1', Scheme(name='int4', group_size=64))
>>> check_budget(1 << 30, "weight_streaming_budget")
1073741824
>>> canonical_op_name("aten.relu.default"), canonical_op_name("torch.ops.aten.add")
('aten::relu.default', 'aten::add')
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from pyrt.checks import checked_int, is_int
from pyrt.device.budgets import parse_budget
from pyrt.errors import BudgetError, ExportError
from pyrt.export._engines.profiles import Bounds, check_profiles
from pyrt.export._engines.progress import Progress
from pyrt.export._tensorrt.flavour import resolve_flavour
from pyrt.format import weight_quant as wq
from pyrt.format.layer_groups import SPEC_LAYERS, SPEC_WEIGHT_BYTES

BUILDERS = ("auto", "tensorrt", "tensorrt_rtx", "reference")
PORTABLE = "portable"  # decoder_to_pte's builder of files without engines (ExecuTorch's portable kernels)
DECODER_BUILDERS = (*BUILDERS, PORTABLE)
WRITERS = ("pyrt", "executorch")
DEFAULT_BUILDER = "auto"
DEFAULT_DEVICE = "cuda:0"
DEFAULT_WRITER = "pyrt"
DEFAULT_MIN_BLOCK_SIZE = 1
BUDGET_MAX = 1 << 63  # formats.md §2: non-negative, at most 2**63
SPEC_DEVICE = "target_device"
SPEC_BUDGET = "weight_streaming_budget"
_DEVICE_RE = re.compile(r"cuda(?::(\d+))?\Z")
_DECIMAL_RE = re.compile(r"[0-9]+\Z")


@dataclass(frozen=True)
class PartitionInfo:
    """What a per-partition ``device`` / ``weight_streaming_budget`` callable receives."""

    index: int
    name: str
    ops: tuple[str, ...]


@dataclass(frozen=True)
class ExportOptions:
    """``to_pte``'s options, checked (:func:`make_options` makes them; :func:`check_together` holds between them).

    ``builder``: the name asked for (the summary says it); ``flavour``: what builds the engines, found when the
    options were made: ``"reference"``, or the TensorRT module ``builder`` names. ``quantize``: the export's one
    quantization plan (None: float weights). ``profiles``: one ``{input: (min, opt, max)}`` per optimization
    profile, or None (one profile from the dynamic shapes).
    """

    builder: str
    flavour: str | ModuleType
    forced_fallback: frozenset[str]
    min_block_size: int
    device: PerPartition  # PartitionInfo -> "cuda:N"
    budget: PerPartition  # PartitionInfo -> int | None
    weight_streaming: bool
    extra_specs: tuple[tuple[str, bytes], ...]
    writer: str
    progress: Progress
    dynamic_shapes: Any
    external_weights: bool
    profiles: tuple[dict[Any, Bounds], ...] | None
    quantize: wq.Scheme | None
    max_engine_size: int | None = None  # bytes of weights per engine: cut at layer boundaries (None: no cut)
    devices: tuple[str, ...] = ()  # device=[...]: the layer groups spread over these in order (():  ``device``)

    def __post_init__(self) -> None:
        check_together(self)


def make_options(*, torch_executed_ops: Any = (), min_block_size: Any = DEFAULT_MIN_BLOCK_SIZE,
                 device: Any = DEFAULT_DEVICE, weight_streaming: Any = False, weight_streaming_budget: Any = None,
                 builder: Any = DEFAULT_BUILDER, dynamic_shapes: Any = None, compile_specs: Any = None,
                 progress: Any = None, writer: Any = DEFAULT_WRITER, external_weights: Any = False,
                 profiles: Any = None, quantize: Any = None, group_size: Any = wq.DEFAULT_GROUP_SIZE,
                 max_engine_size: Any = None) -> ExportOptions:
    """Every ``to_pte`` option (the same names and defaults) checked once, before any work; the builder is found
    last (a missing TensorRT is an ExportError now, not after the slow steps)."""
    for name, flag in (("weight_streaming", weight_streaming), ("external_weights", external_weights)):
        if not isinstance(flag, bool):
            raise ExportError(f"{name}={flag!r} must be a bool")
    names = frozenset(canonical_op_name(o) for o in _as_list(torch_executed_ops))
    for name in names:
        check_op_exists(name)
    chosen = check_choice(builder, BUILDERS, "builder")
    devices = check_devices(device, "device")
    return ExportOptions(
        builder=chosen,
        forced_fallback=names,
        min_block_size=checked_int(min_block_size, "min_block_size", low=1, error=ExportError),
        device=PerPartition(devices[0] if devices else device, "device", normalize_device),
        devices=devices if len(devices) > 1 else (),
        budget=PerPartition(weight_streaming_budget, "weight_streaming_budget", check_optional_budget, missing=None),
        weight_streaming=weight_streaming,
        extra_specs=normalize_compile_specs(compile_specs),
        writer=check_choice(writer, WRITERS, "writer"),
        dynamic_shapes=dynamic_shapes,
        progress=Progress.of(progress),
        external_weights=external_weights,
        profiles=check_profiles(profiles),
        quantize=check_quantize(quantize, group_size),
        max_engine_size=check_engine_size(max_engine_size, "max_engine_size"),
        flavour=chosen if chosen == "reference" else resolve_flavour(chosen),
    )


def check_together(options: ExportOptions) -> None:
    """The rules between options, all here (each option alone is checked where :func:`make_options` reads it)."""
    if options.devices and options.max_engine_size is None:
        raise ExportError(f"device={list(options.devices)} spreads layer groups over the GPUs: give max_engine_size "
                          "(decoder_to_pte chooses one itself)")
    if options.budget.given and any(key == SPEC_BUDGET for key, _ in options.extra_specs):
        raise ExportError("weight_streaming_budget was given both as an argument and as a raw compile spec; "
                          "pass it once")


def _as_list(ops: Any) -> list[Any]:
    if isinstance(ops, str) or not hasattr(ops, "__iter__"):
        return [ops]
    return list(ops)


def check_quantize(quantize: Any, group_size: Any) -> wq.Scheme | None:
    """``quantize=None | "int8" | "int4"`` and ``group_size`` (a power of two >= 16): the export's one quantization
    plan, made once (by :func:`make_options`, or by ``decoder_to_pte`` for a portable file).

    >>> check_quantize("int4", 64)
    Scheme(name='int4', group_size=64)
    >>> check_quantize("int3", 128)
    Traceback (most recent call last):
    ...
    pyrt.errors.ExportError: quantize='int3' is not one of None, 'int8', 'int4'
    """
    if quantize is not None and (not isinstance(quantize, str) or quantize not in wq.SCHEMES):
        raise ExportError(f"quantize={quantize!r} is not one of None, " + ", ".join(map(repr, wq.SCHEMES)))
    if not wq.is_group_size(group_size):
        raise ExportError(f"group_size={group_size!r} must be a power of two >= {wq.MIN_GROUP_SIZE} "
                          f"(default {wq.DEFAULT_GROUP_SIZE})")
    return None if quantize is None else wq.Scheme(quantize, group_size)


def check_engine_size(value: Any, source: str) -> int | None:
    """``max_engine_size``: None (no cut), or the most weight bytes one engine holds: an int > 0 or a string
    such as ``"2GiB"`` / ``"500MB"`` (the units of :func:`pyrt.device.budgets.parse_budget`).

    >>> check_engine_size("2GiB", "--max-engine-size"), check_engine_size(4096, "max_engine_size")
    (2147483648, 4096)
    >>> check_engine_size("abc", "--max-engine-size")
    Traceback (most recent call last):
    ...
    pyrt.errors.ExportError: --max-engine-size='abc' is not a size such as 2GiB, 500MB or a byte count > 0
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ExportError(f"{source}={value!r} is a {type(value).__name__}; pass a size such as 2GiB or a byte "
                          "count > 0")
    try:
        spec = parse_budget(value, source=source)
    except BudgetError:
        spec = None
    if spec is None or spec.kind != "bytes" or not isinstance(spec.value, int) or spec.value < 1:
        raise ExportError(f"{source}={value!r} is not a size such as 2GiB, 500MB or a byte count > 0")
    return spec.value


def check_budget(value: Any, source: str) -> int:
    """A weight-streaming budget in bytes: an int in [0, 2**63]; bool is refused."""
    if not is_int(value):
        kind = "bool" if isinstance(value, bool) else type(value).__name__
        raise BudgetError(f"{source}={value!r} is a {kind}; pass a number of bytes (an int >= 0)")
    if not is_int(value, low=0, end=BUDGET_MAX + 1):
        raise BudgetError(f"{source}={value} is outside [0, 2**63]")
    return int(value)


def parse_budget_spec(raw: Any, source: str) -> int:
    """A raw ``weight_streaming_budget`` compile spec: ASCII decimal digits, in range."""
    text = raw.decode("ascii", errors="replace") if isinstance(raw, (bytes, bytearray)) else raw
    if not isinstance(text, str) or not _DECIMAL_RE.match(text):
        raise BudgetError(f"{source}={raw!r} is not an ASCII decimal byte count")
    return check_budget(int(text), source)


def check_devices(value: Any, source: str) -> tuple[str, ...]:
    """``device`` as a list (a list or tuple, or ``"cuda:0,cuda:1"``): each normalized, none twice; ``()`` when
    ``value`` is one device, a mapping or a callable (:class:`PerPartition` reads those).

    >>> check_devices("cuda:0,cuda:1", "--device"), check_devices([1, "cuda:0"], "device"), check_devices(0, "d")
    (('cuda:0', 'cuda:1'), ('cuda:1', 'cuda:0'), ())
    >>> check_devices("cuda:0,0", "--device")
    Traceback (most recent call last):
    ...
    pyrt.errors.ExportError: --device='cuda:0,0' lists cuda:0 twice
    """
    if isinstance(value, str) and "," in value:
        items: list[Any] = [int(v) if v.strip().isdigit() else v for v in value.split(",")]
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        return ()
    if not items:
        raise ExportError(f"{source}={value!r} lists no device")
    devices: list[str] = []
    for i, item in enumerate(items):
        device = normalize_device(item, f"{source}[{i}]")
        if device in devices:
            raise ExportError(f"{source}={value!r} lists {device} twice")
        devices.append(device)
    return tuple(devices)


def normalize_device(value: Any, source: str) -> str:
    """``"cuda"``, ``"cuda:N"``, an int N or a ``torch.device`` -> ``"cuda:N"``.

    >>> normalize_device(1, "device"), normalize_device("CUDA", "device")
    ('cuda:1', 'cuda:0')
    """
    if is_int(value):
        if value < 0:
            raise ExportError(f"{source}={value} is a negative device index")
        return f"cuda:{int(value)}"
    if type(value).__name__ == "device" and hasattr(value, "type"):  # torch.device, without importing torch
        if value.type != "cuda":
            raise ExportError(f"{source}={value!r}: TensorRT engines run on CUDA devices only")
        return f"cuda:{value.index or 0}"
    if isinstance(value, str):
        match = _DEVICE_RE.match(value.strip().lower())
        if match:
            return f"cuda:{int(match.group(1) or 0)}"
    raise ExportError(f"{source}={value!r} is not a CUDA device such as 'cuda:0' or 1")


def device_index(device: str) -> int:
    """``"cuda:3"`` -> 3 (``device`` already normalized)."""
    return int(device.partition(":")[2])


_REQUIRED = object()


class PerPartition:
    """A constant, a mapping (partition index or name, or ``"*"`` -> value) or a callable.

    Calling it with a :class:`PartitionInfo` gives that partition's value, checked
    with ``check``; a partition a mapping does not name gets ``missing`` (an error
    when ``missing`` is not given). :meth:`check_all_used` then refuses mapping
    keys that named none of the partitions (a typo would otherwise be silently ignored).
    Nothing in it changes once it is made. ``given``: a value other than None was given.
    """

    def __init__(self, value: Any, source: str, check: Callable[[Any, str], Any], missing: Any = _REQUIRED) -> None:
        self.source, self.check, self.missing = source, check, missing
        self.given = value is not None
        self.table: dict[Any, Any] | None = None
        if isinstance(value, Mapping):
            self.table = dict(value)
            for key, item in self.table.items():  # validate now, before any work
                check(item, f"{source}[{key!r}]")
        elif callable(value) and not isinstance(value, (str, bytes)) and type(value).__name__ != "device":
            self.fn = value
        else:
            checked = check(value, source)
            self.fn = lambda info: checked

    def __call__(self, info: PartitionInfo) -> Any:
        if self.table is None:
            return self.check(self.fn(info), f"{self.source}({info.name})")
        key = self._key(info)
        if key is not None:
            return self.check(self.table[key], f"{self.source}[{key!r}]")
        if self.missing is not _REQUIRED:
            return self.missing
        raise ExportError(
            f"{self.source} has no entry for partition {info.index} ({info.name!r}); keys are "
            f"{sorted(map(repr, self.table))}; add it or a '*' default"
        )

    def _key(self, info: PartitionInfo) -> Any:
        """The mapping key that gives ``info``'s value: its index, else its name, else ``"*"`` (None: none)."""
        return next((k for k in (info.index, info.name, "*") if self.table is not None and k in self.table), None)

    def check_all_used(self, infos: Iterable[PartitionInfo]) -> None:
        """ExportError when a mapping key names none of the partitions ``infos`` (``"*"`` aside)."""
        used = {self._key(info) for info in infos}
        unused = set(self.table or ()) - used - {"*"}
        if unused:
            raise ExportError(f"{self.source} names partitions that do not exist: {sorted(map(repr, unused))}")


def check_optional_budget(value: Any, source: str) -> int | None:
    return None if value is None else check_budget(value, source)


def normalize_compile_specs(specs: Any) -> tuple[tuple[str, bytes], ...]:
    """Extra raw compile specs baked into every delegate, checked for conflicts.

    ``target_device`` is always resolved per partition (use ``device=``); a raw
    ``weight_streaming_budget`` is allowed only when the argument is not also given
    (:func:`check_together`).
    """
    if specs is None:
        return ()
    items = specs.items() if isinstance(specs, Mapping) else _spec_pairs(specs)
    out: list[tuple[str, bytes]] = []
    for key, value in items:
        if not isinstance(key, str) or not key:
            raise ExportError(f"compile_specs key {key!r} must be a non-empty string")
        raw = value.encode("ascii") if isinstance(value, str) else value
        if not isinstance(raw, (bytes, bytearray)):
            raise ExportError(f"compile_specs[{key!r}]={value!r} must be bytes or an ASCII string")
        if key == wq.SPEC_KEY:
            raise ExportError(f"compile_specs must not set {key!r}: pass quantize= and group_size= instead")
        if key == SPEC_DEVICE:
            raise ExportError(
                "compile_specs must not set 'target_device': it is resolved per partition from each "
                "engine's own device; pass device= (a device, a mapping or a callable) instead"
            )
        if key == SPEC_BUDGET:
            parse_budget_spec(raw, f"compile_specs[{key!r}]")
        if any(k == key for k, _ in out):
            raise ExportError(f"compile_specs gives {key!r} twice")
        out.append((key, bytes(raw)))
    return tuple(out)


def _spec_pairs(specs: Any) -> list[tuple[Any, Any]]:
    """CompileSpec-like objects (``.key``/``.value``) or (key, value) pairs."""
    try:
        return [(s.key, s.value) if hasattr(s, "key") else tuple(s) for s in specs]
    except (TypeError, ValueError):
        raise ExportError(f"compile_specs must be a mapping or a list of (key, value), got {specs!r}") from None


def check_choice(value: Any, choices: tuple[str, ...], source: str) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ExportError(f"{source}={value!r} is not one of {', '.join(map(repr, choices))}")
    return value


def canonical_op_name(op: Any) -> str:
    """``namespace::name[.overload]`` for an OpOverload, OpOverloadPacket or string.

    Strings may be ``"aten.relu.default"``, ``"aten::relu.default"``, ``"torch.ops.aten.relu"``
    or a bare ``"relu"`` (namespace aten); no overload means every overload.
    """
    schema = getattr(op, "_schema", None)
    if schema is not None and hasattr(op, "_overloadname"):
        return f"{schema.name}.{op._overloadname}"
    qualified = getattr(op, "_qualified_op_name", None)
    if isinstance(qualified, str):
        return qualified
    if not isinstance(op, str) or not op.strip():
        raise ExportError(f"torch_executed_ops entry {op!r} is not an operator or an operator name")
    text = op.strip().removeprefix("torch.ops.")
    if "::" in text:
        namespace, rest = text.split("::", 1)
    elif "." in text:
        namespace, rest = text.split(".", 1)
    else:
        namespace, rest = "aten", text
    return f"{namespace}::{rest}"


def check_op_exists(name: str) -> None:
    """Refuse a misspelt ``torch_executed_ops`` entry instead of silently ignoring it."""
    import torch

    namespace, rest = name.split("::", 1)
    op_name, _, overload = rest.partition(".")
    try:
        packet = getattr(getattr(torch.ops, namespace), op_name)
        if overload:
            getattr(packet, overload)
    except (AttributeError, RuntimeError):
        raise ExportError(f"torch_executed_ops names {name!r}, which is not a registered operator") from None


def node_op_names(target: Any) -> tuple[str, str] | None:
    """(``ns::op.overload``, ``ns::op``) of an FX call_function target, None for non-operators."""
    schema = getattr(target, "_schema", None)
    if schema is None or not hasattr(target, "_overloadname"):
        return None
    return f"{schema.name}.{target._overloadname}", schema.name


def delegate_compile_specs(device: str, budget: int | None, extra: tuple[tuple[str, bytes], ...] = (),
                           quantization: str = "", layers: str = "", weight_bytes: int = 0
                           ) -> list[tuple[str, bytes]]:
    """An engine delegate's compile specs, in order: ``target_device``, its budget when set, its weight
    quantization (:data:`pyrt.format.weight_quant.SPEC_KEY`) when quantized, its layer group's layers and weight
    bytes (:data:`SPEC_LAYERS`, :data:`SPEC_WEIGHT_BYTES`) when cut by ``max_engine_size``, then ``extra``."""
    specs = [(SPEC_DEVICE, device.encode("ascii"))]
    if budget is not None:
        specs.append((SPEC_BUDGET, str(budget).encode("ascii")))
    if quantization:
        specs.append((wq.SPEC_KEY, quantization.encode("ascii")))
    if layers:
        specs += [(SPEC_LAYERS, layers.encode("ascii")), (SPEC_WEIGHT_BYTES, str(weight_bytes).encode("ascii"))]
    return specs + [(k, bytes(v)) for k, v in extra]
