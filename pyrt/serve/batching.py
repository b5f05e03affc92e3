"""Dynamic batching: requests that arrived together run as one, concatenated along the leading dim.

Requests whose inputs agree in every dim but the first are grouped, packed in
arrival order into runs of at most ``limit`` rows (the server's max batch size,
never above the method's declared bound), run once, and split back: each
caller gets the rows an unbatched run gives, to within float rounding (:data:`RTOL`,
:data:`ATOL`: the promise the README's Serve section states). A run that fails, or whose
outputs do not keep the batch as their leading dim, is retried one request at
a time, so every caller gets its own result or its own error.

>>> import numpy as np
>>> run = lambda xs: [xs[0] * 2]
>>> results = run_batched(run, [[np.ones((1, 2))], [np.zeros((2, 2))]], limit=8)
>>> [r[0].shape for r in results], float(results[0][0].sum())
([(1, 2), (2, 2)], 4.0)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

#: What batching promises: a caller's float outputs from a batched run equal its unbatched run's within
#: ``numpy.allclose(batched, alone, rtol=RTOL, atol=ATOL)``. A kernel over more rows may sum in another
#: order (any BLAS, TensorRT's tactics), so the last bits may differ (seen: 3e-8 absolute, 2e-6 relative
#: on float32); integer and other exact outputs are equal.
RTOL = 1e-5
ATOL = 1e-6

Run = Callable[[list[np.ndarray]], list[np.ndarray]]
Result = list[np.ndarray] | BaseException


def group(batch: Sequence[Sequence[np.ndarray]]) -> list[list[int]]:
    """Indices of requests that can share a run (same dtypes and trailing dims), in arrival order."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, arrays in enumerate(batch):
        key = tuple((a.dtype.str, a.shape[1:]) for a in arrays)
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def pack(rows: Sequence[int], limit: int) -> list[list[int]]:
    """Consecutive runs of request positions holding at most ``limit`` rows (a larger request runs alone)."""
    out: list[list[int]] = []
    total = 0
    for i, n in enumerate(rows):
        if out and total + n <= limit:
            out[-1].append(i)
            total += n
        else:
            out.append([i])
            total = n
    return out


def split(outputs: Sequence[np.ndarray], rows: Sequence[int]) -> list[list[np.ndarray]]:
    """Each request's rows of every output (views); ValueError when an output does not keep the batch dim."""
    total = sum(rows)
    for k, y in enumerate(outputs):
        if y.ndim == 0 or y.shape[0] != total:
            raise ValueError(f"output {k} has shape {list(y.shape)}, not the {total} batched rows")
    bounds = np.cumsum([0, *rows])
    return [[y[a:b] for y in outputs] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def _single(run: Run, arrays: list[np.ndarray]) -> Result:
    try:
        return run(arrays)
    except Exception as exc:  # handed to that caller: one bad request never fails the others
        return exc


def run_batched(run: Run, batch: Sequence[list[np.ndarray]], limit: int,
                on_batch: Callable[[int], None] | None = None) -> list[Result]:
    """Run ``batch`` (one list of input arrays per request) in as few runs as fit; one result per request.

    ``on_batch(rows)`` is told the rows of every run made.
    """
    results: list[Result | None] = [None] * len(batch)
    for members in group(batch):
        rows = [int(batch[i][0].shape[0]) for i in members]
        for chunk in pack(rows, limit):
            idx = [members[c] for c in chunk]
            if len(idx) == 1:
                results[idx[0]] = _single(run, batch[idx[0]])
                if on_batch:
                    on_batch(rows[chunk[0]])
                continue
            n_inputs = len(batch[idx[0]])
            joined = [np.concatenate([batch[i][k] for i in idx]) for k in range(n_inputs)]
            try:
                parts = split(run(joined), [rows[c] for c in chunk])
                if on_batch:
                    on_batch(sum(rows[c] for c in chunk))
            except Exception:  # isolate the failing request (or a method that does not batch)
                for i in idx:
                    results[i] = _single(run, batch[i])
                    if on_batch:
                        on_batch(int(batch[i][0].shape[0]))
                continue
            for i, part in zip(idx, parts, strict=True):
                results[i] = part
    return [r if r is not None else RuntimeError("request was not run") for r in results]
