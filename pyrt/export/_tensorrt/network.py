"""The TensorRT network of an engine build: a strongly typed network, the ONNX parse into it
(from the file, or over the module's own weights in place), and its I/O bindings.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyrt.errors import ExportError
from pyrt.export._tensorrt.flavour import Session, logged_errors
from pyrt.format.trt_blob import IOBinding

# TensorRT DataType member name -> pyrt dtype string (IOBinding.dtype).
_DTYPES = {
    "FLOAT": "float32", "HALF": "float16", "BF16": "bfloat16", "INT8": "int8", "INT32": "int32",
    "INT64": "int64", "BOOL": "bool", "UINT8": "uint8", "FP8": "float8_e4m3fn",
}


def strongly_typed_network(session: Session) -> Any:
    """TensorRT 11 / RTX: create_network(0) is strongly typed; TensorRT 10 needs the flag."""
    trt, builder = session.trt, session.builder
    flag = getattr(getattr(trt, "NetworkDefinitionCreationFlag", None), "STRONGLY_TYPED", None)
    network = builder.create_network(0)
    if network is not None and (flag is None or network.get_flag(flag)):
        return network
    if flag is not None:
        network = builder.create_network(1 << int(flag))
        if network is not None and network.get_flag(flag):
            return network
    raise ExportError(f"{session.name} could not create a strongly typed network{logged_errors(session.logger)}")


def parse(session: Session, parser: Any, network: Any, path: Path) -> None:
    _check_parsed(session, parser, network, path, parser.parse_from_file(str(path)))


def parse_over_module_weights(session: Session, parser: Any, network: Any, path: Path,
                               weights: Mapping[str, Any]) -> None:
    """Parse with the module's own tensors as the network's weights (no parser copy of them).

    ``parse_from_file`` reads every external initializer into memory the parser owns: a
    second copy of the model's weights. Instead the model (weights external, so small) is
    loaded with ``load_model_proto`` and each initializer that is a torch tensor of the
    exported module is handed over by address with ``load_initializer``; the tensors
    outlive the parser (the caller holds them until the build returns).
    """
    if not parser.load_model_proto(path.read_bytes(), str(path)):
        _check_parsed(session, parser, network, path, False)
    for name, tensor in weights.items():
        if not parser.load_initializer(name, tensor.data_ptr(), tensor.nbytes):
            raise ExportError(f"{session.name} OnnxParser refused initializer {name!r} ({tensor.nbytes} bytes of "
                              f"{tensor.dtype}){logged_errors(session.logger)}")
    _check_parsed(session, parser, network, path, parser.parse_model_proto())


def _check_parsed(session: Session, parser: Any, network: Any, path: Path, ok: bool) -> None:
    if ok and parser.num_errors == 0:
        if network.num_outputs == 0:  # protobuf decoding is lenient: junk bytes parse as an empty graph
            raise ExportError(f"{session.name} OnnxParser found no outputs in {str(path)!r}: not an ONNX "
                              "model, or one that computes nothing")
        return
    problems = [_parser_error(parser.get_error(i)) for i in range(parser.num_errors)]
    raise ExportError(f"{session.name} OnnxParser rejected {path.name}: "
                      + ("; ".join(problems) or "no parser error recorded") + logged_errors(session.logger))


def _parser_error(err: Any) -> str:
    node, name, op = err.node(), err.node_name(), err.node_operator()
    where = f"node {node} {name!r} (op {op})" if op or name else f"node {node}"
    return f"{where}: {getattr(err.code(), 'name', err.code())}: {err.desc()}"


def bindings(network: Any, inputs: bool) -> list[IOBinding]:
    count = network.num_inputs if inputs else network.num_outputs
    get = network.get_input if inputs else network.get_output
    return [_binding(get(i), inputs) for i in range(count)]


def _binding(tensor: Any, is_input: bool) -> IOBinding:
    kind = getattr(tensor.dtype, "name", str(tensor.dtype))
    if kind not in _DTYPES:
        raise ExportError(f"engine {'input' if is_input else 'output'} {tensor.name!r} has TensorRT dtype {kind}, "
                          f"which pyrt cannot bind (supported: {', '.join(_DTYPES)})")
    return IOBinding(tensor.name, _DTYPES[kind], tuple(int(d) for d in tensor.shape), is_input)
