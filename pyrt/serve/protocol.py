"""The Open Inference Protocol (KServe v2, what Triton's clients speak) over a pyrt program's methods.

Pure functions, no server: what a method declares (:class:`ModelInfo`), model
metadata, infer requests decoded from JSON or the binary tensor data extension
(``Inference-Header-Content-Length``; the JSON part is an :class:`InferBody`, read in one pass by
pydantic's parser; binary tensors become numpy views of the request body, never Python lists), and
responses encoded the same two ways (:class:`InferResponse`, a TypedDict: the hot path's JSON is
written by ``json.dumps``, whose float text the protocol's clients have always read). Every bad
request is a :class:`pyrt.errors.InputError` naming the model and the input, which the server
answers with 400.

>>> import numpy as np
>>> from pyrt.format.method_io import InputSpec
>>> info = ModelInfo("m", "forward", [InputSpec(0, "Tensor", "float32", (4, 2), True)],
...                  [OutputSpec("output0", "float32", (4, 2), True)])
>>> body = b'{"inputs": [{"name": "input0", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}'
>>> req = decode_infer(info, body, None)
>>> req.arrays[0]
array([[1., 2.]], dtype=float32)
>>> json_body, headers = encode_infer(info, req, [req.arrays[0] * 2])
>>> json.loads(json_body)["outputs"][0]["data"], headers
([2.0, 4.0], {})
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, TypedDict

import numpy as np
from pydantic import BeforeValidator, ConfigDict, StrictInt, StrictStr

from pyrt.checks import is_int
from pyrt.errors import InputError
from pyrt.format.method_io import InputSpec, check_shape, method_inputs
from pyrt.pte_reader import PteFile
from pyrt.serve.validation import Bad, Body, parse

HEADER_LENGTH = "Inference-Header-Content-Length"
VERSION = "1"
# pyrt's dtype names (ScalarType.dtype_name) -> the protocol's tensor datatypes
DATATYPES = {
    "bool": "BOOL", "uint8": "UINT8", "int8": "INT8", "int16": "INT16", "int32": "INT32", "int64": "INT64",
    "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64", "float16": "FP16", "float32": "FP32",
    "float64": "FP64", "bfloat16": "BF16",
}


@dataclass(frozen=True)
class OutputSpec:
    """One declared output tensor: pyrt dtype name and sizes (upper bounds when ``dynamic``)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    dynamic: bool


@dataclass(frozen=True)
class ModelInfo:
    """A served model: one method of a program, its declared inputs and outputs."""

    name: str
    method: str
    inputs: list[InputSpec]
    outputs: list[OutputSpec]

    @property
    def tensors(self) -> list[InputSpec]:
        """The inputs a client sends (scalars keep the value the program was exported with)."""
        return [s for s in self.inputs if s.kind == "Tensor"]

    @property
    def batch_bound(self) -> int:
        """Rows a batched run may hold: the smallest leading-dim bound, 0 when the method cannot batch.

        A method batches when every input and output is a dynamic tensor of rank >= 1 (the leading
        dim is the batch); a static method runs requests one at a time.
        """
        tensors = self.tensors
        if not tensors or len(tensors) != len(self.inputs) or not self.outputs:
            return 0
        specs: list[Any] = [*tensors, *self.outputs]
        if not all(s.dynamic and s.shape for s in specs):
            return 0
        return min(s.shape[0] for s in tensors)


def input_name(spec: InputSpec) -> str:
    return f"input{spec.position}"


def datatype(dtype: str | None, where: str) -> str:
    """The protocol datatype of a pyrt dtype name (InputError naming ``where`` when there is none)."""
    dt = DATATYPES.get(dtype or "")
    if dt is None:
        raise InputError(f"{where}: dtype {dtype!r} has no Open Inference Protocol datatype")
    return dt


def method_outputs(pte: PteFile, method: str) -> list[OutputSpec]:
    """The declared tensor outputs of ``method``, named ``output0``, ``output1``, ..."""
    plan = {p.name: p for p in pte.program.execution_plan}[method]
    out: list[OutputSpec] = []
    for i in plan.outputs:
        v = plan.values[i]
        if v.kind == "Tensor":
            t = v.tensor
            out.append(OutputSpec(f"output{len(out)}", t.scalar_type.dtype_name, tuple(t.sizes),
                                  t.shape_dynamism.name != "STATIC"))
    return out


def models_of(pte: PteFile, name: str) -> dict[str, ModelInfo]:
    """The models a program serves: ``name`` (forward, when it has one) and ``name.METHOD`` for each method."""
    out = {}
    for plan in pte.program.execution_plan:
        model = name if plan.name == "forward" else f"{name}.{plan.name}"
        out[model] = ModelInfo(model, plan.name, method_inputs(pte, plan.name), method_outputs(pte, plan.name))
    return out


def _shape(spec: Any) -> list[int]:
    return [-1] * len(spec.shape) if spec.dynamic else list(spec.shape)


def model_metadata(info: ModelInfo, max_batch_size: int | None = None) -> dict[str, Any]:
    """``GET /v2/models/{name}``: inputs and outputs with protocol datatypes; -1 for a dynamic dim.

    ExecuTorch records only upper bounds for a dynamic tensor, so each of its dims is -1 here;
    ``parameters.max_shape`` gives the bounds; ``parameters.max_batch_size`` the rows one batched
    run holds (0: the method runs requests one at a time).
    """
    rows = info.batch_bound if max_batch_size is None else min(info.batch_bound, max_batch_size)
    where = f"model {info.name!r}"
    ins = [{"name": input_name(s), "datatype": datatype(s.dtype, where), "shape": _shape(s),
            "parameters": {"max_shape": list(s.shape)}} for s in info.tensors]
    outs = [{"name": s.name, "datatype": datatype(s.dtype, where), "shape": _shape(s),
             "parameters": {"max_shape": list(s.shape)}} for s in info.outputs]
    return {"name": info.name, "versions": [VERSION], "platform": "pyrt_executorch", "inputs": ins,
            "outputs": outs, "parameters": {"method": info.method, "max_batch_size": rows if rows > 1 else 0}}


# -- requests ---------------------------------------------------------------------------------------


@dataclass
class InferRequest:
    """A decoded infer request: one array per tensor input, in position order."""

    id: str | None
    arrays: list[np.ndarray]
    outputs: list[str] | None = None            # requested outputs (None: all)
    binary: dict[str, bool] = field(default_factory=dict)  # per requested output
    binary_default: bool = False                # parameters.binary_data_output

    @property
    def rows(self) -> int:
        return int(self.arrays[0].shape[0])


def whole_shape(value: Any) -> Any:
    if not isinstance(value, list) or not all(is_int(d, low=0) for d in value):
        raise Bad(" must be a list of whole numbers >= 0")
    return value


def if_object(value: Any) -> Any:
    """Parameters that are not an object are ignored (as the protocol's servers do)."""
    return value if isinstance(value, dict) else None


class Lenient(Body):
    """A protocol object: fields it does not name are ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class TensorParameters(Lenient):
    binary_data_size: StrictInt | None = None  # an input's bytes in the binary part
    binary_data: Any = None  # an output's: send it in the binary part (truthy)


class InputTensor(Lenient):
    name: StrictStr
    datatype: StrictStr
    shape: Annotated[list[int], BeforeValidator(whole_shape)]
    data: Any = None  # JSON values, read by numpy (never one Python object per value in pydantic)
    parameters: Annotated[TensorParameters | None, BeforeValidator(if_object)] = None


class OutputTensor(Lenient):
    name: StrictStr
    parameters: Annotated[TensorParameters | None, BeforeValidator(if_object)] = None


class RequestParameters(Lenient):
    binary_data_output: Any = None  # every output in the binary part (truthy)


class InferBody(Lenient):
    """The JSON part of an infer request."""

    id: Annotated[str | None, BeforeValidator(lambda v: v if isinstance(v, str) else None)] = None
    inputs: list[InputTensor]
    outputs: list[OutputTensor] | None = None
    parameters: Annotated[RequestParameters | None, BeforeValidator(if_object)] = None


def _split_body(body: bytes, header_length: str | None, where: str) -> tuple[InferBody, int]:
    if header_length is None:
        return parse(InferBody, body, where), len(body)
    try:
        n = int(header_length)
    except ValueError:
        n = -1
    if not 0 <= n <= len(body):
        raise InputError(f"{where}: {HEADER_LENGTH} {header_length!r} is not a length within the "
                         f"{len(body)}-byte body")
    return parse(InferBody, body[:n], where), n


def decode_infer(info: ModelInfo, body: bytes, header_length: str | None) -> InferRequest:
    """Decode ``POST /v2/models/{name}/infer`` (JSON, or JSON + binary tensors) against ``info``."""
    where = f"model {info.name!r}"
    doc, cursor = _split_body(body, header_length, where)
    by_name: dict[str, InputTensor] = {}
    for item in doc.inputs:
        if item.name in by_name:
            raise InputError(f"{where}: input {item.name!r} is given twice")
        by_name[item.name] = item
    specs = {input_name(s): s for s in info.tensors}
    extra = sorted(set(by_name) - set(specs))
    if extra:
        raise InputError(f"{where}: no input {extra[0]!r}; the model takes {sorted(specs)}")
    arrays = []
    for name, spec in specs.items():
        if name not in by_name:
            raise InputError(f"{where}: input {name!r} is missing; the model takes {sorted(specs)}")
        arr, cursor = _tensor(by_name[name], spec, body, cursor, f"{where} input {name!r}")
        arrays.append(arr)
    if cursor != len(body):
        raise InputError(f"{where}: {len(body) - cursor} bytes of binary data follow the last binary input")
    req = InferRequest(doc.id, arrays)
    _requested_outputs(doc, info, req, where)
    return req


def _tensor(item: InputTensor, spec: InputSpec, body: bytes, cursor: int, where: str) -> tuple[np.ndarray, int]:
    want = datatype(spec.dtype, where)
    if item.datatype != want:
        raise InputError(f"{where}: datatype {item.datatype!r}, the model takes {want}")
    shape = item.shape
    check_shape(spec, tuple(shape), where)  # before numpy sees it: dims past its limits are ValueErrors there
    dtype = _np_dtype(spec.dtype, where)
    count = math.prod(shape)
    size = item.parameters.binary_data_size if item.parameters is not None else None
    if size is not None:
        if not 0 <= size <= len(body) - cursor:
            raise InputError(f"{where}: binary_data_size {size!r} exceeds the {len(body) - cursor} bytes left")
        if size != count * dtype.itemsize:
            raise InputError(f"{where}: {size} bytes of binary data; shape {shape} {want} needs "
                             f"{count * dtype.itemsize}")
        arr = np.frombuffer(body, dtype=dtype, count=count, offset=cursor).reshape(shape)
        cursor += size
    else:
        arr = _from_json(item.data, dtype, shape, count, where)
    check_array(spec, arr, where)
    return arr, cursor


def check_array(spec: InputSpec, x: np.ndarray, where: str) -> None:
    """InputError naming ``where`` unless ``x`` has the input's dtype and a shape within its bounds (the dtype
    message names the method's dtype; the shape checks are :func:`pyrt.format.method_io.check_shape`'s).

    >>> spec = InputSpec(0, "Tensor", "float32", (8, 3), dynamic=True)
    >>> check_array(spec, np.zeros((9, 3), np.float32), "input0")
    Traceback (most recent call last):
    ...
    pyrt.errors.InputError: input0: shape [9, 3] exceeds the upper bound [8, 3] in dimension 0
    """
    if x.dtype.name != spec.dtype:
        raise InputError(f"{where}: got {x.dtype.name}{list(x.shape)}, the method takes {spec.dtype}")
    check_shape(spec, tuple(x.shape), where)


def _np_dtype(dtype: str | None, where: str) -> np.dtype:
    try:
        return np.dtype(dtype)
    except TypeError:
        try:
            import ml_dtypes  # noqa: PLC0415 - optional, for bfloat16

            return np.dtype(getattr(ml_dtypes, str(dtype)))
        except (ImportError, AttributeError):
            raise InputError(f"{where}: dtype {dtype!r} needs ml_dtypes (pip install ml_dtypes)") from None


def _from_json(data: Any, dtype: np.dtype, shape: list[int], count: int, where: str) -> np.ndarray:
    if not isinstance(data, list):
        raise InputError(f"{where}: 'data' must be a list (or send binary_data_size)")
    try:
        arr = np.asarray(data)
        if arr.dtype.kind not in "biuf" or (dtype.kind != "b" and arr.dtype.kind == "b"):
            raise ValueError(f"values of type {arr.dtype.name}")
        if dtype.kind in "iu" and arr.size:
            _check_integers(arr, dtype)
        with np.errstate(over="raise", invalid="raise"):  # 1e300 into float32: an error, not inf
            out = arr.astype(dtype).reshape(-1)
    except (ValueError, TypeError, OverflowError, FloatingPointError) as exc:
        raise InputError(f"{where}: 'data' is not a list of {dtype.name} numbers ({exc})") from None
    if out.size != count:
        raise InputError(f"{where}: {out.size} values in 'data'; shape {shape} needs {count}")
    return out.reshape(shape)


def _check_integers(arr: np.ndarray, dtype: np.dtype) -> None:
    """ValueError unless every value of ``arr`` is a whole number that ``dtype`` holds (no wrapping, no truncation)."""
    if arr.dtype.kind == "f" and not np.all(np.isfinite(arr) & (arr == np.round(arr))):
        raise ValueError("values that are not whole numbers")
    info = np.iinfo(dtype)
    low, high = arr.min(), arr.max()
    if low < info.min or high > info.max:
        raise ValueError(f"values from {low} to {high}, outside {info.min}..{info.max}")


def _requested_outputs(doc: InferBody, info: ModelInfo, req: InferRequest, where: str) -> None:
    req.binary_default = bool(doc.parameters.binary_data_output) if doc.parameters is not None else False
    if doc.outputs is None:
        return
    names = [o.name for o in info.outputs]
    req.outputs = []
    for o in doc.outputs:
        if o.name not in names:
            raise InputError(f"{where}: no output {o.name!r}; the model has {names}")
        req.outputs.append(o.name)
        asked = o.parameters is not None and "binary_data" in o.parameters.model_fields_set
        req.binary[o.name] = bool(o.parameters.binary_data) if asked else req.binary_default  # type: ignore[union-attr]


# -- responses ---------------------------------------------------------------------------------------


class Output(TypedDict):
    name: str
    datatype: str
    shape: list[int]


class OutputEntry(Output, total=False):
    parameters: dict[str, int]  # binary_data_size, when the tensor is in the binary part
    data: list[Any]  # its values, row-major, when it is not


class ResponseHead(TypedDict):
    model_name: str
    model_version: str
    outputs: list[OutputEntry]


class InferResponse(ResponseHead, total=False):
    """The JSON part of an infer response (a TypedDict: built and written as a plain dict on the hot path)."""

    id: str  # the request's, when it had one


def encode_infer(info: ModelInfo, req: InferRequest, outputs: Sequence[np.ndarray]) -> tuple[bytes, dict[str, str]]:
    """The response body and its extra headers (``Inference-Header-Content-Length`` when binary)."""
    named = {spec.name: np.ascontiguousarray(x) for spec, x in zip(info.outputs, outputs, strict=True)}
    wanted = req.outputs if req.outputs is not None else list(named)
    entries: list[OutputEntry] = []
    blobs = []
    for name in wanted:
        x = named[name]
        entry: OutputEntry = {"name": name, "datatype": datatype(x.dtype.name, f"model {info.name!r}"),
                              "shape": list(x.shape)}
        if req.binary.get(name, req.binary_default):
            entry["parameters"] = {"binary_data_size": x.nbytes}
            blobs.append(x.reshape(-1).view(np.uint8).data)
        else:
            entry["data"] = x.reshape(-1).tolist()
        entries.append(entry)
    doc: InferResponse = {"model_name": info.name, "model_version": VERSION, "outputs": entries}
    if req.id is not None:
        doc["id"] = req.id
    head = json.dumps(doc, separators=(",", ":")).encode()
    if not blobs:
        return head, {}
    return b"".join([head, *blobs]), {HEADER_LENGTH: str(len(head))}
