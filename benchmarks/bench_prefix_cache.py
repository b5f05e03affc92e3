"""Prefix caching: forward passes and time to first token with and without it, one thread.

Model: a random-init ``transformers`` Llama (``--size small``: hidden 256, 4 layers, vocab 2048; ``tiny``: the test
config, hidden 32, 2 layers; ``pyrt/testing/archs.py``'s, with CONTEXT positions), exported once with
``decoder_to_pte(builder="portable", max_batch_size=8, max_tokens_per_step=CHUNK)`` and loaded twice: one
Program generates with prefix caching, the other without (``prefix_caching=False``), each with its own KV-cache
slots. Every run with caching must give the
tokens of the run without (greedy). Passes: the target's forward calls (``Engine.stats()["steps"]``);
prefill passes: those before the generation's first token (a turn's passes less one per later new token).

* (a) multi-turn chat: a 96-token system prompt, then 8 turns of a 150-token user message and a 32-token
  greedy reply, each turn sending the whole conversation so far (about 1,560 tokens at turn 8); per turn:
  prefill passes and TTFT with and without (goal: turn 8's prefill 1 + new tokens / chunk passes, TTFT at
  least 4x lower);
* (b) 8 users sharing a 1,000-token system prompt, each with its own 40-token question, 16 new tokens:
  one after another (each its own ``pyrt.generate``) and at once (one ``pyrt.generate`` of the 8); passes,
  prompt tokens fed, mean TTFT (goal: at least 3x fewer prefill passes in all);
  at once, a user whose prefix another is still prefilling waits for it and has the positions copied from
  its slot (``pyrt.llm.kv_copy``) instead of prefilling them too;
* (c) on a GPU streaming its weights every pass costs a whole pass over the weights (issue 45: about 0.7 s for
  a 70B int4 model at 25 GB/s): the prefill time of (a) and (b) modelled as prefill passes x 0.7 s; and (b) run
  on the simulated GPU (``builder="reference"``, ``weight_streaming=True``, budget 0: every pass streams all the
  streamable weights, at a rate that makes a pass cost ``--pass-s`` seconds, ``stream_bytes_per_second`` of the
  fake TensorRT), measured.

    python benchmarks/bench_prefix_cache.py [--size small|tiny] [--pass-s 0.1] [--no-write]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from _common import command_line, machine, markdown_table, write_results  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SLOTS, CHUNK, CONTEXT = 8, 128, 1664
SYSTEM, USER, REPLY, TURNS = 96, 150, 32, 8
SHARED, QUESTION, ANSWER, USERS = 1000, 40, 16, 8
PASS_S = 0.7  # a weight-streamed pass of a 70B int4 model (18 GB at 25 GB/s), issue 45


def steps(prog: Any) -> int:
    from pyrt.llm.stepping import core_loop

    return core_loop(prog).published.steps


def turn(prog: Any, prompt: list[int], new: int, caching: bool) -> dict[str, Any]:
    import pyrt

    before = steps(prog)
    out = pyrt.generate(prog, prompt, max_new_tokens=new, eos_ids=[], prefix_caching=caching)
    passes = steps(prog) - before
    return {"tokens": out.tokens, "prefill": passes - (len(out.tokens) - 1), "ttft": out.timings.ttft_ms,
            "cached": out.cached_tokens}


def chat(progs: dict[bool, Any], rng: Any, vocab: int) -> list[list[str]]:
    history = rng.integers(3, vocab, SYSTEM).tolist()
    rows = []
    for i in range(TURNS):
        history += rng.integers(3, vocab, USER).tolist()
        got = {caching: turn(prog, history, REPLY, caching) for caching, prog in progs.items()}
        assert got[True]["tokens"] == got[False]["tokens"], f"turn {i + 1}: tokens differ with caching"
        on, off = got[True], got[False]
        rows.append([str(i + 1), str(len(history)), str(on["cached"]), str(off["prefill"]), str(on["prefill"]),
                     f"{off['ttft']:.0f}", f"{on['ttft']:.0f}", f"{off['ttft'] / on['ttft']:.1f}x",
                     f"{off['prefill'] * PASS_S:.1f} / {on['prefill'] * PASS_S:.1f}"])
        history += on["tokens"]
    return rows


def users(progs: dict[bool, Any], rng: Any, vocab: int, streamed: bool = False) -> list[list[str]]:
    import pyrt
    from pyrt.llm.stepping import core_loop

    rows = []
    for how in ("one after another", "at once"):  # each its own system prompt: no slot holds it yet
        system = rng.integers(3, vocab, SHARED).tolist()
        prompts = [system + rng.integers(3, vocab, QUESTION).tolist() for _ in range(USERS)]
        got = {}
        for caching, prog in progs.items():
            loop = core_loop(prog)
            before, fed = loop.published.steps, loop.published.prompt_tokens
            if how == "at once":
                outs = pyrt.generate(prog, prompts, max_new_tokens=ANSWER, eos_ids=[], prefix_caching=caching)
            else:
                outs = [pyrt.generate(prog, p, max_new_tokens=ANSWER, eos_ids=[], prefix_caching=caching)
                        for p in prompts]
            passes = loop.published.steps - before
            decode = ANSWER - 1 if how == "at once" else USERS * (ANSWER - 1)  # steps that only decode
            got[caching] = {"tokens": [o.tokens for o in outs], "passes": passes, "prefill": passes - decode,
                            "fed": loop.published.prompt_tokens - fed,
                            "ttft": statistics.mean(o.timings.ttft_ms for o in outs),
                            "cached": sum(o.cached_tokens for o in outs)}
        assert got[True]["tokens"] == got[False]["tokens"], f"{how}: tokens differ with caching"
        on, off = got[True], got[False]
        row = [how, str(on["cached"]), f"{off['fed']} / {on['fed']}", f"{off['prefill']} / {on['prefill']}",
               f"{off['prefill'] / max(on['prefill'], 1):.1f}x", f"{off['ttft']:.0f} / {on['ttft']:.0f}"]
        if streamed:
            row.append(f"{off['ttft'] / on['ttft']:.1f}x")
        else:
            row.append(f"{off['prefill'] * PASS_S:.1f} / {on['prefill'] * PASS_S:.1f}")
        rows.append(row)
    return rows


def streamed_users(model: Any, path: Path, pass_s: float, rng: Any, vocab: int) -> tuple[list[list[str]], int]:
    """(b) on the simulated GPU with every pass streaming the weights (``pass_s`` seconds a pass)."""
    import pyrt
    from pyrt.export import decoder_to_pte
    from pyrt.sim import simulated_gpus

    decoder_to_pte(model, path, max_seq_len=CONTEXT, builder="reference", max_batch_size=SLOTS,
                   max_tokens_per_step=CHUNK, weight_streaming=True, progress=False)
    with simulated_gpus(1) as sim, pyrt.Program(path, budget=0) as cached, pyrt.Program(path, budget=0) as plain:
        streamable = sum(info.streamable_bytes for info in cached.weight_streaming)  # per Program
        assert streamable > 0 and all(info.budget == 0 for info in cached.weight_streaming)
        progs = {True: cached, False: plain}
        for prog in progs.values():  # warm up
            pyrt.generate(prog, [5, 6, 7], max_new_tokens=2, eos_ids=[], prefix_caching=False)
        sim.tensorrt.stream_bytes_per_second = streamable / pass_s
        return users(progs, rng, vocab, streamed=True), streamable


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=["small", "tiny"], default="small")
    parser.add_argument("--pass-s", type=float, default=0.1, help="(c): seconds one streamed pass costs")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    import numpy as np
    import torch
    import transformers

    import pyrt
    from pyrt.export import decoder_to_pte
    from pyrt.testing import archs

    torch.set_num_threads(1)
    variant = "llm_small" if args.size == "small" else "llm"
    torch.manual_seed(0)
    config = archs.decoder_config(variant, 4 if args.size == "small" else 2, num_key_value_heads=2,
                                  max_position_embeddings=CONTEXT)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config)).eval()
    vocab = model.config.vocab_size
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "llama.pte"
        decoder_to_pte(model, path, max_seq_len=CONTEXT, builder="portable", max_batch_size=SLOTS,
                       max_tokens_per_step=CHUNK, progress=False)
        with pyrt.Program(path) as cached, pyrt.Program(path) as plain:
            progs = {True: cached, False: plain}
            for prog in progs.values():  # warm up
                pyrt.generate(prog, [5, 6, 7], max_new_tokens=2, eos_ids=[], prefix_caching=False)
            rng = np.random.default_rng(0)
            a = chat(progs, rng, vocab)
            b = users(progs, rng, vocab)
        c, streamable = streamed_users(model, Path(tmp) / "streamed.pte", args.pass_s, rng, vocab)
    text = (f"`{command_line()}` ({machine()}; torch {torch.__version__}, transformers {transformers.__version__}; "
            f"threads 1)\n\nLlama {args.size} config, portable kernels, {SLOTS} slots, {CHUNK} tokens per step, "
            f"greedy; every run with caching gave the tokens of the run without. (c) columns of (a) and (b): "
            f"prefill passes x {PASS_S} s, a weight-streamed pass of a 70B int4 model (modelled from the measured "
            "passes); the (c) table: (b) run on the simulated GPU with streamed weights (measured).\n\n"
            f"(a) multi-turn chat ({SYSTEM}-token system prompt, {USER}-token messages, {REPLY}-token replies):\n\n"
            + markdown_table(["turn", "prompt", "cached", "prefill passes off", "prefill passes on", "TTFT ms off",
                              "TTFT ms on", "TTFT off / on", "(c) streamed prefill s off / on"], a)
            + f"\n\n(b) {USERS} users, a {SHARED}-token shared system prompt, {QUESTION}-token questions, "
            f"{ANSWER} new tokens (off / on):\n\n"
            + markdown_table(["how", "cached", "prompt tokens fed", "prefill passes", "fewer", "mean TTFT ms",
                              "(c) streamed prefill s"], b)
            + f"\n\n(c) (b) run on the simulated GPU: reference engines, weights streamed every pass ({streamable} "
            f"streamable bytes, budget 0, streamed at a rate that makes a pass cost {args.pass_s} s), measured "
            "(off / on):\n\n"
            + markdown_table(["how", "cached", "prompt tokens fed", "prefill passes", "fewer", "mean TTFT ms",
                              "TTFT off / on"], c))
    print(text)
    if not args.no_write:
        write_results(f"bench_prefix_cache_{args.size}", "Prefix caching", text)


if __name__ == "__main__":
    main()
