"""Method inputs for the command line: what a method declares, arrays from files or drawn at random.

An input is named by its position: ``0`` or ``input0``. A ``.npz`` file fills
inputs by its keys (``input0``/``0``; ``output*`` keys are skipped) or, when
no key names a position, in its stored order. Random data: floats standard
normal, integers 0 or 1 (valid as indices), bools either; dynamic dimensions
at the file's upper bound unless a shape is given. Scalar inputs (ExecuTorch
specialises them) take the value the program was exported with.

>>> from pyrt.pte_reader import PteFile
>>> with PteFile.open("model.pte") as pte:                          # doctest: +SKIP
...     specs = method_inputs(pte, "forward")
...     given = load_files(specs, ["0=x.npy"], method="forward")
...     args = assemble(specs, given, method="forward", random=True, seed=0)
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from pyrt.errors import InputError
from pyrt.format.dtypes import scalar_type_from_name
from pyrt.format.method_io import InputSpec, check_shape, flatten, method_inputs
from pyrt.memory.layout import numpy_dtype

_NAME = re.compile(r"(?:input_?)?([0-9]+)", re.ASCII)


def position(name: str, specs: Sequence[InputSpec], method: str) -> int:
    """``"1"`` or ``"input1"`` -> 1, checked against the method's inputs."""
    m = _NAME.fullmatch(name)
    n = len(specs)
    if m is None or int(m.group(1)) >= n:
        names = ", ".join(str(s.position) for s in specs) or "none"
        raise InputError(f"method {method!r} has no input {name!r}; its inputs are {names} "
                         f"(name one by position: 0 or input0)")
    return int(m.group(1))


def split_assignment(text: str) -> tuple[str | None, str]:
    """``"0=x.npy"`` -> ("0", "x.npy"); ``"x.npy"`` -> (None, "x.npy") (the name must look like one)."""
    name, sep, rest = text.partition("=")
    if sep and _NAME.fullmatch(name):
        return name, rest
    return None, text


def parse_shapes(items: Iterable[tuple[str, tuple[int, ...]]], specs: Sequence[InputSpec],
                 method: str) -> dict[int, tuple[int, ...]]:
    """``[("0", (1, 3, 224, 224))]`` -> {0: (1, 3, 224, 224)}, each checked against the input's bounds."""
    out: dict[int, tuple[int, ...]] = {}
    for name, shape in items:
        pos = position(name, specs, method)
        spec = specs[pos]
        where = f"--shape {name}={','.join(map(str, shape))}"
        if spec.kind != "Tensor":
            raise InputError(f"{where}: method {method!r} input {pos} is a {spec.kind}, not a tensor")
        check_shape(spec, shape, f"{where} (method {method!r} input {pos}, {spec.describe()})")
        out[pos] = shape
    return out


def parse_shape_arg(text: str) -> tuple[str, tuple[int, ...]]:
    """``"0=1,3,224,224"`` (or ``1x3x224x224``) -> ("0", (1, 3, 224, 224)); ValueError when malformed."""
    name, dims = split_assignment(text)
    if name is None:
        raise ValueError(f"expected NAME=D0,D1,... with NAME an input position (0 or input0), got {text!r}")
    try:
        return name, tuple(int(d) for d in dims.replace("x", ",").split(",") if d.strip())
    except ValueError:
        raise ValueError(f"dimensions must be integers, got {text!r}") from None


def load_files(specs: Sequence[InputSpec], items: Iterable[str], *, method: str) -> dict[int, Any]:
    """Arrays from ``[NAME=]FILE.npy|.npz`` arguments, by position (unnamed ones fill the next free)."""
    given: dict[int, Any] = {}
    for text in items:
        name, path = split_assignment(text)
        arrays = _read(path)
        if name is not None:
            if len(arrays) != 1:
                raise InputError(f"--input {text!r}: {path} holds {len(arrays)} arrays; name one input per file")
            given[position(name, specs, method)] = next(iter(arrays.values()))
            continue
        keyed = {k: a for k, a in arrays.items() if _NAME.fullmatch(k)}
        if keyed:
            for k, a in keyed.items():
                given[position(k, specs, method)] = a
            continue
        for a in (a for k, a in arrays.items() if not k.startswith("output")):
            free = [s.position for s in specs if s.position not in given and s.kind == "Tensor"]
            if not free:
                raise InputError(f"--input {text!r}: more arrays than method {method!r} has tensor inputs "
                                 f"({len(specs)} inputs)")
            given[free[0]] = a
    return given


def _read(path: str) -> dict[str, Any]:
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise InputError(f"--input {path!r}: cannot read it as .npy/.npz: {exc}") from None
    if isinstance(data, np.ndarray):
        return {"": data}
    with data:
        return {k: data[k] for k in data.files}


def random_array(spec: InputSpec, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Random data for a tensor input: floats standard normal, integers 0 or 1, bools either."""
    dtype = numpy_dtype(scalar_type_from_name(spec.dtype or ""))
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    if dtype.kind in "iu":
        return rng.integers(0, 2, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def assemble(specs: Sequence[InputSpec], given: dict[int, Any], *, method: str, random: bool = False,
             seed: int | None = None, shapes: dict[int, tuple[int, ...]] | None = None,
             origins: dict[int, str] | None = None) -> list[Any]:
    """Positional arguments for the method: given arrays (checked), random ones, exported scalars.

    ``origins`` (if given) receives where each input came from: "file", "random" or "constant".
    """
    shapes = shapes or {}
    rng = np.random.default_rng(seed)
    out: list[Any] = []
    for spec in specs:
        pos = spec.position
        where = f"method {method!r} input {pos} ({spec.describe()})"
        if spec.kind == "TensorList":
            raise InputError(f"{where}: tensor-list inputs are not supported from the command line")
        if pos in given:
            x = given[pos]
            if spec.kind == "Tensor":
                check_array(spec, np.asarray(x), where)
            else:
                x = np.asarray(x).item() if np.ndim(x) == 0 else x
            origin = "file"
        elif spec.kind != "Tensor":
            x, origin = spec.value, "constant"
        elif random:
            x, origin = random_array(spec, shapes.get(pos, spec.shape), rng), "random"
        else:
            raise InputError(f"{where} was not given: pass --input {pos}=FILE.npy or --random")
        if origins is not None:
            origins[pos] = origin
        out.append(x)
    return out


def check_array(spec: InputSpec, x: np.ndarray, where: str) -> None:
    """InputError unless ``x`` has the input's dtype and a shape within its bounds."""
    if x.dtype.name != spec.dtype:
        raise InputError(f"{where}: got {x.dtype.name}{list(x.shape)}; convert it, e.g. x.astype({spec.dtype!r})")
    check_shape(spec, tuple(x.shape), where)


def summarize(x: Any) -> dict[str, Any]:
    """dtype, shape and statistics of an output (finite values only; counts of nan and inf)."""
    if not isinstance(x, np.ndarray):
        return {"kind": type(x).__name__, "value": x if isinstance(x, (bool, int, float, str)) or x is None
                else repr(x)}
    out: dict[str, Any] = {"kind": "Tensor", "dtype": x.dtype.name, "shape": list(x.shape)}
    data = x.astype(np.float64) if x.dtype.kind in "biuf" else None
    if data is None or data.size == 0:
        return {**out, "min": None, "max": None, "mean": None, "std": None, "nan": 0, "inf": 0}
    finite = data[np.isfinite(data)]
    stats = {"min": None, "max": None, "mean": None, "std": None} if finite.size == 0 else {
        "min": float(finite.min()), "max": float(finite.max()), "mean": float(finite.mean()),
        "std": float(finite.std())}
    return {**out, **stats, "nan": int(np.isnan(data).sum()), "inf": int(np.isinf(data).sum())}


__all__ = ["InputSpec", "method_inputs", "load_files", "parse_shapes", "parse_shape_arg", "assemble", "check_array",
           "random_array", "flatten", "summarize", "position", "split_assignment"]
