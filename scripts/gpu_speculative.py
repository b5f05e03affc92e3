"""Speculative decoding with weights streamed from pinned host memory, on a real GPU (issue #36).

TensorRT does not run on the GPUs lent here, so the target is :mod:`gpu_stream_batch`'s streamed stack
(``L`` layers of float16 matrices in pinned host memory, copied one layer ahead while the previous one
computes) behind pyrt's slot-layout signature: each call runs one streamed step over the call's tokens on
the GPU, then returns logits from a copying model (greedy output: the prompt's document copied on from an
earlier point, every ``--mutate``-th token changed, so prompt lookup guesses most tokens but not all).
``pyrt.generate`` runs it with and without ``draft="ngram"``: the engine, scheduler, verification and
prompt lookup are pyrt's own; only the weights' arithmetic is the stand-in. It prints, per batch size,
tokens per pass, tokens/s both ways, and the goal: speculative / plain tokens/s >= 0.8 x tokens per pass.

    python3 scripts/gpu_speculative.py --layers 8 --hidden 4096 --batch 1,8 --k 4
    python3 scripts/gpu_speculative.py --device cpu --layers 2 --hidden 256     # a dry run without a GPU
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

VOCAB, DOC, START = 1000, 96, 8


class CpuStack:
    """The streamed stack's arithmetic on the CPU (nothing streamed): for a dry run of this script."""

    def __init__(self, torch: Any, layers: int, hidden: int) -> None:
        self.torch, self.hidden = torch, hidden
        shapes = [(hidden, 3 * hidden), (hidden, hidden), (hidden, 4 * hidden), (4 * hidden, hidden)]
        self.layers = [[torch.randn(s) * 0.02 for s in shapes] for _ in range(layers)]
        self.streamed_bytes = 0

    def step(self, x: Any) -> Any:
        for qkv, o, up, down in self.layers:
            x = x + (x @ qkv)[:, : self.hidden] @ o
            x = x + self.torch.relu(x @ up) @ down
        return x


class StreamedLM:
    """``run(tokens, slots, positions, rows, window)``: one streamed step over the tokens, copying-model logits."""

    def __init__(self, stack: Any, torch: Any, device: str, outputs: dict[int, list[int]], prompt_len: int) -> None:
        self.stack, self.torch, self.device = stack, torch, device
        self.outputs, self.prompt_len, self.source = outputs, prompt_len, "streamed-stack"

    def run(self, tokens: Any, slots: Any, positions: Any, rows: Any, window: Any, method: str = "forward") -> Any:
        torch = self.torch
        x = torch.full((len(tokens), self.stack.hidden), 0.01, device=self.device,
                       dtype=torch.float16 if self.device == "cuda" else torch.float32)
        self.stack.step(x)
        if self.device == "cuda":
            torch.cuda.synchronize()
        out = np.full((len(rows), VOCAB), -5.0, np.float32)
        for r, row in enumerate(np.asarray(rows)):
            want = self.outputs[int(slots[row])][int(positions[row]) + 1 - self.prompt_len]
            out[r, want] = 5.0
        return out


def workload(batch: int, new: int, mutate: int) -> tuple[list[list[int]], dict[int, list[int]]]:
    """Prompts (a document, then its first tokens again) and each slot's greedy output (the document copied on
    from there, every ``mutate``-th token changed)."""
    rng = np.random.default_rng(0)
    prompts, outputs = [], {}
    for slot in range(batch):
        doc = rng.integers(3, VOCAB, DOC).tolist()
        copied = [doc[(START + i) % DOC] for i in range(new + 1)]
        outputs[slot] = [int(rng.integers(3, VOCAB)) if (i + 1) % mutate == 0 else t for i, t in enumerate(copied)]
        prompts.append(doc + doc[:START])
    return prompts, outputs


def run_batch(torch: Any, stack: Any, device: str, batch: int, k: int, new: int, mutate: int) -> dict[str, Any]:
    import pyrt
    from pyrt.llm import CoreLoop
    from pyrt.llm.convention import SLOTS, Convention
    from pyrt.llm.core import EngineCore

    prompts, outputs = workload(batch, new, mutate)
    prompt_len = len(prompts[0])
    budget = max(batch * (k + 1), prompt_len)
    conv = Convention("forward", 1, budget, True, prompt_len + new + 1, VOCAB, None, (), 1, {}, layout=SLOTS,
                      slots=batch, max_rows=budget)
    llm = CoreLoop(EngineCore(StreamedLM(stack, torch, device, outputs, prompt_len), conv, "stack"))
    got = {}
    for name, draft in (("plain", None), ("ngram", "ngram"), ("plain again", None), ("ngram again", "ngram")):
        t = time.perf_counter()
        results = pyrt.generate(llm, prompts, max_new_tokens=new, eos_ids=[], draft=draft, draft_tokens=k)
        wall = time.perf_counter() - t
        assert [r.tokens for r in results] == [outputs[s][:new] for s in range(batch)], name
        got[name] = {"tokens_per_s": batch * new / wall, "passes": sum(r.passes for r in results)}
    plain = max(got["plain"]["tokens_per_s"], got["plain again"]["tokens_per_s"])  # the first warms up
    spec = max(got["ngram"]["tokens_per_s"], got["ngram again"]["tokens_per_s"])
    per_pass = batch * new / got["ngram"]["passes"]
    return {"batch": batch, "k": k, "tokens_per_pass": per_pass, "plain_tokens_per_s": plain,
            "speculative_tokens_per_s": spec, "ratio": spec / plain, "goal": 0.8 * per_pass,
            "met": spec / plain >= 0.8 * per_pass}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--batch", default="1,8")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--mutate", type=int, default=10, help="every n-th output token is not a copy (default 10)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device (--device cpu: a dry run)", file=sys.stderr)
        return 2
    if args.device == "cuda":
        from gpu_stream_batch import StreamedStack

        stack: Any = StreamedStack(torch, args.layers, args.hidden)
    else:
        stack = CpuStack(torch, args.layers, args.hidden)
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
                              "streamed_bytes": stack.streamed_bytes, "rows": []}
    print(f"{'B':>3} {'k':>2} {'tok/pass':>8} {'plain tok/s':>12} {'spec tok/s':>11} {'ratio':>6} {'goal':>6}")
    for b in [int(v) for v in args.batch.split(",")]:
        row = run_batch(torch, stack, args.device, b, args.k, args.new_tokens, args.mutate)
        result["rows"].append(row)
        print(f"{b:3d} {args.k:2d} {row['tokens_per_pass']:8.2f} {row['plain_tokens_per_s']:12.1f} "
              f"{row['speculative_tokens_per_s']:11.1f} {row['ratio']:6.2f} {row['goal']:6.2f}"
              f"{'' if row['met'] else '  (goal not met)'}")
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
