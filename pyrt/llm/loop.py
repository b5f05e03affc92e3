"""``pyrt.generate``: prefill, then one token per forward call, on a program that follows the convention.

The prompt is prefilled in one call when the program's sequence length is dynamic (in
chunks of its bound when longer), token by token otherwise; the KV cache stays in the
program's state (device memory when engines update it). Generation stops at an EOS id
("stop"), at ``max_new_tokens`` ("length"), or when the cache has no position left for the
next token ("cache_full").
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from pyrt.errors import InputError
from pyrt.llm.convention import Convention, read_convention
from pyrt.llm.request import Request, check_request
from pyrt.llm.sampling import sample_token
from pyrt.llm.timings import Clock, Timings

FinishReason = Literal["stop", "length", "cache_full"]  # why a generation ended (see the module docstring)
_NUMPY_FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


@dataclass
class GenerationResult:
    """``tokens``: the new ids (an EOS that stopped generation included, as ``transformers`` does)."""

    tokens: list[int]
    finish_reason: FinishReason
    timings: Timings
    prompt: list[int] = field(default_factory=list)


class Generation:
    """An iterator of new token ids as they come; :attr:`result` once it is exhausted."""

    def __init__(self, program: Any, conv: Convention, request: Request) -> None:
        self.result: GenerationResult | None = None
        self._steps = _run(program, conv, request, self)

    def __iter__(self) -> Iterator[int]:
        return self

    def __next__(self) -> int:
        return next(self._steps)


def generate(program: Any, prompt_ids: Any, *, max_new_tokens: int | None, do_sample: bool = False,
             temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
             seed: int | None = None, eos_ids: Any = None, stream: bool = False, method: str = "forward"
             ) -> Any:
    """Generate after ``prompt_ids`` with a :class:`pyrt.Program` that follows ExecuTorch's LLM convention.

    ``max_new_tokens``: the cap (None: until an EOS id or a full cache). ``do_sample``: False is
    greedy (``transformers``' ``do_sample=False``); True samples with ``temperature``, ``top_k``
    (None: no cut) and ``top_p`` (None: no cut), drawing from ``numpy.random.default_rng(seed)``.
    ``eos_ids``: ids that stop generation (None: the program's ``get_eos_ids``; ``[]``: none).
    Returns a :class:`GenerationResult` (``.tokens``, ``.finish_reason``, ``.timings``), or with
    ``stream=True`` a :class:`Generation` iterating the new ids as they come. Everything is
    checked before the first run: bad values are InputError naming them.
    """
    if not isinstance(stream, bool):
        raise InputError(f"stream={stream!r} must be a bool")
    conv = read_convention(program, method)
    request = check_request(conv, prompt_ids, max_new_tokens=max_new_tokens, do_sample=do_sample,
                            temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, eos_ids=eos_ids)
    return start(program, conv, request) if stream else finish(start(program, conv, request))


def start(program: Any, conv: Convention, request: Request) -> Generation:
    """A generation of a checked request (nothing runs until it is iterated)."""
    if conv.batch != 1:
        raise InputError(f"{program.source}: forward takes a batch of {conv.batch}; pyrt generates one sequence")
    if not conv.dynamic and conv.max_prefill != 1:
        raise InputError(f"{program.source}: forward takes exactly {conv.max_prefill} tokens per call (a static "
                         "shape); the convention needs a dynamic length or one token per call")
    return Generation(program, conv, request)


def finish(generation: Generation) -> GenerationResult:
    """Run ``generation`` to its end; its result."""
    for _ in generation:
        pass
    assert generation.result is not None  # set when the iterator ends
    return generation.result


def _run(program: Any, conv: Convention, request: Request, out: Generation) -> Iterator[int]:
    clock = Clock()
    rng = np.random.default_rng(request.seed)
    prompt = list(request.prompt)
    logits = _prefill(program, conv, prompt)
    clock.prefilled = clock.now()
    tokens: list[int] = []
    reason: FinishReason = "length"
    position = len(prompt)
    while True:
        token = sample_token(logits, request.sampling, rng)
        tokens.append(token)
        if len(tokens) == 1:
            clock.first = clock.now()
        yield token
        if token in request.eos_ids:
            reason = "stop"
            break
        if request.max_new_tokens is not None and len(tokens) >= request.max_new_tokens:
            break
        if position >= conv.max_context_len:
            reason = "cache_full"
            break
        logits = _forward(program, conv, [token], position)
        position += 1
    clock.end = clock.now()
    out.result = GenerationResult(tokens, reason, clock.timings(len(prompt), len(tokens)), prompt)


def _prefill(program: Any, conv: Convention, prompt: list[int]) -> np.ndarray:
    """Feed the prompt (whole, in chunks of the bound, or token by token); the last position's logits."""
    step = conv.max_prefill if conv.dynamic else 1
    logits = None
    for begin in range(0, len(prompt), step):
        logits = _forward(program, conv, prompt[begin:begin + step], begin)
    assert logits is not None  # the prompt is not empty (checked)
    return logits


def _forward(program: Any, conv: Convention, tokens: list[int], begin: int) -> np.ndarray:
    """The last position's logits (float32 when the program's are bfloat16, which numpy lacks)."""
    ids = np.asarray([tokens], dtype=np.int64)
    pos = np.arange(begin, begin + (1 if conv.start_position else len(tokens)), dtype=np.int64)
    if conv.torch_io:  # a bfloat16 program runs on torch kernels: torch is imported already
        import torch

        logits = program.run(torch.from_numpy(ids), torch.from_numpy(pos), method=conv.method)
        return logits.reshape(-1, conv.vocab_size)[-1].float().numpy()  # bf16 -> float32 is exact
    logits = program.run(ids, pos, method=conv.method)
    row = np.asarray(logits).reshape(-1, conv.vocab_size)[-1]  # [1, seq, vocab] or the last position's [1, vocab]
    return row if row.dtype in _NUMPY_FLOATS else row.astype(np.float32)  # ml_dtypes' bfloat16 (numpy kernels)
