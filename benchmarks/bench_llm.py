"""LLM generation speed: prefill ms and decode tokens/s, pyrt against ExecuTorch's Python runtime
(the same portable-kernel .pte) and eager ``model.generate``, one thread on every side.

Models: random-init ``transformers`` Llama, Qwen2 and GPT-2 (``--size small``: 4 layers, hidden
256, vocab 2048; ``tiny``: the test configs; both in ``pyrt/testing/archs.py``), exported once with
``pyrt.export.decoder_to_pte(builder="portable")``. Per sample and side, one greedy generation of
``--new-tokens`` after a ``--prompt-len`` prompt, sides interleaved; medians over samples.

* pyrt: ``pyrt.generate`` (its own timings: prefill = the prompt's forward call, decode = the
  tokens after the first per second);
* ExecuTorch: ``Runtime.get().load_program(path).load_method("forward")``, the same loop in
  Python (prefill call, then argmax and one call per token), timed the same way;
* eager: ``model.generate(do_sample=False)`` (its dynamic cache); prefill = ``max_new_tokens=1``,
  decode rate = (new - 1) / (time(new) - time(1)).

All three must produce the same tokens. Then, on the simulated GPU, decode tokens/s per
weight-streaming budget of a reference-engine export (``pyrt bench --generate --sweep``'s code):
it shows the sweep works end to end; its numbers time CPU reference engines, not a GPU.

    python benchmarks/bench_llm.py [--size small] [--samples 5] [--models llama,qwen2,gpt2] [--no-write]

``--batch 1,2,4,8,16`` measures batched generation instead: per batch size B, every sequence's decode
tokens/s of one ``pyrt.generate`` call over B prompts (a file exported with ``max_batch_size`` =
the largest B, portable kernels), beside B solo ``pyrt.generate`` calls on the same file one after
another, and ``transformers``' batched ``model.generate`` (left-padded; equal-length prompts here, so
no pad is needed). The two batched sides are timed alike: B * (new - 1) tokens over time(new) -
time(1), the same call with one new token taken off, so prefill (which pyrt spreads over steps
within the file's token budget, decoding the first sequences meanwhile) counts on neither side.
Solo calls count each call's own decode time. Goals (issue #31): 8 sequences in one call >= 4x 8
solo calls, and >= transformers at every batch size.
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


def build(name: str, size: str) -> Any:
    from pyrt.testing import archs

    if size == "tiny":
        return archs.causal_lm(name)
    return archs.causal_lm(name, variant="llm_small", layers=4)


def pyrt_side(path: Path, prompt: list[int], new: int) -> Any:
    import pyrt

    prog = pyrt.Program(path)

    def run() -> tuple[list[int], float, float]:
        out = pyrt.generate(prog, prompt, max_new_tokens=new, eos_ids=[], prefix_caching=False)
        return out.tokens, out.timings.prefill_ms, out.timings.decode_tokens_per_s

    return run


def executorch_side(path: Path, prompt: list[int], new: int) -> Any:
    import torch
    from executorch.runtime import Runtime

    method = Runtime.get().load_program(path).load_method("forward")

    def run() -> tuple[list[int], float, float]:
        t0 = time.perf_counter()
        logits = method.execute([torch.tensor([prompt]), torch.arange(len(prompt))])[0]
        t1 = time.perf_counter()
        tokens = [int(logits[0, -1].argmax())]
        t2 = time.perf_counter()
        for i in range(new - 1):
            logits = method.execute([torch.tensor([[tokens[-1]]]), torch.tensor([len(prompt) + i])])[0]
            tokens.append(int(logits[0, -1].argmax()))
        t3 = time.perf_counter()
        return tokens, (t1 - t0) * 1e3, (new - 1) / (t3 - t2)

    return run


def eager_side(model: Any, prompt: list[int], new: int) -> Any:
    import torch

    ids = torch.tensor([prompt])

    def timed(n: int) -> tuple[list[int], float]:
        with torch.no_grad():
            t0 = time.perf_counter()
            out = model.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
            return [int(t) for t in out[0, len(prompt):]], time.perf_counter() - t0

    def run() -> tuple[list[int], float, float]:
        _, first = timed(1)
        tokens, whole = timed(new)
        return tokens, first * 1e3, (new - 1) / max(whole - first, 1e-9)

    return run


def measure(sides: dict[str, Any], samples: int) -> dict[str, dict[str, Any]]:
    for run in sides.values():
        run()  # warm up
    got: dict[str, list[tuple[list[int], float, float]]] = {k: [] for k in sides}
    for _ in range(samples):
        for name, run in sides.items():
            got[name].append(run())
    out = {}
    for name, runs in got.items():
        out[name] = {"tokens": runs[0][0], "prefill_ms": statistics.median(r[1] for r in runs),
                     "decode_tps": statistics.median(r[2] for r in runs)}
    return out


def sweep_rows(model: Any, directory: Path, prompt_len: int, new: int) -> list[dict[str, Any]]:
    import pyrt
    from pyrt.export import decoder_to_pte
    from pyrt.llm.gen_bench import generation_sweep
    from pyrt.sim import simulated_gpus

    path = directory / "ws.pte"
    decoder_to_pte(model, path, max_seq_len=prompt_len + new, builder="reference", weight_streaming=True,
                   progress=False)
    with simulated_gpus(1), pyrt.Program(path) as prog:
        return generation_sweep(prog, budgets=["10%", "40%", "70%", "100%"], prompt_len=prompt_len,
                                new_tokens=new, iters=3)


def batch_rows(name: str, size: str, batches: list[int], prompt_len: int, new: int, samples: int,
               directory: Path) -> list[list[str]]:
    """Per batch size: pyrt's one call over B prompts, B solo pyrt calls, transformers' batched generate."""
    import numpy as np
    import torch

    import pyrt
    from pyrt.export import decoder_to_pte

    model = build(name, size)
    path = directory / f"{name}-slots.pte"
    decoder_to_pte(model, path, max_seq_len=prompt_len + new, max_batch_size=max(batches), builder="portable",
                   progress=False)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, model.config.vocab_size, prompt_len).tolist() for _ in range(max(batches))]
    prog = pyrt.Program(path)

    def hf(b: int) -> tuple[float, list[list[int]]]:
        ids = torch.tensor(prompts[:b])
        kw = {"attention_mask": torch.ones_like(ids), "do_sample": False, "eos_token_id": None, "pad_token_id": 0}
        with torch.no_grad():
            t0 = time.perf_counter()
            model.generate(ids, max_new_tokens=1, **kw)
            t1 = time.perf_counter()
            out = model.generate(ids, max_new_tokens=new, **kw)
            t2 = time.perf_counter()
        return b * (new - 1) / ((t2 - t1) - (t1 - t0)), [r[prompt_len:].tolist() for r in out]

    def one_call(b: int) -> tuple[float, list[list[int]]]:
        t0 = time.perf_counter()
        pyrt.generate(prog, prompts[:b], max_new_tokens=1, eos_ids=[], prefix_caching=False)
        t1 = time.perf_counter()
        results = pyrt.generate(prog, prompts[:b], max_new_tokens=new, eos_ids=[], prefix_caching=False)
        t2 = time.perf_counter()
        return b * (new - 1) / ((t2 - t1) - (t1 - t0)), [r.tokens for r in results]

    def step_ms(b: int) -> float:
        """One forward of B decode tokens (B slots at position 63, a window of 64), ms: the program alone."""
        x = (np.arange(3, 3 + b), np.arange(b), np.full(b, 63), np.arange(b), np.arange(64))
        x = tuple(np.asarray(a, np.int64) for a in x)
        for _ in range(10):
            prog(*x)
        t0 = time.perf_counter()
        for _ in range(100):
            prog(*x)
        return (time.perf_counter() - t0) * 10

    def solo(b: int) -> float:
        done = [pyrt.generate(prog, p, max_new_tokens=new, eos_ids=[], prefix_caching=False) for p in prompts[:b]]
        return sum(len(r.tokens) - 1 for r in done) / sum(r.timings.decode_ms / 1e3 for r in done)

    pyrt.generate(prog, prompts[:2], max_new_tokens=4, eos_ids=[])  # warm up
    rows = []
    for b in batches:
        got: dict[str, list[float]] = {"one call": [], "solo": [], "transformers": [], "step": []}
        for _ in range(samples):
            rate, batched = one_call(b)
            got["one call"].append(rate)
            got["solo"].append(solo(b))
            rate, tokens = hf(b)
            got["transformers"].append(rate)
            got["step"].append(step_ms(b))
            if batched != tokens:
                raise SystemExit(f"{name} B={b}: pyrt's batched tokens differ from transformers'")
        med = {k: statistics.median(v) for k, v in got.items()}
        rows.append([name, str(b), f"{med['one call']:.0f}", f"{med['solo']:.0f}", f"{med['transformers']:.0f}",
                     f"{med['one call'] / med['solo']:.2f}x", f"{med['one call'] / med['transformers']:.2f}x",
                     f"{med['step']:.2f}"])
        print(rows[-1], flush=True)
    prog.close()
    return rows


def batch_main(args: argparse.Namespace) -> int:
    import importlib.metadata

    import torch
    from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool

    torch.set_num_threads(1)
    _unsafe_reset_threadpool(1)
    batches = [int(b) for b in args.batch.split(",")]
    rows: list[list[str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            rows += batch_rows(name, args.size, batches, args.prompt_len, args.new_tokens, args.samples, Path(tmp))
    head = ["model", "B", "pyrt, one call (tok/s)", "pyrt, B solo calls", "transformers batched", "one call / solo",
            "one call / transformers", "one forward of B tokens (ms)"]
    text = "\n".join([
        f"`{command_line()}` ({machine()}; torch {torch.__version__}, transformers "
        f"{importlib.metadata.version('transformers')}; threads 1 on every side)", "",
        f"{args.size} configs, {args.prompt_len}-token prompts, {args.new_tokens} new tokens, greedy (pyrt's batched "
        f"tokens equal transformers'), decode tokens/s of all sequences together (batched sides: B * (new - 1) / "
        f"(time(new) - time(1)); solo: each call's decode time), median of {args.samples} samples:", "",
        markdown_table(head, rows)])
    print(text)
    if not args.no_write:
        write_results(f"bench_llm_batch_{args.size}", "LLM batched generation", text)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=("tiny", "small"), default="small")
    ap.add_argument("--models", default="llama,qwen2,gpt2")
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--batch", help="batch sizes, e.g. 1,2,4,8,16: measure batched generation instead")
    args = ap.parse_args()
    if args.batch:
        return batch_main(args)
    import importlib.metadata

    import numpy as np
    import torch
    from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool

    from pyrt.export import decoder_to_pte

    torch.set_num_threads(1)
    _unsafe_reset_threadpool(1)
    rows, table = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            model = build(name, args.size)
            vocab = model.config.vocab_size
            prompt = np.random.default_rng(0).integers(3, vocab, args.prompt_len).tolist()
            path = Path(tmp) / f"{name}.pte"
            summary = decoder_to_pte(model, path, max_seq_len=args.prompt_len + args.new_tokens, builder="portable",
                                     progress=False)
            sides = {"pyrt": pyrt_side(path, prompt, args.new_tokens),
                     "executorch": executorch_side(path, prompt, args.new_tokens),
                     "eager": eager_side(model, prompt, args.new_tokens)}
            got = measure(sides, args.samples)
            same = got["pyrt"]["tokens"] == got["executorch"]["tokens"] == got["eager"]["tokens"]
            if not same:
                raise SystemExit(f"{name}: the sides generated different tokens: {got}")
            r = {k: got[k] for k in got} | {"route": summary.route}
            rows.append((name, r))
            p, e, g = got["pyrt"], got["executorch"], got["eager"]
            table.append([name, summary.route, f"{p['prefill_ms']:.2f}", f"{e['prefill_ms']:.2f}",
                          f"{g['prefill_ms']:.2f}", f"{p['decode_tps']:.0f}", f"{e['decode_tps']:.0f}",
                          f"{g['decode_tps']:.0f}", f"{p['decode_tps'] / e['decode_tps']:.2f}x",
                          f"{p['decode_tps'] / g['decode_tps']:.2f}x"])
            print(table[-1], flush=True)
        sweep = sweep_rows(build("llama", "tiny"), Path(tmp), 8, 16)
    head = ["model", "route", "prefill ms pyrt", "ExecuTorch", "eager", "decode tok/s pyrt", "ExecuTorch", "eager",
            "pyrt/ET", "pyrt/eager"]
    sweep_table = markdown_table(["budget", "applied bytes", "prefill ms", "decode tok/s"], [
        [r["budget"], f"{r['applied_bytes']} of {r['streamable_bytes']}", f"{r['prefill_ms']:.1f}",
         f"{r['decode_tokens_per_s']:.1f}"] for r in sweep])
    text = "\n".join([
        f"`{command_line()}` ({machine()}; torch {torch.__version__}, transformers "
        f"{importlib.metadata.version('transformers')}, executorch {importlib.metadata.version('executorch')}; "
        f"threads 1 on every side)", "",
        f"{args.size} configs, {args.prompt_len}-token prompt, {args.new_tokens} new tokens (greedy, all three sides "
        f"gave the same tokens), median of {args.samples} samples, sides interleaved:", "",
        markdown_table(head, table), "",
        "Decode tokens/s per weight-streaming budget, tiny Llama, reference engines on the simulated GPU "
        "(8-token prompt, 16 new tokens; these time CPU reference engines, not a GPU: they only show the sweep "
        "works end to end):", "", sweep_table])
    print(text)
    if not args.no_write:
        write_results(f"bench_llm_{args.size}", "LLM generation", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
