"""Generation speed per weight-streaming budget: prefill ms, time to first token, decode tokens/s.

Each row sets the budget (``None``: as loaded), runs ``warmup`` untimed generations, then
``iters`` greedy generations of ``new_tokens`` after a ``prompt_len``-token prompt (ids drawn
from ``seed``, EOS ignored so every generation has the same length), and reports medians.
On the simulated GPU the numbers only show that the sweep works end to end: they time the
CPU reference engines, not a GPU.

>>> with pyrt.Program("m.pte") as prog:                                   # doctest: +SKIP
...     rows = generation_sweep(prog, budgets=["25%", "100%"], prompt_len=16, new_tokens=32)
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

from pyrt.errors import InputError, PyrtError
from pyrt.llm.convention import read_convention
from pyrt.llm.loop import finish, start
from pyrt.llm.request import check_request
from pyrt.llm.timings import Timings

PLOT_SIZE, PLOT_DPI = (8.0, 4.5), 100


def generation_sweep(prog: Any, *, budgets: Sequence[Any] = (None,), prompt_len: int = 16, new_tokens: int = 32,
                     iters: int = 3, warmup: int = 1, seed: int = 0, method: str = "forward"
                     ) -> list[dict[str, Any]]:
    """One row per budget: the per-engine budgets read back and the median timings of ``iters`` generations."""
    conv = read_convention(prog, method)
    if isinstance(prompt_len, bool) or not isinstance(prompt_len, int) or prompt_len < 1:
        raise InputError(f"--prompt-len {prompt_len!r} must be an int >= 1")
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 1:
        raise InputError(f"--iters {iters!r} must be an int >= 1 for a generation benchmark")
    prompt = np.random.default_rng(seed).integers(0, conv.vocab_size, prompt_len).tolist()
    request = check_request(conv, prompt, max_new_tokens=new_tokens, eos_ids=[],
                            names={"prompt_ids": "--prompt-len", "max_new_tokens": "--new-tokens"})
    rows = []
    for budget in budgets:
        if budget is not None:
            prog.set_budget(budget)
        engines = [{"index": w.index, "streamable_bytes": w.streamable_bytes, "budget": w.budget}
                   for w in prog.weight_streaming]
        for _ in range(warmup):
            finish(start(prog, conv, request))
        runs = [finish(start(prog, conv, request)).timings for _ in range(iters)]
        rows.append({"budget": None if budget is None else str(budget), "engines": engines,
                     "streamable_bytes": sum(e["streamable_bytes"] for e in engines),
                     "applied_bytes": sum(e["budget"] or 0 for e in engines), "prompt_tokens": prompt_len,
                     "new_tokens": new_tokens, "generations": iters, **_medians(runs)})
    return rows


def _medians(runs: Sequence[Timings]) -> dict[str, float]:
    keys = ("prefill_ms", "ttft_ms", "decode_ms", "decode_tokens_per_s", "total_ms")
    return {key: statistics.median(getattr(t, key) for t in runs) for key in keys}


def format_generation_rows(rows: Sequence[dict[str, Any]]) -> str:
    """A table: budget, applied bytes, prefill ms, first token ms, decode tokens/s."""
    head = ["budget", "applied", "prefill ms", "first token ms", "decode tok/s", "new tokens"]
    body = [[r["budget"] or "as loaded", _bytes(r["applied_bytes"], r["streamable_bytes"]), f"{r['prefill_ms']:.2f}",
             f"{r['ttft_ms']:.2f}", f"{r['decode_tokens_per_s']:.1f}", str(r["new_tokens"])] for r in rows]
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
