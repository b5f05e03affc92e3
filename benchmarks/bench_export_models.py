"""Export wall time and peak RSS per model: pyrt.export.to_pte vs the raw torch.onnx -> TensorRT-RTX build.

Models: pyrt.testing.archs (GPT-2, Llama, BERT, ViT, ResNet; small random-init
configs), with their dynamic batch (and sequence) dims unless ``--static``.

* raw: ``torch.onnx.export(model, dynamo=True, external_data=True, dynamic_shapes=...)``
  to a temporary directory, then TensorRT-RTX ``OnnxParser.parse_from_file`` on a
  strongly typed network, an optimization profile for the dynamic dims and
  ``build_serialized_network``; the engine is written to a file;
* pyrt: ``pyrt.export.to_pte(model, path, (x,), builder="tensorrt_rtx", dynamic_shapes=...)``,
  i.e. the engine plus ExecuTorch lowering and the .pte file.

Every run is a fresh subprocess with one thread (``OMP_NUM_THREADS=1``,
``torch.set_num_threads(1)``) that imports torch, transformers, onnx and
tensorrt_rtx and builds the model before the clock starts. It then exports twice:
``cold`` (the first export in the process, so each route's own lazy imports count:
torch.onnx's exporter for both; ExecuTorch's lowering for pyrt only when a program is
not one engine, which it writes directly) and ``warm`` (a second export
of the same model). Peak RSS is the child's ``ru_maxrss`` over the cold export
(reset to the current RSS before it through ``/proc/self/clear_refs``), plus that
baseline.

    .venv/bin/python benchmarks/bench_export_models.py               # 3 runs each, update RESULTS.md
    .venv/bin/python benchmarks/bench_export_models.py --models gpt2 --runs 1 --no-write
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _common import command_line, machine, markdown_table, peak_rss_mib, reset_peak, run_json, write_results

WALL_TARGET = 1.5  # pyrt <= 1.5x the raw route's wall time
RSS_TARGET_MIB = 50  # pyrt's peak RSS within 50 MB of the raw route's
NAMES = ("gpt2", "llama", "bert", "vit", "resnet")


def raw_export(model, x, shapes, folder: Path) -> int:  # noqa: ANN001 (torch types stay out of the parent)
    """torch.onnx.export -> TensorRT-RTX engine file; returns the engine's size."""
    import tensorrt_rtx as trt
    import torch

    onnx_path = folder / "model.onnx"
    torch.onnx.export(model, (x,), str(onnx_path), dynamo=True, external_data=True, dynamic_shapes=shapes,
                      input_names=["x"])
    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # strongly typed (TensorRT-RTX)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        raise SystemExit(f"parse failed: {[str(parser.get_error(i)) for i in range(parser.num_errors)]}")
    config = builder.create_builder_config()
    if shapes is not None:
        profile = builder.create_optimization_profile()
        low, high = (list(x.shape), list(x.shape))
        for dim, spec in shapes[0].items():
            low[dim], high[dim] = spec.min, spec.max
        profile.set_shape("x", low, list(x.shape), high)
        config.add_optimization_profile(profile)
    engine = builder.build_serialized_network(network, config)
    if engine is None:
        raise SystemExit("build_serialized_network returned None")
    (folder / "model.engine").write_bytes(memoryview(engine))
    return engine.nbytes


def pyrt_export(model, x, shapes, folder: Path) -> int:  # noqa: ANN001
    from pyrt.export import to_pte

    summary = to_pte(model, folder / "model.pte", (x,), builder="tensorrt_rtx", dynamic_shapes=shapes,
                     progress=False)
    if len(summary.engines) != 1:
        raise SystemExit(f"pyrt built {len(summary.engines)} engines:\n{summary}")
    return summary.engines[0].size


def child(route: str, name: str, dynamic: bool) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import onnx  # noqa: F401
    import tensorrt_rtx  # noqa: F401
    import torch
    import transformers  # noqa: F401

    from pyrt.testing import archs

    torch.set_num_threads(1)
    model, x = archs.build(name)
    shapes = archs.dynamic_shapes(name) if dynamic else None
    export = raw_export if route == "raw" else pyrt_export
    reset = reset_peak()
    base = peak_rss_mib()
    times = []
    for _ in range(2):  # cold, then warm
        with tempfile.TemporaryDirectory(prefix=f"bench-{route}-") as tmp:
            start = time.perf_counter()
            size = export(model, x, shapes, Path(tmp))
            times.append(time.perf_counter() - start)
        if len(times) == 1:
            peak = peak_rss_mib()
    print(json.dumps({"route": route, "model": name, "cold_s": times[0], "warm_s": times[1], "peak_mib": peak,
                      "base_mib": base, "reset": reset, "engine_bytes": size}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(NAMES), choices=NAMES)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--static", action="store_true", help="export with static shapes")
    parser.add_argument("--no-write", action="store_true", help="do not update benchmarks/RESULTS.md")
    parser.add_argument("--child", choices=("raw", "pyrt"), help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.model, not args.static)
        return
    env_note = "OMP_NUM_THREADS=1"
    os.environ["OMP_NUM_THREADS"] = "1"
    rows = []
    for name in args.models:
        runs: dict[str, list[dict]] = {"raw": [], "pyrt": []}
        for _ in range(args.runs):  # the routes alternate, so load from other processes hits both alike
            for route in ("raw", "pyrt"):
                cmd = [sys.executable, __file__, "--child", route, "--model", name]
                runs[route].append(run_json(cmd + (["--static"] if args.static else []), f"{route} {name}"))
                print(json.dumps(runs[route][-1]), flush=True)
        cells = {route: {
            "cold": statistics.median(r["cold_s"] for r in rs), "warm": statistics.median(r["warm_s"] for r in rs),
            "cold_best": min(r["cold_s"] for r in rs), "warm_best": min(r["warm_s"] for r in rs),
            "peak": max(r["peak_mib"] for r in rs), "engine": rs[0]["engine_bytes"],
        } for route, rs in runs.items()}
        rows.append((name, cells))
    text = report(rows, args, env_note)
    print(text)
    if not args.no_write:
        write_results("bench_export_models", "Export: models, pyrt vs raw TensorRT-RTX", text)


def report(rows: list, args: argparse.Namespace, env_note: str) -> str:
    head = ["model", "raw cold", "pyrt cold", "ratio", "raw warm", "pyrt warm", "ratio", "raw peak RSS",
            "pyrt peak RSS", "difference", "engine (raw / pyrt)"]
    body, ratios, met_rss = [], {"median": [], "best": []}, True
    for name, c in rows:
        raw, ours = c["raw"], c["pyrt"]
        cells = []
        for kind in ("cold", "warm"):
            median, best = ours[kind] / raw[kind], ours[kind + "_best"] / raw[kind + "_best"]
            ratios["median"].append(median)
            ratios["best"].append(best)
            cells.append((f"{raw[kind]:.2f} s ({raw[kind + '_best']:.2f})", f"{ours[kind]:.2f} s "
                          f"({ours[kind + '_best']:.2f})", f"{median:.2f}x ({best:.2f}x)"))
        diff = ours["peak"] - raw["peak"]
        met_rss &= diff <= RSS_TARGET_MIB * 1e6 / (1 << 20)
        body.append([name, *cells[0], *cells[1], f"{raw['peak']:,.0f} MiB", f"{ours['peak']:,.0f} MiB",
                     f"{diff:+,.0f} MiB", f"{raw['engine'] / 1024:,.0f} / {ours['engine'] / 1024:,.0f} KiB"])
    shapes = "static shapes" if args.static else "dynamic batch (and sequence) dims"
    verdict = {k: "met" if max(v) <= WALL_TARGET else f"NOT met (worst {max(v):.2f}x)" for k, v in ratios.items()}
    return (f"### Export per model: pyrt vs torch.onnx.export -> TensorRT-RTX ({shapes})\n\n"
            f"Command: `{command_line()}` ({machine()}; {env_note} and `torch.set_num_threads(1)` in every child; "
            f"{args.runs} fresh subprocesses per cell, raw and pyrt alternating; times are the median, best in "
            "parentheses; worst peak). cold = the first export in a process (each route's lazy imports "
            "included: torch.onnx's exporter for both; pyrt writes a one-engine program without importing "
            "ExecuTorch's lowering); warm = a second export of the "
            "same model in that process. Peak RSS = `ru_maxrss` over the cold export (reset before it) in a "
            "child that already holds torch, transformers, onnx, tensorrt_rtx and the model. pyrt's output is "
            "a whole .pte (engine + ExecuTorch program); raw writes the engine only.\n\n"
            + markdown_table(head, body)
            + f"\n\nTargets: pyrt wall time <= {WALL_TARGET}x raw, cold and warm: on medians {verdict['median']}, "
            f"on best runs {verdict['best']}; peak RSS within {RSS_TARGET_MIB} MB of raw: "
            f"{'met' if met_rss else 'NOT met'}.")


if __name__ == "__main__":
    main()
