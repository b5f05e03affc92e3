"""``pyrt.generate``: one prompt or many, on a program that follows the convention.

The prompts are one batch of generations of a front end of the program's engine core
(:mod:`pyrt.llm.engine`), which reserves KV-cache slots for them (as many as there are prompts, at
most the file's ``get_max_batch_size``; more prompts wait for one of those) and goes when their last
one ends. A prompt is prefilled in chunks of the
file's token budget (whole, on a dynamic one-sequence file; token by token on a static one),
then each step feeds every running generation's last token. Generation stops at an EOS id
("stop"), at ``max_new_tokens`` ("length"), or when the cache has no position left for the
next token ("cache_full"). A program's slots are shared by everything generating on it: where
none is free, ``generate`` raises :class:`pyrt.BusyError` naming the conflict at once.
``draft`` / ``draft_tokens``: speculative decoding (:mod:`pyrt.llm.drafting`), the same tokens in
fewer passes of the target where the guesses are good.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Any

import numpy as np

from pyrt.errors import InputError
from pyrt.llm.config import GenerationConfig
from pyrt.llm.engine import Engine
from pyrt.llm.outputs import GenerationResult
from pyrt.llm.params import SamplingParams
from pyrt.llm.request import make_request
from pyrt.llm.stepping import core_loop
from pyrt.llm.stream import Generation, wait_all


def generate(program: Any, prompt_ids: Any, *, max_new_tokens: int | None, do_sample: bool = False,
             temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
             seed: Any = None, eos_ids: Any = None, stream: bool = False, method: str = "forward",
             draft: Any = None, draft_tokens: int | None = None, draft_tree: bool | None = None,
             prefix_caching: bool | None = None, **options: Any) -> Any:
    """Generate after ``prompt_ids`` with a :class:`pyrt.Program` that follows ExecuTorch's LLM convention.

    ``prompt_ids``: one prompt (a sequence of ids), or a list of prompts, which share the program's
    forward calls (one step for all; a file of ``max_batch_size`` B runs B at once, the rest as
    slots free) and give one result each, in order, each what that prompt alone gives.
    ``max_new_tokens``: the cap (None: until an EOS id or a full cache). ``do_sample``: False is
    greedy (``transformers``' ``do_sample=False``); True samples with ``temperature``, ``top_k``
    (None: no cut) and ``top_p`` (None: no cut), drawing from ``numpy.random.default_rng(seed)``
    per prompt (``seed``: an int for every prompt, or one per prompt), so a prompt's tokens do not
    depend on its neighbours. ``eos_ids``: ids that stop generation (None: the program's
    ``get_eos_ids``; ``[]``: none). Returns a :class:`GenerationResult` (``.tokens``,
    ``.finish_reason``, ``.timings``) per prompt, or with ``stream=True`` a :class:`Generation` per
    prompt, iterating the new ids as they come. ``draft``: None, ``"ngram"`` (prompt lookup over each
    prompt and its output) or a :class:`pyrt.Program` of a smaller LLM file with this one's vocabulary,
    BOS and EOS ids (:func:`pyrt.llm.open_draft`); ``draft_tokens``: the most tokens guessed per
    sequence per step (None: :class:`~pyrt.llm.config.GenerationConfig`'s default); ``draft_tree``: the
    guesses are a tree of ``draft_tokens`` grown from the draft's probabilities (a slot file that verifies
    trees; None: the config's default). Greedy tokens are exactly those without a draft; sampled ones have exactly
    their distribution (a seed gives the same tokens run to run, not the same as without a draft).
    A file that returns the last position's logits only checks no guesses. ``prefix_caching`` (None:
    :class:`~pyrt.llm.config.GenerationConfig`'s default, on): each prompt takes the program's free KV-cache
    slot holding the longest prefix of it (what earlier generations on the Program left) and prefills only the
    rest (``GenerationResult.cached_tokens``); the tokens are the same. ``options``: the other
    :class:`pyrt.llm.SamplingParams` fields, for every prompt (``repetition_penalty``,
    ``frequency_penalty``, ``presence_penalty``, ``logit_bias``, ``min_tokens``, ``min_p``,
    ``logprobs``, ``stop``, ``grammar``). Everything is checked before the first run: bad values are
    InputError naming them.
    """
    if not isinstance(stream, bool):
        raise InputError(f"stream={stream!r} must be a bool", field="stream")
    given: dict[str, Any] = {"draft_tokens": draft_tokens, "draft_tree": draft_tree, "prefix_caching": prefix_caching}
    config = GenerationConfig(method=method, draft=draft, **{k: v for k, v in given.items() if v is not None})
    conv = core_loop(program, method).conv
    prompts, single = _prompts(prompt_ids)
    seeds = _seeds(seed, len(prompts))
    requests = []
    for i, (prompt, s) in enumerate(zip(prompts, seeds, strict=True)):
        params = SamplingParams(max_new_tokens=max_new_tokens, do_sample=do_sample, temperature=temperature,
                                top_k=top_k, top_p=top_p, seed=s, eos_ids=eos_ids, **options)
        try:
            requests.append(make_request(conv, prompt, params))
        except InputError as exc:
            if single or exc.field != "prompt_ids":
                raise
            raise exc.renamed(f"prompt_ids[{i}]") from None
    engine = Engine.transient(program, config, reserve=min(len(requests), conv.slots))
    if stream:
        streams = engine.add_all(requests)  # BusyError when no slot is free for them
        return streams[0] if single else streams
    streams = engine.post_all(requests, start=False)
    wait_all(streams)  # stepped on this thread (when no other steps the core)
    results = [ended(s) for s in streams]  # the first refusal (a BusyError) or run failure raised
    return results[0] if single else results


def ended(generation: Generation) -> GenerationResult:
    """An ended ``generation``'s result, or its run failure (or refusal) raised."""
    if generation.error is not None:
        raise generation.error
    result = generation.result
    assert result is not None  # it ended: a result or an error
    return result


def _prompts(value: Any) -> tuple[list[Any], bool]:
    """(prompts, whether one prompt was given): a list whose items are sequences is a list of prompts."""
    if isinstance(value, (list, tuple)) and value and all(
            isinstance(p, (Seq, np.ndarray)) and not isinstance(p, (str, bytes)) for p in value):
        return list(value), False
    return [value], True


def _seeds(seed: Any, count: int) -> list[Any]:
    if isinstance(seed, (list, tuple)):
        if len(seed) != count:
            raise InputError(f"seed has {len(seed)} values for {count} prompts: give one per prompt, or one int",
                             field="seed")
        return list(seed)
    return [seed] * count


__all__ = ["generate", "Generation", "GenerationResult", "ended"]
