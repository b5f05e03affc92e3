"""Peak host RSS of exporting a >= 1 GiB TensorRT-RTX engine on the CPU: streamed build vs in memory.

One ``to_pte(model, ..., builder="tensorrt_rtx")`` per fresh subprocess, pinned to one CPU
and one thread (``sched_setaffinity``, ``torch.set_num_threads(1)``, ``OMP_NUM_THREADS=1``).
The model is ``layers`` bias-free float16 ``Linear(width, width)`` layers with random weights,
all resident before the export starts (they are "the model's own weights"), so the engine
is about ``layers * width**2 * 2`` bytes. Routes:

* ``stream``: pyrt as it is: ``build_serialized_network_to_stream`` writes the engine to its
  spill file in pieces, and the ONNX parser reads the module's tensors in place;
* ``memory``: the same, but the builder returns the engine whole (``build_serialized_network``,
  what a flavour without the stream writer does; forced by patching ``trt_builder.can_stream``);
* ``before``: pyrt before issue 13: in memory, the parser reading its own copy of the weights
  from the ONNX external-data file, and onnxscript folding each weight's transpose into a copy;
* ``floor``: no pyrt, no ONNX: the same weights as numpy arrays referenced by a TensorRT-RTX
  network (``trt.Weights``) built with ``build_serialized_network_to_stream`` to a file:
  what TensorRT-RTX itself holds while it builds.

Peak = the child's ``ru_maxrss``; base = RSS once the model exists and everything is
imported (the peak is reset there through ``/proc/self/clear_refs``); growth = peak - base.

    python benchmarks/bench_build_memory.py                 # width 8192, 8 layers: 1 GiB engine
    python benchmarks/bench_build_memory.py --width 4096 --layers 4 --no-write
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from _common import machine, markdown_table, peak_rss_mib, reset_peak, rss_mib, run_json, stream_build, write_results

ROUTES = ("stream", "memory", "before", "floor")
TARGET = 0.5  # issue 13: growth <= 0.5 x the largest engine (the model's own weights are in the base)


def _pin() -> None:
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def child_pyrt(route: str, out: str, width: int, layers: int) -> dict:
    import executorch.exir  # noqa: F401  (everything export imports lazily, loaded before the base)
    import onnxscript  # noqa: F401
    import tensorrt_rtx
    import torch
    from torch import nn

    from pyrt.device.tensorrt_seam import shared_logger
    from pyrt.export import to_pte, trt_builder
    from pyrt.export._tensorrt import torch_onnx

    torch.set_num_threads(1)
    tensorrt_rtx.Builder(shared_logger(tensorrt_rtx))  # loads TensorRT-RTX's libraries before the base

    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(width, width, bias=False, dtype=torch.float16)
                                        for _ in range(layers))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = layer(x)
            return x

    torch.manual_seed(0)
    with torch.no_grad():
        model = Stack().eval()
    if route in ("memory", "before"):
        trt_builder.can_stream = lambda builder: False  # type: ignore[assignment]
    if route == "before":
        torch_onnx.module_initializers = lambda program: {}  # type: ignore[assignment]
        torch_onnx.optimize_keeping_weights = lambda program: program.optimize()  # type: ignore[assignment]
    example = (torch.zeros(4, width, dtype=torch.float16),)
    base, reset = rss_mib(), reset_peak()
    start = time.perf_counter()
    summary = to_pte(model, out, example, builder="tensorrt_rtx", progress=False)
    wall = time.perf_counter() - start
    (engine,) = summary.engines
    return {"route": route, "engine_route": engine.route, "engine": engine.size, "file_size": summary.file_size,
            "wall_s": wall, "peak_mib": peak_rss_mib(), "base_mib": base, "reset": reset}


def child_floor(out: str, width: int, layers: int) -> dict:
    import numpy as np
    import tensorrt_rtx as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)  # loads the libraries before the base, as for the pyrt routes
    network = builder.create_network(0)
    x = network.add_input("x", trt.float16, (4, width))
    weights = []
    for i in range(layers):
        w = (np.random.default_rng(i).standard_normal((width, width), dtype=np.float32) * 0.01).astype(np.float16)
        weights.append(w)
        const = network.add_constant((width, width), trt.Weights(w))
        x = network.add_matrix_multiply(x, trt.MatrixOperation.NONE, const.get_output(0),
                                        trt.MatrixOperation.NONE).get_output(0)
    network.mark_output(x)
    config = builder.create_builder_config()
    return {"route": "floor", "engine_route": "stream", **stream_build(trt, builder, network, config, out)}


def table(rows: list[dict]) -> str:
    head = ["route", "engine", "wall time", "base RSS (model + imports)", "peak RSS", "growth", "growth / engine"]
    body = [[r["route"], f"{r['engine'] / (1 << 30):.3f} GiB", f"{r['wall_s']:.1f} s", f"{r['base_mib']:,.0f} MiB",
             f"{r['peak_mib']:,.0f} MiB", f"{r['peak_mib'] - r['base_mib']:,.0f} MiB",
             f"{(r['peak_mib'] - r['base_mib']) * (1 << 20) / r['engine']:.2f}x"] for r in rows]
    return markdown_table(head, body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=8192)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--routes", nargs="+", choices=ROUTES, default=list(ROUTES))
    parser.add_argument("--no-write", action="store_true", help="do not update benchmarks/RESULTS.md")
    parser.add_argument("--child", choices=ROUTES, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _pin()
        result = (child_floor(args.out, args.width, args.layers) if args.child == "floor"
                  else child_pyrt(args.child, args.out, args.width, args.layers))
        print(json.dumps(result))
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-build-") as tmp:
        for route in args.routes:
            out = Path(tmp) / f"{route}.out"
            cmd = [sys.executable, __file__, "--child", route, "--out", str(out),
                   "--width", str(args.width), "--layers", str(args.layers)]
            rows.append(run_json(cmd, f"{route} run"))
            print(json.dumps(rows[-1]), flush=True)
            out.unlink(missing_ok=True)
    stream = next((r for r in rows if r["route"] == "stream"), None)
    verdict = ""
    if stream is not None:
        ratio = (stream["peak_mib"] - stream["base_mib"]) * (1 << 20) / stream["engine"]
        verdict = (f"Target (issue 13): export peak <= the model's own weights + {TARGET}x the largest engine, "
                   f"i.e. growth <= {TARGET}x: {'met' if ratio <= TARGET else 'NOT met'} ({ratio:.2f}x).")
    flags = "" if (args.width, args.layers) == (8192, 8) else f" --width {args.width} --layers {args.layers}"
    text = (f"### Export peak RSS with TensorRT-RTX: a {args.layers} x {args.width}² float16 model\n\n"
            f"Command: `PYTHONPATH=$PWD python benchmarks/bench_build_memory.py{flags}` ({machine()}; TensorRT-RTX "
            "builds on the CPU; each route one fresh subprocess pinned to one CPU and one thread). Base = RSS with "
            "the model's random float16 weights resident and everything imported; growth = `ru_maxrss` - base "
            "(peak reset at the base through `/proc/self/clear_refs`). Routes are described in the script's "
            "docstring; `floor` is TensorRT-RTX alone on the same weights, without pyrt or ONNX.\n\n"
            + table(rows) + "\n\n" + verdict)
    print(text)
    if not args.no_write:
        write_results("bench_build_memory", "Export", text)


if __name__ == "__main__":
    main()
