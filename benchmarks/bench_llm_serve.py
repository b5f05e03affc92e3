"""LLM serving: ``pyrt serve``'s OpenAI API (streamed) against offline ``pyrt.generate`` at the same batch.

The model is a random-init ``transformers`` decoder of the small config (``archs.causal_lm(name,
variant="llm_small", layers=4)``: hidden 256, vocabulary 2048), exported once with
``decoder_to_pte(max_batch_size=16, builder="portable")``: the CPU, numpy kernels on both sides.
The tokenizer is a byte-level BPE of exactly 2048 tokens trained here on made-up words
(``pyrt.testing.tokenizers``), ASCII only, so every generated token carries text.

At each concurrency (1, 8, 32), ``C`` prompts of ``--prompt-len`` random ids, ``--new-tokens``
greedy tokens each (``ignore_eos``):

- offline: one ``pyrt.generate(program, prompts, ...)`` call (one engine, the file's 16 slots);
- served: ``C`` streamed ``/v1/completions`` requests at once (prompt as token ids,
  ``stream_options.include_usage`` and vLLM's ``continuous_usage_stats`` so every chunk says how
  many tokens it carries), aiohttp clients in this process, on the same cores; ``pyrt serve`` as it
  starts by default (a local Ray, HAProxy straight to one replica).

Aggregate tokens/s is every request's new tokens over the wall time from the first request sent
to the last token received; time to first token is per request (sent -> first chunk); inter-token
latency is each gap between chunks divided by the tokens the later one carries (one, nearly always).
Offline time to first token is ``pyrt.generate``'s own (``timings.ttft_ms``: from the call, queueing
for a slot and prefill included), the median over the prompts.
Served texts are checked against the offline tokens decoded. Threads pinned to 1 everywhere
(OMP/OpenBLAS/MKL variables, inherited by Ray's processes; ``torch.set_num_threads(1)`` for the export).

    python benchmarks/bench_llm_serve.py [--model llama] [--new-tokens 64] [--samples 2] [--no-write]
    python benchmarks/bench_llm_serve.py --features [--samples 3]

``--features``: the rows of OpenAI features at concurrency 8 instead (section "LLM serving: structured
output and logprobs"): the same streamed completions plain, with a JSON schema (``response_format``,
grammar-constrained decoding with llguidance), and with ``logprobs: 5``; a tokenizer with every byte
(so JSON can be written); served tokens/s of each. Beside them, offline, the grammar's cost per
decoding step: the mask of allowed ids and the advance after each token (``pyrt.serve.structured``),
over whole constrained generations of random allowed tokens.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import command_line, machine, markdown_table, write_results  # noqa: E402

CONCURRENCY = (1, 8, 32)
SLOTS = 16
MAX_SEQ_LEN = 256
VOCAB = 2048


def export(name: str, folder: Path) -> tuple[Path, Path]:
    import torch

    from pyrt.export import decoder_to_pte
    from pyrt.testing import archs
    from pyrt.testing.tokenizers import byte_level_bpe, words

    torch.set_num_threads(1)
    path = folder / f"{name}-small-b{SLOTS}.pte"
    decoder_to_pte(archs.causal_lm(name, variant="llm_small", layers=4), path, max_seq_len=MAX_SEQ_LEN,
                   max_batch_size=SLOTS, builder="portable", progress=False)
    return path, byte_level_bpe(folder / "tokenizer", words(40_000), vocab_size=VOCAB)


def offline(path: Path, prompts: list[list[int]], new: int) -> tuple[float, list[list[int]], float]:
    """(tokens/s, tokens per prompt, median time to first token in ms) of one ``pyrt.generate`` call."""
    import pyrt

    with pyrt.Program(path, kernels="numpy") as prog:
        pyrt.generate(prog, prompts[:2], max_new_tokens=4, eos_ids=[])  # warm
        start = time.perf_counter()
        results = pyrt.generate(prog, prompts, max_new_tokens=new, eos_ids=[], prefix_caching=False)
        wall = time.perf_counter() - start
    ttft = statistics.median(r.timings.ttft_ms for r in results)
    return sum(len(r.tokens) for r in results) / wall, [list(r.tokens) for r in results], ttft


async def one_request(session: Any, url: str, prompt: list[int], new: int) -> dict[str, Any]:
    body = {"model": "llm", "prompt": prompt, "max_tokens": new, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    sent = time.perf_counter()
    arrivals: list[tuple[float, int]] = []  # (time, tokens so far) of each chunk with text
    text, seen = [], 0
    async with session.post(url, json=body) as reply:
        assert reply.status == 200, await reply.text()
        async for line in reply.content:
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            done = chunk["usage"]["completion_tokens"]
            if chunk["choices"] and chunk["choices"][0]["text"] and done > seen:
                arrivals.append((time.perf_counter(), done))
                text.append(chunk["choices"][0]["text"])
            seen = max(seen, done)
    gaps = [(b - a) / (n - m) for (a, m), (b, n) in zip(arrivals, arrivals[1:], strict=False)]
    return {"sent": sent, "first": arrivals[0][0], "last": arrivals[-1][0], "tokens": seen, "gaps": gaps,
            "text": "".join(text)}


async def served(url: str, prompts: list[list[int]], new: int) -> list[dict[str, Any]]:
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=1800)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        return list(await asyncio.gather(*(one_request(session, url, p, new) for p in prompts)))


def figures(results: list[dict[str, Any]]) -> dict[str, float]:
    wall = max(r["last"] for r in results) - min(r["sent"] for r in results)
    ttft = [(r["first"] - r["sent"]) * 1e3 for r in results]
    itl = [g * 1e3 for r in results for g in r["gaps"]]
    return {"tps": sum(r["tokens"] for r in results) / wall, "ttft50": float(np.percentile(ttft, 50)),
            "ttft99": float(np.percentile(ttft, 99)), "itl50": float(np.percentile(itl, 50)),
            "itl99": float(np.percentile(itl, 99))}


def serve_side(path: Path, tokenizer: Path, runs: dict[int, list[list[int]]], new: int, samples: int
               ) -> dict[int, list[dict[str, float]]]:
    import ray
    from ray import serve

    from pyrt.serve.app import deployment, run, start
    from pyrt.serve.config import ServeConfig
    from tests.fixtures.serve import free_port

    port = free_port()
    start(port=port, num_cpus=2)
    try:
        run(deployment(ServeConfig(str(path), name="llm", kernels="numpy", tokenizer=str(tokenizer))), path=str(path))
        url = f"http://127.0.0.1:{port}/v1/completions"
        asyncio.run(served(url, [runs[1][0]], 4))  # warm
        out: dict[int, list[dict[str, Any]]] = {}
        for c, prompts in runs.items():
            out[c] = [asyncio.run(served(url, prompts, new)) for _ in range(samples)]
        return out
    finally:
        serve.shutdown()
        ray.shutdown()


PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "pet"],
          "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0,
                                                                              "maximum": 120},
                         "pet": {"enum": ["cat", "dog", "none"]}, "tags": {"type": "array", "maxItems": 4,
                                                                           "items": {"type": "string",
                                                                                     "maxLength": 8}}}}
FEATURES = {"plain": {}, "json_schema": {"response_format": {"type": "json_schema", "json_schema": {
    "name": "person", "schema": PERSON}}}, "logprobs 5": {"logprobs": 5}}


async def feature_request(session: Any, url: str, prompt: list[int], new: int, extra: dict[str, Any]
                          ) -> dict[str, Any]:
    body = {"model": "llm", "prompt": prompt, "max_tokens": new, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}, **extra}
    sent = time.perf_counter()
    tokens, text = 0, []
    async with session.post(url, json=body) as reply:
        assert reply.status == 200, await reply.text()
        async for line in reply.content:
            if line.startswith(b"data: {"):
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                elif chunk["choices"]:
                    text.append(chunk["choices"][0]["text"])
    return {"sent": sent, "last": time.perf_counter(), "tokens": tokens, "text": "".join(text)}


async def feature_run(url: str, prompts: list[list[int]], new: int, extra: dict[str, Any]) -> dict[str, float]:
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800)) as session:
        results = await asyncio.gather(*(feature_request(session, url, p, new, extra) for p in prompts))
    if "response_format" in extra:  # every constrained answer parses and validates
        import jsonschema

        for r in results:
            jsonschema.validate(json.loads(r["text"]), PERSON)
    wall = max(r["last"] for r in results) - min(r["sent"] for r in results)
    return {"tps": sum(r["tokens"] for r in results) / wall, "tokens": sum(r["tokens"] for r in results) / len(results)}


def mask_cost(tokenizer: Path, steps: int = 64, runs: int = 8) -> tuple[float, float, float]:
    """(mean, 99th percentile of the mask + advance per step in microseconds, schema compile ms) offline."""
    from transformers import AutoTokenizer

    from pyrt.serve.structured import Grammars

    grammars = Grammars(AutoTokenizer.from_pretrained(str(tokenizer), local_files_only=True), VOCAB)
    grammars.schema(PERSON, "warm")
    start = time.perf_counter()
    grammar = grammars.schema(PERSON, "response_format")
    compile_ms = (time.perf_counter() - start) * 1e3
    rng, costs = np.random.default_rng(0), []
    for _ in range(runs):
        matcher = grammar.matcher()
        for _ in range(steps):
            t = time.perf_counter()
            allowed = matcher.allowed((2,))
            token = int(rng.choice(np.flatnonzero(allowed)))
            matcher.accept(token)
            costs.append((time.perf_counter() - t) * 1e6)
            if matcher.finished:
                break
    return float(np.mean(costs)), float(np.percentile(costs, 99)), compile_ms


def features(args: Any) -> str:
    """The feature rows: plain, JSON schema and logprobs at concurrency 8 through pyrt serve; the mask's cost."""
    import ray
    from ray import serve

    from pyrt.serve.app import deployment, run, start
    from pyrt.serve.config import ServeConfig
    from pyrt.testing.tokenizers import byte_level_bpe, words
    from tests.fixtures.serve import free_port

    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, VOCAB, args.prompt_len).tolist() for _ in range(8)]
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        path, _ = export(args.model, Path(tmp))
        corpus = words(40_000) + '\n{"name": "a", "age": 3, "pet": "cat", "tags": ["x"]}\n'
        tokenizer = byte_level_bpe(Path(tmp) / "tokenizer-json", corpus, vocab_size=VOCAB, full_alphabet=True)
        mean_us, p99_us, compile_ms = mask_cost(tokenizer)
        port = free_port()
        start(port=port, num_cpus=2)
        try:
            cfg = ServeConfig(str(path), name="llm", kernels="numpy", tokenizer=str(tokenizer))
            run(deployment(cfg), path=str(path))
            url = f"http://127.0.0.1:{port}/v1/completions"
            asyncio.run(feature_run(url, prompts[:1], 4, {}))  # warm
            rows = {name: [asyncio.run(feature_run(url, prompts, args.new_tokens, extra))
                           for _ in range(args.samples)] for name, extra in FEATURES.items()}
        finally:
            serve.shutdown()
            ray.shutdown()
    load.append(os.getloadavg()[0])
    plain = statistics.median(r["tps"] for r in rows["plain"])
    table = markdown_table(["request (concurrency 8)", "served tokens/s", "against plain", "tokens per answer"],
                           [[name, f"{statistics.median(r['tps'] for r in got):.0f}",
                             f"{statistics.median(r['tps'] for r in got) / plain:.2f}x",
                             f"{statistics.median(r['tokens'] for r in got):.1f}"] for name, got in rows.items()])
    text = "\n".join([f"`{command_line()}` ({time.strftime('%Y-%m-%d')}, {machine()}; `{args.model}` small config, "
                      f"{SLOTS} slots, prompt "
                      f"{args.prompt_len} ids, up to {args.new_tokens} greedy tokens, a byte-level BPE with every "
                      f"byte; medians of {args.samples} runs; load average at the start and end: {load[0]:.2f} / "
                      f"{load[1]:.2f})", "", table, "",
                      f"The grammar's cost per step (offline, the schema above, random allowed tokens): mask and "
                      f"advance {mean_us:.0f} us mean, {p99_us:.0f} us p99; compiling the schema {compile_ms:.1f} "
                      "ms per request (the tokenizer wrapped once per replica)."])
    if not args.no_write:
        write_results("bench_llm_serve_features", "LLM serving: structured output and logprobs", text)
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--features", action="store_true", help="the structured-output and logprobs rows instead")
    ap.add_argument("--model", default="llama", help="family of pyrt.testing.archs.causal_lm (default llama)")
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--samples", type=int, default=2, help="runs per concurrency and side; the median is kept")
    ap.add_argument("--no-write", action="store_true", help="do not update benchmarks/RESULTS.md")
    args = ap.parse_args()
    if args.features:
        print(features(args))
        return
    load = [os.getloadavg()[0]]
    rng = np.random.default_rng(0)
    pool = [rng.integers(3, VOCAB, args.prompt_len).tolist() for _ in range(max(CONCURRENCY))]
    runs = {c: pool[:c] for c in CONCURRENCY}
    with tempfile.TemporaryDirectory() as tmp:
        path, tokenizer = export(args.model, Path(tmp))
        base = {c: [offline(path, prompts, args.new_tokens) for _ in range(args.samples)]
                for c, prompts in runs.items()}
        serving = serve_side(path, tokenizer, runs, args.new_tokens, args.samples)
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(tokenizer), local_files_only=True)
        for c, samples in serving.items():  # every served text is the offline tokens' text
            want = [tok.decode(t, skip_special_tokens=True) for t in base[c][0][1]]
            assert all([r["text"] for r in s] == want for s in samples), f"concurrency {c}: texts differ"
    load.append(os.getloadavg()[0])
    print(report(args, base, serving, load))


def report(args: Any, base: dict[int, Any], serving: dict[int, Any], load: list[float]) -> str:
    rows = []
    for c in CONCURRENCY:
        off = statistics.median(tps for tps, _, _ in base[c])
        off_ttft = statistics.median(ttft for _, _, ttft in base[c])
        figs = [figures(s) for s in serving[c]]
        med = {k: statistics.median(f[k] for f in figs) for k in figs[0]}
        rows.append([str(c), f"{off:.0f}", f"{med['tps']:.0f}", f"{med['tps'] / off:.2f}x", f"{off_ttft:.1f}",
                     f"{med['ttft50']:.1f}", f"{med['ttft99']:.1f}", f"{med['itl50']:.1f}", f"{med['itl99']:.1f}"])
    table = markdown_table(["concurrency", "offline tokens/s", "served tokens/s", "served / offline",
                            "offline TTFT p50 ms", "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms", "ITL p99 ms"], rows)
    text = "\n".join([f"`{command_line()}` ({machine()}; `{args.model}` small config, {SLOTS} slots, "
                      f"prompt {args.prompt_len} ids, {args.new_tokens} new tokens, portable file on numpy "
                      f"kernels; clients in the same process, on the same cores; medians of {args.samples} runs; "
                      f"load average (1 min) at the start and end: {load[0]:.2f} / {load[1]:.2f})", "", table])
    if not args.no_write:
        write_results("bench_llm_serve", "LLM serving", text)
    return text


if __name__ == "__main__":
    main()
