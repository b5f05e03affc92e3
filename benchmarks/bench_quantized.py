"""Weight-only quantization (issue #37): weight bytes per decode step, decode tokens/s and accuracy.

For the small configs (``pyrt.testing.archs``' ``llm_small``, 4 layers, hidden 256, vocab 2048) of
Llama, Qwen2 and GPT-2, the same model is exported four times with
``decoder_to_pte(builder="portable")``: float32, float16, and float32 activations with ``int8`` and
``int4`` weights (``group_size=128``, the default), and ``int4`` with ``group_size=32``. Per file:

* weight bytes, measured from the file (``pyrt.inspect``'s stored tensors): all of them, and the
  linear layers' (what a decode step reads whole; the embedding gives one row per token);
* decode tokens/s of one greedy generation (``--prompt-len`` prompt, ``--new-tokens`` new), median
  of ``--samples``, pyrt (torch kernels) beside ExecuTorch's Python runtime on the same file with
  its quantized kernels loaded (``executorch.kernels.quantized``), sides interleaved, one thread;
* accuracy against the float32 model (transformers, eager): over the prompt and the float model's
  own greedy continuation, teacher-forced in one forward call, the share of positions whose top-1
  token agrees and the relative error ||logits - float32 logits|| / ||float32 logits||.

On this CPU a quantized step dequantizes every weight it reads (ExecuTorch's runtime does the same
with its ``embedding_byte`` / ``embedding_4bit`` kernels), so fewer bytes do not make it faster here:
the speed-up bytes buy is a GPU streaming its weights (docs/hardware.md, blocked without a GPU).

    python benchmarks/bench_quantized.py [--samples 3] [--models llama,qwen2,gpt2] [--no-write]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from _common import command_line, machine, markdown_table, write_results  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# label -> (model dtype, quantize, group size)
VARIANTS = {"float32": ("float32", None, 128), "float16": ("float16", None, 128), "int8": ("float32", "int8", 128),
            "int4": ("float32", "int4", 128), "int4 g32": ("float32", "int4", 32)}


def export(model: Any, variant: str, path: Path, max_len: int) -> Any:
    from pyrt.export import decoder_to_pte

    dtype, quantize, group = VARIANTS[variant]
    return decoder_to_pte(model, path, max_seq_len=max_len, builder="portable", dtype=dtype, quantize=quantize,
                          group_size=group, progress=False)


LINEAR_OPS = {"aten::mm": (1,), "aten::addmm": (2,), "aten::permute_copy": (0,), "aten::t_copy": (0,),
              "aten::linear": (1,), "quantized_decomposed::embedding_byte": (0, 1),
              "quantized_decomposed::embedding_4bit": (0, 1)}


def file_bytes(path: Path) -> tuple[int, int]:
    """(every stored weight, the linear layers' weights) in bytes, from the file: a linear layer's weight is a
    constant a matrix product (or its transpose, or ExecuTorch's dequantizing embedding kernels) reads whole;
    the token embedding, which a step reads one row of, is not one."""
    import pyrt
    from pyrt.pte_reader import KernelCall, PteFile

    tensors = {t["value"]: t["nbytes"] for t in pyrt.inspect(path)["methods"][0]["tensors"] if not t["mutable"]}
    linear: set[int] = set()
    with PteFile.open(path) as pte:
        plan = pte.program.method("forward")
        ops = [o.name for o in plan.operators]
        for chain in plan.chains:
            for ins in chain.instructions:
                if isinstance(ins, KernelCall):
                    linear |= {ins.args[k] for k in LINEAR_OPS.get(ops[ins.op_index], ()) if ins.args[k] in tensors}
    return sum(tensors.values()), sum(tensors[v] for v in linear)


def speed(path: Path, prompt: list[int], new: int, samples: int) -> tuple[float, float, list[int], float]:
    """(pyrt decode tok/s, ExecuTorch decode tok/s, pyrt's tokens, the share of ExecuTorch's tokens equal to
    them): medians, sides interleaved. The two runtimes' kernels round differently (float16 most), so a
    near-tie may go another way."""
    import executorch.kernels.quantized  # noqa: F401  (ExecuTorch's quantized kernels in its runtime)
    import torch
    from executorch.runtime import Runtime

    import pyrt

    prog = pyrt.Program(path)
    method = Runtime.get().load_program(path).load_method("forward")

    def executorch() -> tuple[list[int], float]:
        logits = method.execute([torch.tensor([prompt]), torch.arange(len(prompt))])[0]
        tokens = [int(logits[0, -1].argmax())]
        t0 = time.perf_counter()
        for i in range(new - 1):
            logits = method.execute([torch.tensor([[tokens[-1]]]), torch.tensor([len(prompt) + i])])[0]
            tokens.append(int(logits[0, -1].argmax()))
        return tokens, (new - 1) / (time.perf_counter() - t0)

    ours, theirs = [], []
    for k in range(samples + 1):  # the first round warms up
        out = pyrt.generate(prog, prompt, max_new_tokens=new, eos_ids=[], prefix_caching=False)
        et_tokens, et_rate = executorch()
        if k:
            ours.append(out.timings.decode_tokens_per_s)
            theirs.append(et_rate)
    prog.close()
    same = sum(a == b for a, b in zip(out.tokens, et_tokens, strict=True)) / len(et_tokens)
    return statistics.median(ours), statistics.median(theirs), out.tokens, same


def accuracy(path: Path, model: Any, tokens: list[int]) -> tuple[float, float]:
    """(top-1 agreement, relative logits error) against the float32 model over ``tokens``, teacher-forced."""
    import numpy as np
    import torch

    import pyrt

    with pyrt.Program(path) as prog:
        got = np.asarray(prog.run(np.array([tokens], np.int64), np.arange(len(tokens), dtype=np.int64)),
                         np.float64)[0]
    with torch.no_grad():
        want = model(torch.tensor([tokens])).logits[0].double().numpy()
    if got.shape != want.shape:
        raise SystemExit(f"{path.name}: logits {got.shape}, the model's {want.shape}")
    return float(np.mean(got.argmax(-1) == want.argmax(-1))), float(np.linalg.norm(got - want) / np.linalg.norm(want))


def rows_for(name: str, args: argparse.Namespace, directory: Path) -> list[list[str]]:
    import numpy as np

    from pyrt.testing import archs

    model = archs.causal_lm(name, variant="llm_small", layers=4)
    prompt = np.random.default_rng(0).integers(3, model.config.vocab_size, args.prompt_len).tolist()
    max_len = args.prompt_len + args.new_tokens
    measured: dict[str, tuple[int, int, float, float, float, float, float]] = {}
    continuation: list[int] = []
    for variant in VARIANTS:
        path = directory / f"{name}-{variant.replace(' ', '-')}.pte"
        export(model, variant, path, max_len)
        total, linear = file_bytes(path)
        ours, theirs, tokens, same = speed(path, prompt, args.new_tokens, args.samples)
        if variant == "float32":
            continuation = tokens
        top1, err = accuracy(path, model, prompt + continuation[:-1])
        measured[variant] = (total, linear, ours, theirs, same, top1, err)
        print(f"{name} {variant}: {linear} linear bytes, {ours:.0f} tok/s (ExecuTorch {theirs:.0f}), top-1 {top1:.3f}, "
              f"error {err:.2e}", flush=True)
    half = measured["float16"][1]
    return [[name, v, f"{t / 2**20:.2f}", f"{lin / 2**20:.2f}", f"{lin / half:.2f}x", f"{o:.0f}", f"{e:.0f}",
             f"{o / e:.2f}x", f"{same:.2f}", f"{top:.3f}", f"{err:.1e}"]
            for v, (t, lin, o, e, same, top, err) in measured.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="llama,qwen2,gpt2")
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--no-write", action="store_true", help="print the table; leave RESULTS.md alone")
    args = parser.parse_args()
    import torch
    import transformers

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="pyrt-bench-quant-") as tmp:
        body = [row for name in args.models.split(",") for row in rows_for(name, args, Path(tmp))]
    head = ["model", "weights", "file weights (MiB)", "linear weights (MiB)", "linear / float16", "pyrt decode tok/s",
            "ExecuTorch tok/s", "pyrt / ExecuTorch", "tokens as ExecuTorch's", "top-1 vs float32",
            "logits error vs float32"]
    text = (f"`{command_line()}` ({machine()}; torch {torch.__version__}, transformers {transformers.__version__}; "
            f"threads 1 on every side)\n\nsmall configs (4 layers, hidden 256, vocab 2048), portable kernels, "
            f"int8 / int4: group size 128 unless named, float32 activations; {args.prompt_len}-token prompt, "
            f"{args.new_tokens} new tokens, greedy, median of {args.samples}; accuracy over the prompt and the "
            f"float32 model's continuation, teacher-forced:\n\n" + markdown_table(head, body))
    print(text)
    if not args.no_write:
        write_results("bench_quantized", "Quantized weights", text)


if __name__ == "__main__":
    main()
