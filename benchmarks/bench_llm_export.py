"""Exporting real-size LLMs from a sharded checkpoint through ``pyrt export``: wall time, peak RSS, growth / engine,
beside TensorRT-RTX alone on the same weights (the ``floor`` route).

Each config is a random float16 Llama (vocabulary 32,000, 16 heads, 4 KV heads, MLP 4x hidden),
saved first as a sharded safetensors checkpoint (``save_pretrained(max_shard_size=...)``) in a
fresh process. Then, each in a fresh process pinned to one CPU and one thread
(``sched_setaffinity``, ``OMP_NUM_THREADS=1``, ``torch.set_num_threads(1)``):

* ``pyrt``: ``pyrt export CKPT -o m.pte --builder tensorrt_rtx --weight-streaming --max-seq-len 1024
  --max-batch-size 4`` (the command line's ``main``, in process), one engine of every weight;
* ``groups``: the same with ``--max-engine-size SIZE`` (``--max-engine-size``, default 64MiB): layer-group
  engines, each built, streamed into the .pte and released before the next; its table compares the anonymous
  peak (RssAnon of the process tree, sampled every 20 ms) across depths at that one size;
* ``floor``: no pyrt, no torch.export, no ONNX: a TensorRT-RTX network whose constants are the
  checkpoint's own memory-mapped tensors (each weight a matrix product on an input, reduced and
  summed), built with weight streaming by ``build_serialized_network_to_stream`` to a file: what
  TensorRT-RTX itself holds to build an engine of those weights.

Base = RSS once everything is imported and before a weight is touched (the peak is reset there
through ``/proc/self/clear_refs``); peak = ``ru_maxrss``; growth = peak - base. The checkpoint's pages
count in RSS once read (file-backed, the same pages as the page cache), so growth includes the
checkpoint's bytes on both routes; "beyond the checkpoint" subtracts them.

    python benchmarks/bench_llm_export.py                          # 24 and 48 layers (hidden 1024), 24 x 2048
    python benchmarks/bench_llm_export.py --configs 24x1024 --no-write
    python benchmarks/bench_llm_export.py --configs 12x512 48x512 --routes pyrt groups --max-engine-size 64MiB
    python benchmarks/bench_llm_export.py --configs 7b --routes groups --max-engine-size 1GiB --builder reference \
        --quantize int4            # Llama-2-7B's shape; then 13B / 34B / 70B on paper from it (paper_table)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from _common import markdown_table, peak_rss_mib, reset_peak, rss_mib, run_json, stream_build, write_results

CONFIGS = ("24x1024", "48x1024", "24x2048")  # layers x hidden
ROUTES = ("pyrt", "floor", "groups")
DEFAULT_ROUTES = ("pyrt", "floor")
DEFAULT_ENGINE_SIZE = "64MiB"
EXPORT_ARGS = ["--weight-streaming", "--max-seq-len", "1024", "--max-batch-size", "4"]
SHARD = "2GB"


def _pin() -> None:
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


# named shapes: layers, hidden, MLP, heads, KV heads (Llama-2-7B's, Llama-2-13B's, CodeLlama-34B's, Llama-2-70B's)
SHAPES = {"7b": (32, 4096, 11008, 32, 32), "13b": (40, 5120, 13824, 40, 40), "34b": (48, 8192, 22016, 64, 8),
          "70b": (80, 8192, 28672, 64, 8)}
VOCAB = 32000
PAPER = ("7b", "13b", "34b", "70b")  # the shapes the on-paper table plans


def shape(config: str) -> tuple[int, int, int, int, int]:
    """(layers, hidden, MLP, heads, KV heads) of ``config``: a name of :data:`SHAPES`, or ``LAYERSxHIDDEN`` (MLP 4x
    hidden, 16 heads, 4 KV heads)."""
    if config in SHAPES:
        return SHAPES[config]
    layers, hidden = (int(x) for x in config.split("x"))
    return layers, hidden, 4 * hidden, 16, 4


def child_checkpoint(config: str, out: str) -> dict:
    """Save a random float16 Llama of ``config`` as a sharded checkpoint (its own process: its memory goes).

    Named shapes (7B) are written shard by shard, each tensor drawn (normal, std 0.02) as its shard is written, so
    no more than one shard is ever in memory; the others are ``save_pretrained`` of a random-init model."""
    import torch
    import transformers as tf

    layers, hidden, mlp, heads, kv = shape(config)
    cfg = tf.LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=2048,
                         bos_token_id=1, eos_token_id=2, torch_dtype="float16")
    torch.manual_seed(0)
    if config in SHAPES:
        params = _write_shards(cfg, Path(out))
    else:
        torch.set_default_dtype(torch.float16)
        model = tf.LlamaForCausalLM(cfg)
        model.save_pretrained(out, max_shard_size=SHARD)
        params = sum(p.numel() for p in model.parameters())
    return {"params": params, "bytes": sum(f.stat().st_size for f in Path(out).glob("*.safetensors")),
            "shards": len(list(Path(out).glob("*.safetensors")))}


def _write_shards(cfg: object, out: Path, shard_bytes: int = 2 * 10**9) -> int:
    """A checkpoint of ``cfg`` written one shard at a time (safetensors + its index); returns the parameters."""
    import torch
    import transformers as tf
    from safetensors.torch import save_file

    with torch.device("meta"):
        names = [(n, tuple(t.shape)) for n, t in tf.LlamaForCausalLM(cfg).state_dict().items()]
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, dims in names:
        nbytes = 2 * int(torch.Size(dims).numel())
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, dims))
        size += nbytes
    out.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(out)  # type: ignore[attr-defined]
    weight_map, total = {}, 0
    for k, members in enumerate(shards, 1):
        file = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        tensors = {n: (torch.randn(d, dtype=torch.float32) * 0.02).to(torch.float16) if not n.endswith("norm.weight")
                   else torch.ones(d, dtype=torch.float16) for n, d in members}
        save_file(tensors, str(out / file), metadata={"format": "pt"})
        for n, t in tensors.items():
            weight_map[n] = file
            total += t.numel()
        del tensors
    index = {"metadata": {"total_size": 2 * total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return total


class AnonPeak:
    """The highest RssAnon (anonymous resident memory: not the checkpoint's file-backed pages) of this process
    and its children, sampled every ``every`` seconds on a thread, from /proc."""

    def __init__(self, every: float = 0.02) -> None:
        self.every, self.peak, self._stop = every, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> AnonPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def sample(self) -> None:
        self.peak = max(self.peak, sum(_anon_bytes(pid) for pid in _tree(os.getpid())))


def _tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            try:
                todo.extend(int(c) for c in task.read_text().split())
            except OSError:
                pass
    return out


def _anon_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def child_pyrt(ckpt: str, out: str, engine_size: str | None = None, builder: str = "tensorrt_rtx",
               quantize: str | None = None) -> dict:
    import executorch.exir  # noqa: F401  (what export imports lazily, loaded before the base)
    import onnxscript  # noqa: F401
    import torch
    import transformers  # noqa: F401

    from pyrt.device.tensorrt_seam import shared_logger
    from pyrt.export import checkpoint  # noqa: F401
    from pyrt.tools.cli import main

    torch.set_num_threads(1)
    if builder == "tensorrt_rtx":
        import tensorrt_rtx

        tensorrt_rtx.Builder(shared_logger(tensorrt_rtx))  # loads TensorRT-RTX's libraries before the base
    builds = _BuildTimes()
    logging.getLogger("pyrt.export").addHandler(builds)
    logging.getLogger("pyrt.export").setLevel(logging.INFO)
    base, reset = rss_mib(), reset_peak()
    anon_base = _anon_bytes(os.getpid())
    start = time.perf_counter()
    summary = Path(out).with_suffix(".json")
    sized = [] if engine_size is None else ["--max-engine-size", engine_size]
    sized += [] if quantize is None else ["--quantize", quantize]
    with open(summary, "w") as fh, _stdout_to(fh), AnonPeak() as anon:
        status = main(["export", ckpt, "-o", out, "--builder", builder, *EXPORT_ARGS, *sized, "--no-progress",
                       "--json"])
    wall = time.perf_counter() - start
    if status != 0:
        raise SystemExit(f"pyrt export exited {status}")
    data = json.loads(summary.read_text())
    return {"route": "pyrt" if engine_size is None else "groups", "engine": max(e["size"] for e in data["engines"]),
            "engines": len(data["engines"]), "file_size": data["file_size"], "wall_s": wall,
            "peak_mib": peak_rss_mib(), "base_mib": base, "reset": reset, "stages": data["stages"],
            "build_s": sum(builds.seconds), "anon_peak": anon.peak, "anon_base": anon_base,
            "grouping": data.get("grouping", ""), "weights": quantize or "float16"}


class _BuildTimes(logging.Handler):
    """The seconds of each TensorRT build call, from pyrt's log ("tensorrt_rtx engine build took 4.91 s")."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seconds: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        match = re.search(r"engine build took ([0-9.]+) s", record.getMessage())
        if match:
            self.seconds.append(float(match[1]))


class _stdout_to:
    """Point fd 1 at ``fh`` inside the block (the command prints its JSON there)."""

    def __init__(self, fh: object) -> None:
        self.fh = fh

    def __enter__(self) -> None:
        sys.stdout.flush()
        self.saved = os.dup(1)
        os.dup2(self.fh.fileno(), 1)  # type: ignore[attr-defined]

    def __exit__(self, *exc: object) -> None:
        sys.stdout.flush()
        os.dup2(self.saved, 1)
        os.close(self.saved)


def child_floor(ckpt: str, out: str) -> dict:
    import tensorrt_rtx as trt
    from safetensors import safe_open

    builder = trt.Builder(trt.Logger(trt.Logger.WARNING))
    network = builder.create_network(0)
    handles = [safe_open(str(p), framework="pt") for p in sorted(Path(ckpt).glob("*.safetensors"))]
    tensors = [h.get_tensor(name) for h in handles for name in h.keys()]  # memory-mapped, not read yet
    inputs: dict[int, object] = {}
    total = None
    for t in (t for t in tensors if t.dim() == 2):
        rows, cols = t.shape
        if cols not in inputs:
            inputs[cols] = network.add_input(f"x{cols}", trt.float16, (4, cols))
        const = network.add_constant((rows, cols), trt.Weights(trt.float16, t.data_ptr(), t.numel())).get_output(0)
        y = network.add_matrix_multiply(inputs[cols], trt.MatrixOperation.NONE, const,
                                        trt.MatrixOperation.TRANSPOSE).get_output(0)
        y = network.add_reduce(y, trt.ReduceOperation.SUM, 2, True).get_output(0)
        total = y if total is None else network.add_elementwise(total, y, trt.ElementWiseOperation.SUM).get_output(0)
    network.mark_output(total)
    config = builder.create_builder_config()
    config.set_flag(trt.BuilderFlag.WEIGHT_STREAMING)
    built = stream_build(trt, builder, network, config, out)
    return {"route": "floor", **built, "stages": [], "build_s": built["wall_s"]}


def _growth(r: dict) -> float:
    return (r["peak_mib"] - r["base_mib"]) * (1 << 20)


def table(rows: list[dict]) -> str:
    head = ["config", "parameters", "checkpoint", "route", "engine", "wall time", "TensorRT build", "base RSS",
            "peak RSS", "growth", "growth / engine", "beyond the checkpoint / engine"]
    body = [[r["config"], f"{r['params'] / 1e6:,.0f} M", f"{r['ckpt_bytes'] / 1e9:.2f} GB", r["route"],
             f"{r['engine'] / (1 << 20):,.0f} MiB", f"{r['wall_s']:.0f} s", f"{r['build_s']:.0f} s",
             f"{r['base_mib']:,.0f} MiB", f"{r['peak_mib']:,.0f} MiB", f"{_growth(r) / (1 << 20):,.0f} MiB",
             f"{_growth(r) / r['engine']:.2f}x", f"{(_growth(r) - r['ckpt_bytes']) / r['engine']:.2f}x"]
            for r in rows]
    return markdown_table(head, body)


def anon_table(rows: list[dict]) -> str:
    """Anonymous peaks of the ``pyrt`` / ``groups`` rows, each against the shallowest config's of its route."""
    head = ["config", "route", "engines", "largest engine", "wall time", "peak RSS", "anonymous peak",
            "vs the shallowest"]
    body = []
    for route in ("pyrt", "groups"):
        mine = [r for r in rows if r["route"] == route and r.get("anon_peak")]
        for r in mine:
            first = mine[0]["anon_peak"]
            body.append([r["config"], route, str(r["engines"]), f"{r['engine'] / (1 << 20):,.0f} MiB",
                         f"{r['wall_s']:.0f} s", f"{r['peak_mib']:,.0f} MiB",
                         f"{r['anon_peak'] / (1 << 20):,.0f} MiB", f"{r['anon_peak'] / first:.2f}x"])
    return markdown_table(head, body)


def engine_items(config: str, quantize: str | None) -> list[tuple[str, int, int]]:
    """What pyrt's cut packs for ``config``, in order: (name, float16 weight bytes: what ``--max-engine-size``
    counts, bytes in the engine: the linear weights as ``quantize`` stores them, float16 scales per default group).

    The embedding goes with layer 0 and is never quantized (it is not a matrix product's weight); the final norm
    and the LM head are the last item. Llama's linears: q and o (hidden x hidden), k and v (KV heads x head_dim
    each), gate, up and down (hidden x MLP); two norms per layer."""
    from pyrt.format.weight_quant import DEFAULT_GROUP_SIZE, Scheme

    layers, hidden, mlp, heads, kv = shape(config)
    linear = hidden * (2 * hidden + 2 * kv * (hidden // heads) + 3 * mlp)
    per_weight = 2.0 if quantize is None else Scheme(quantize, DEFAULT_GROUP_SIZE).bits / 8 + 2 / DEFAULT_GROUP_SIZE
    norms = 2 * 2 * hidden
    embed = head = VOCAB * hidden
    layer = (2 * linear + norms, int(per_weight * linear) + norms)
    items = [("layer 0", 2 * embed + layer[0], 2 * embed + layer[1])]
    items += [(f"layer {k}", *layer) for k in range(1, layers)]
    items.append(("final norm + LM head", 2 * (head + hidden), int(per_weight * head) + 2 * hidden))
    return items


def paper_table(measured: dict, engine_size: str, quantize: str | None) -> str:
    """Host memory of exporting each :data:`PAPER` shape with TensorRT-RTX at ``engine_size``, on paper from the
    measured ``measured`` row (a reference-engine export: pyrt's own pipeline and the imports): its anonymous peak
    + :data:`pyrt.export.engine_size.BUILD_FACTOR` x the largest engine (TensorRT-RTX's hold while it builds one,
    which reference engines do not have). The groups are pyrt's own cut (``plan_groups``) of
    :func:`engine_items`. Peak RSS is not planned: beyond the anonymous peak it is file-backed pages (a group's
    checkpoint pages, the .pte being written), which the kernel reclaims under pressure."""
    import warnings

    from pyrt.export._graph.layer_groups import EngineSizeWarning, plan_groups
    from pyrt.export.engine_size import BUILD_FACTOR
    from pyrt.export.options import check_engine_size

    limit = check_engine_size(engine_size, "--max-engine-size")
    assert limit is not None
    head = ["model", "weights", "parameters", "checkpoint", "engines", "largest group (float16)", "largest engine",
            "anonymous peak", "one engine (anonymous)"]
    body = []
    for config in PAPER:
        items = engine_items(config, quantize)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", EngineSizeWarning)
            groups = plan_groups([(name, f16) for name, f16, _ in items], limit)
        f16 = max(sum(items[i][1] for i in g) for g in groups)
        built = max(sum(items[i][2] for i in g) for g in groups)
        anon = measured["anon_peak"] + BUILD_FACTOR * built
        whole = measured["anon_base"] + BUILD_FACTOR * sum(b for _, _, b in items)
        params = sum(f for _, f, _ in items) // 2
        body.append([config, quantize or "float16", f"{params / 1e9:.1f} B", f"{2 * params / 1e9:.1f} GB",
                     str(len(groups)), f"{f16 / (1 << 30):.2f} GiB", f"{built / (1 << 30):.2f} GiB",
                     f"{anon / (1 << 30):.1f} GiB",
                     f"{whole / (1 << 30):.0f} GiB"])
    return markdown_table(head, body)


def stages_table(rows: list[dict]) -> str:
    names = ("load", "export", "build", "write")
    head = ["config", *names, "peak in: " + " / ".join(names)]
    body = []
    for r in (r for r in rows if r["stages"]):
        by = {s["name"]: s for s in r["stages"]}
        peaks = " / ".join(f"{(by[n]['peak_bytes'] or 0) / (1 << 30):.2f}" for n in names)
        body.append([r["config"], *(f"{by[n]['seconds']:.0f} s" for n in names), peaks + " GiB"])
    return markdown_table(head, body)


def _run(config: str, routes: list[str], tmp: Path, engine_size: str, builder: str, quantize: str | None
         ) -> list[dict]:
    ckpt = tmp / f"llama-{config}"
    made = run_json([sys.executable, __file__, "--child", "checkpoint", "--config", config, "--out", str(ckpt)],
                    f"checkpoint {config}")
    rows = []
    for route in routes:
        out = tmp / f"{config}-{route}.pte"
        row = run_json([sys.executable, __file__, "--child", route, "--ckpt", str(ckpt), "--out", str(out),
                        "--max-engine-size", engine_size, "--builder", builder,
                        *([] if quantize is None else ["--quantize", quantize])], f"{route} {config}")
        rows.append({"config": config, "params": made["params"], "ckpt_bytes": made["bytes"], **row})
        print(json.dumps(rows[-1]), flush=True)
        for leftover in (out, out.with_suffix(".json"), out.with_suffix(".tokenizer")):
            shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink(missing_ok=True)
    shutil.rmtree(ckpt)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS),
                        help="LAYERSxHIDDEN, e.g. 24x1024, or 7b (Llama-2-7B's shape)")
    parser.add_argument("--routes", nargs="+", choices=ROUTES, default=list(DEFAULT_ROUTES))
    parser.add_argument("--max-engine-size", default=DEFAULT_ENGINE_SIZE, metavar="SIZE",
                        help=f"the groups route's --max-engine-size (default {DEFAULT_ENGINE_SIZE})")
    parser.add_argument("--builder", default="tensorrt_rtx", choices=("tensorrt_rtx", "reference"),
                        help="pyrt export's --builder on the pyrt and groups routes (default tensorrt_rtx; reference: "
                        "pyrt's own engines, where TensorRT-RTX's build time is out of reach)")
    parser.add_argument("--quantize", choices=("int8", "int4"),
                        help="pyrt export's --quantize on the pyrt and groups routes (default: float16 weights)")
    parser.add_argument("--no-write", action="store_true", help="do not update benchmarks/RESULTS.md")
    parser.add_argument("--child", choices=("checkpoint", *ROUTES), help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--ckpt", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _pin()
        result = (child_checkpoint(args.config, args.out) if args.child == "checkpoint"
                  else child_pyrt(args.ckpt, args.out, None, args.builder, args.quantize) if args.child == "pyrt"
                  else child_pyrt(args.ckpt, args.out, args.max_engine_size, args.builder, args.quantize)
                  if args.child == "groups"
                  else child_floor(args.ckpt, args.out))
        print(json.dumps(result))
        return
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-llm-export-", dir=os.environ.get("BENCH_TMP")) as tmp:
        for config in args.configs:
            rows.extend(_run(config, args.routes, Path(tmp), args.max_engine_size, args.builder, args.quantize))
    flags = "" if args.configs == list(CONFIGS) else f" --configs {' '.join(args.configs)}"
    flags += "" if args.routes == list(DEFAULT_ROUTES) else f" --routes {' '.join(args.routes)}"
    flags += f" --max-engine-size {args.max_engine_size}" if "groups" in args.routes else ""
    flags += f" --builder {args.builder}" if args.builder != "tensorrt_rtx" else ""
    flags += f" --quantize {args.quantize}" if args.quantize else ""
    text = (f"### LLM export from a sharded checkpoint: `pyrt export` vs TensorRT-RTX alone\n\n"
            f"Command: `PYTHONPATH=$PWD python benchmarks/bench_llm_export.py{flags}` (x86_64, {os.cpu_count()} CPUs; "
            f"{time.strftime('%Y-%m-%d')}; each route one fresh process pinned to one CPU and one thread; random "
            "float16 Llamas, vocabulary 32,000, 16 heads, 4 KV heads, MLP 4x hidden (7b: Llama-2-7B's shape), saved in "
            "2 GB shards; pyrt: "
            f"`pyrt export CKPT -o m.pte {' '.join(EXPORT_ARGS)}`). Base = RSS with everything imported, before a "
            "weight is read; growth = `ru_maxrss` - base; \"beyond the checkpoint\" = growth less the checkpoint's "
            "bytes (its pages are in RSS once read, on both routes).\n\n" + table(rows)
            + "\n\nAnonymous memory (RssAnon of the process tree, sampled every 20 ms; the checkpoint's pages are "
            "file-backed and not in it), one engine (`pyrt`) against layer groups (`groups`: `--max-engine-size "
            f"{args.max_engine_size}`):\n\n" + anon_table(rows)
            + "\n\nStages of `pyrt export` (wall time; the highest RSS in each):\n\n" + stages_table(rows))
    measured = [r for r in rows if r["route"] == "groups" and r["config"] == "7b" and args.builder == "reference"]
    if measured:
        text += ("\n\nOn paper, from the 7b row's anonymous peak (pyrt's pipeline and the imports, reference engines) "
                 "+ 2.5x the largest engine (what TensorRT-RTX holds while it builds one; `engine_size.BUILD_FACTOR`)"
                 f", at `--max-engine-size {args.max_engine_size}`; the last column is one engine of every weight by "
                 "the same rule (its imports + 2.5x the engine):\n\n"
                 + paper_table(measured[0], args.max_engine_size, args.quantize))
    print(text)
    if not args.no_write:
        write_results("bench_llm_export", "Export", text)


if __name__ == "__main__":
    main()
