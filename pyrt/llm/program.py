"""Whether a loaded program can generate, as an engine runs it: :func:`engine_convention`, :func:`serves`.

:func:`engine_convention` reads a method's convention (:mod:`pyrt.llm.convention`) and refuses
what an engine core cannot run (a fixed batch that moves in step; a static length of more than
one token); :func:`serves` says whether (and why not) a method can generate, for servers that
pick the methods they offer.

>>> serves(pyrt.Program("resnet.pte"))                                     # doctest: +SKIP
"it does not follow pyrt.llm's convention (forward(tokens, input_pos) -> logits with a KV cache)"
"""

from __future__ import annotations

from typing import Any

from pyrt.errors import InputError, PyrtError
from pyrt.llm.convention import SINGLE, Convention, follows_convention, read_convention


def engine_convention(program: Any, method: str) -> Convention:
    """``program``'s convention, checked for what an engine runs."""
    conv = read_convention(program, method)
    if conv.layout == SINGLE and conv.batch != 1:
        raise InputError(f"{program.source}: forward takes a fixed batch of {conv.batch} sequences that move in step; "
                         "pyrt generates on files of batch 1 or on slot files (decoder_to_pte(max_batch_size=...))")
    if conv.layout == SINGLE and not conv.dynamic and conv.max_prefill != 1:
        raise InputError(f"{program.source}: forward takes exactly {conv.max_prefill} tokens per call (a static "
                         "shape); the convention needs a dynamic length or one token per call")
    return conv


def serves(program: Any, method: str = "forward") -> str | None:
    """None when an engine can run ``program``'s ``method``; else why not (for a server's 404)."""
    if not follows_convention(program, method):
        return "it does not follow pyrt.llm's convention (forward(tokens, input_pos) -> logits with a KV cache)"
    try:
        engine_convention(program, method)
    except PyrtError as exc:
        return str(exc)
    return None
