"""The choices of one OpenAI request: n generations of one prompt turned into choices, whole or as deltas.

:func:`deltas` turns one generation's pieces (:func:`pyrt.serve.llm_host.pieces`) into the deltas a
stream sends: text, and the log-probabilities of the tokens consumed since the last delta (tokens
whose text is held back, an incomplete character or the start of a stop string, go with the next
delta that has text); :func:`merged` interleaves several choices' deltas as they come.
:func:`best` keeps the ``n`` of ``best_of`` generations with the highest cumulative log-probability
(vLLM's and OpenAI's ``best_of``), in their submission order.

>>> best([-3.0, -1.0, -2.0, -0.5], 2)
[1, 3]
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyrt.serve.llm_host import Job, pieces
from pyrt.serve.text import TextStream


@dataclass
class Delta:
    """What choice ``index`` gives a stream now: text, its tokens' log-probabilities, at the end its reason."""

    index: int
    text: str
    items: list[Any] = field(default_factory=list)  # pyrt.llm.processors.TokenLogprob per token
    finish_reason: str | None = None
    consumed: int = 0  # new tokens accounted for so far


async def deltas(index: int, job: Job, text: TextStream | None, logprobs: bool) -> AsyncIterator[Delta]:
    """Choice ``index``'s deltas: one per piece with text, and the last one (with the finish reason)."""
    sent = 0
    async for piece in pieces(job, text):
        if not piece.text and piece.finish_reason is None:
            continue
        items = job.generation.logprobs[sent:piece.consumed] if logprobs else []
        sent = max(sent, piece.consumed)
        yield Delta(index, piece.text, items, piece.finish_reason, piece.consumed)


async def merged(streams: Sequence[AsyncIterator[Delta]]) -> AsyncIterator[Delta]:
    """The deltas of every stream as they come (each stream's in its order); a failure is raised here."""
    if len(streams) == 1:
        async for delta in streams[0]:
            yield delta
        return
    queue: asyncio.Queue[Delta | BaseException | None] = asyncio.Queue()

    async def pump(stream: AsyncIterator[Delta]) -> None:
        try:
            async for delta in stream:
                await queue.put(delta)
            await queue.put(None)
        except Exception as exc:  # handed to the reader, which raises it
            await queue.put(exc)

    tasks = [asyncio.ensure_future(pump(s)) for s in streams]
    try:
        open_ = len(tasks)
        while open_:
            item = await queue.get()
            if item is None:
                open_ -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for stream in streams:
            await stream.aclose()  # type: ignore[attr-defined]


def best(scores: Sequence[float], n: int) -> list[int]:
    """The indices of the ``n`` highest ``scores`` (ties: the earlier), in index order."""
    ranked = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:n]
    return sorted(ranked)
