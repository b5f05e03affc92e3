"""ONNX models for the GPU check, written with ``onnx.helper`` and numpy only (no torch).

The same function makes the small model built into engines on the CPU here and the
large weight-streaming model generated on the GPU machine (weights too big to carry).

>>> import tempfile, pathlib
>>> p = mlp_onnx(pathlib.Path(tempfile.mkdtemp()) / "m.onnx", layers=2, width=8, batch=3)
>>> p.name
'm.onnx'
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def mlp_weights(layers: int, width: int, dtype: str, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per layer (W [width, width], b [width]), scaled so activations stay O(1)."""
    rng = np.random.default_rng(seed)
    scale = 1.0 / np.sqrt(width)
    return [((rng.standard_normal((width, width), dtype=np.float32) * scale).astype(dtype),
             (rng.standard_normal(width, dtype=np.float32) * 0.1).astype(dtype)) for _ in range(layers)]


def mlp_reference(x: np.ndarray, weights: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """``relu(x @ W + b)`` per layer, the last without relu, in float64."""
    h = x.astype(np.float64)
    for i, (w, b) in enumerate(weights):
        h = h @ w.astype(np.float64) + b.astype(np.float64)
        if i < len(weights) - 1:
            h = np.maximum(h, 0.0)
    return h


def mlp_onnx(path: Path, *, layers: int, width: int, batch: int, dtype: str = "float32", seed: int = 0,
             external_data: bool = False) -> Path:
    """Write an MLP ``input_0 [batch, width] -> output_0 [batch, width]`` to ``path``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    elem = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}[dtype]
    nodes, inits = [], []
    h = "input_0"
    for i, (w, b) in enumerate(mlp_weights(layers, width, dtype, seed)):
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        last = i == layers - 1
        nodes += [helper.make_node("MatMul", [h, f"w{i}"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], ["output_0" if last else f"a{i}"])]
        if not last:
            nodes.append(helper.make_node("Relu", [f"a{i}"], [f"h{i}"]))
            h = f"h{i}"
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("input_0", elem, [batch, width])],
                              [helper.make_tensor_value_info("output_0", elem, [batch, width])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    if external_data:
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=path.name + ".data", size_threshold=1024)
    else:
        onnx.save_model(model, str(path))
    return path
