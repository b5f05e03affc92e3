"""Generation speed per weight-streaming budget and batch size: prefill ms, first token, decode tokens/s.

Each row sets the budget (``None``: as loaded), runs ``warmup`` untimed rounds, then ``iters``
rounds of ``batch`` greedy generations at once (one ``pyrt.generate`` call; a file of
``max_batch_size`` >= ``batch`` runs them in the same steps) of ``new_tokens`` after
``prompt_len``-token prompts (ids drawn from ``seed``, EOS ignored so every generation has the
same length), and reports medians. ``aggregate_tokens_per_s`` is every sequence's decode tokens
per second of the round's decode; ``link_bound_tokens_per_s`` the model to judge it by when
weights stream: ``batch * BW / S``, S the bytes a step streams (streamable minus the budget),
BW the host-to-device bandwidth given (or measured: :func:`host_to_device_bandwidth`).
On the simulated GPU the numbers only show that the sweep works end to end: they time the
CPU reference engines, not a GPU.

>>> with pyrt.Program("m.pte") as prog:                                   # doctest: +SKIP
...     rows = generation_sweep(prog, budgets=["25%", "100%"], batches=[1, 8], prompt_len=16, new_tokens=32)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

import pyrt.cuda as cuda
from pyrt.errors import InputError, PyrtError
from pyrt.llm.convention import read_convention
from pyrt.llm.loop import generate
from pyrt.llm.outputs import GenerationResult
from pyrt.llm.params import SamplingParams
from pyrt.llm.request import make_request

PLOT_SIZE, PLOT_DPI = (8.0, 4.5), 100


def generation_sweep(prog: Any, *, budgets: Sequence[Any] = (None,), batches: Sequence[int] = (1,),
                     prompt_len: int = 16, new_tokens: int = 32, iters: int = 3, warmup: int = 1, seed: int = 0,
                     method: str = "forward", bandwidth: float | None = None) -> list[dict[str, Any]]:
    """One row per (budget, batch): budgets read back, median timings of ``iters`` rounds, the link's bound."""
    conv = read_convention(prog, method)
    if isinstance(prompt_len, bool) or not isinstance(prompt_len, int) or prompt_len < 1:
        raise InputError(f"--prompt-len {prompt_len!r} must be an int >= 1")
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 1:
        raise InputError(f"--iters {iters!r} must be an int >= 1 for a generation benchmark")
    for b in batches:
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise InputError(f"--batch {b!r} must be an int >= 1")
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, conv.vocab_size, prompt_len).tolist() for _ in range(max(batches))]
    try:
        make_request(conv, prompts[0], SamplingParams(max_new_tokens=new_tokens, eos_ids=()))
    except InputError as exc:  # named as the command line spells them
        flag = {"prompt_ids": "--prompt-len", "max_new_tokens": "--new-tokens"}.get(exc.field or "")
        raise exc if flag is None else exc.renamed(flag) from None
    rows = []
    for budget in budgets:
        if budget is not None:
            prog.set_budget(budget)
        engines = [{"index": w.index, "streamable_bytes": w.streamable_bytes, "budget": w.budget}
                   for w in prog.weight_streaming]
        streamable = sum(e["streamable_bytes"] for e in engines)
        streamed = streamable - sum(min(e["budget"] or 0, e["streamable_bytes"]) for e in engines)
        for batch in batches:
            for _ in range(warmup):
                _round(prog, prompts[:batch], new_tokens, method)
            runs = [_round(prog, prompts[:batch], new_tokens, method) for _ in range(iters)]
            rows.append({"budget": None if budget is None else str(budget), "batch": batch, "engines": engines,
                         "streamable_bytes": streamable, "applied_bytes": streamable - streamed,
                         "streamed_bytes": streamed, "prompt_tokens": prompt_len, "new_tokens": new_tokens,
                         "generations": iters, **_medians(runs),
                         "link_bound_tokens_per_s": batch * bandwidth / streamed if bandwidth and streamed else None})
    return rows


def _round(prog: Any, prompts: list[list[int]], new_tokens: int, method: str) -> list[GenerationResult]:
    """One round: the prompts generated together (one call; they share steps as the file's slots allow)."""
    got: list[GenerationResult] = generate(prog, prompts, max_new_tokens=new_tokens, eos_ids=[], method=method,
                                           prefix_caching=False)  # each round prefills its prompts whole
    return got


def _medians(runs: Sequence[list[GenerationResult]]) -> dict[str, float]:
    """Per round: the first sequence's timings and every sequence's decode tokens per second of the decode."""
    keys = ("prefill_ms", "ttft_ms", "decode_ms", "decode_tokens_per_s", "total_ms")
    out = {key: statistics.median(getattr(results[0].timings, key) for results in runs) for key in keys}
    out["aggregate_tokens_per_s"] = statistics.median(_aggregate(results) for results in runs)
    return out


def _aggregate(results: Sequence[GenerationResult]) -> float:
    """Every sequence's decode tokens (after its first) per second from the earliest first token to the last end.

    The sequences of one call start their clocks together, so their times share an origin.
    """
    tokens = sum(max(len(r.tokens) - 1, 0) for r in results)
    seconds = (max(r.timings.total_ms for r in results) - min(r.timings.ttft_ms for r in results)) / 1e3
    return tokens / seconds if seconds > 0 else 0.0


def host_to_device_bandwidth(nbytes: int = 256 << 20) -> tuple[float, str]:
    """(bytes/s, how) of a host-to-device copy on device 0: pinned memory through torch's CUDA when it has one
    (what weight streaming's copies run at), else a pageable copy through ``pyrt.cuda`` (slower)."""
    try:
        import torch  # extra: torch

        if torch.cuda.is_available():
            host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
            best = float("inf")
            for _ in range(4):
                torch.cuda.synchronize()
                t = time.perf_counter()
                dev.copy_(host, non_blocking=True)
                torch.cuda.synchronize()
                best = min(best, time.perf_counter() - t)
            return nbytes / best, "pinned host memory (torch)"
    except ImportError:
        pass
    host_array = np.ones(nbytes, np.uint8)
    best = float("inf")
    with cuda.alloc(nbytes, 0) as dev_buffer:
        for _ in range(4):
            t = time.perf_counter()
            cuda.memcpy_htod(dev_buffer, host_array)
            best = min(best, time.perf_counter() - t)
    return nbytes / best, "pageable host memory (pyrt.cuda; pinned copies run faster)"


def format_generation_rows(rows: Sequence[dict[str, Any]]) -> str:
    """A table: budget, batch, applied bytes, prefill and first-token ms, decode tokens/s, the link's bound."""
    head = ["budget", "batch", "applied", "prefill ms", "first token ms", "decode tok/s", "all seqs tok/s",
            "B*BW/S tok/s", "new tokens"]
    body = [[r["budget"] or "as loaded", str(r["batch"]), _bytes(r["applied_bytes"], r["streamable_bytes"]),
             f"{r['prefill_ms']:.2f}", f"{r['ttft_ms']:.2f}", f"{r['decode_tokens_per_s']:.1f}",
             f"{r['aggregate_tokens_per_s']:.1f}",
             "-" if r["link_bound_tokens_per_s"] is None else f"{r['link_bound_tokens_per_s']:.1f}",
             str(r["new_tokens"])] for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
    return "\n".join("  ".join(x.rjust(w) for x, w in zip(line, widths, strict=True)) for line in [head, *body])


def _bytes(applied: int, streamable: int) -> str:
    if not streamable:
        return "-"
    return f"{applied} B ({100.0 * applied / streamable:.0f}%)"


def plot_generation(rows: Sequence[dict[str, Any]], path: str, *, title: str = "") -> None:
    """Decode tokens/s against the applied budget (share of streamable weights), PNG/SVG/PDF by suffix."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise PyrtError("--plot needs matplotlib: pip install 'pyrt[plot]'") from None
    streamable = rows[0]["streamable_bytes"] if rows else 0
    xs = [100.0 * r["applied_bytes"] / streamable for r in rows] if streamable else list(range(len(rows)))
    fig = Figure(figsize=PLOT_SIZE, dpi=PLOT_DPI)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.plot(xs, [r["decode_tokens_per_s"] for r in rows], marker="o")
    ax.set_ylabel("decode tokens/s (median)")
    ax.set_xlabel("weight-streaming budget (% of streamable weights, applied)" if streamable
                  else "budget (nothing streams: rows in order)")
    ax.grid(True, alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.savefig(path, dpi=PLOT_DPI)
