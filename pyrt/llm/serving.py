"""What ``pyrt.serve``'s generation routes use of ``pyrt.llm``: the engine, its handles, the convention check.

A replica runs one :class:`Engine` per model whose method follows the convention
(:func:`serves`), stepped by its own thread (``pyrt.serve.llm_host``); the HTTP routes
(OpenAI's ``/v1`` and Triton's generate extension) submit to it and read tokens as they come.
Request values are checked by ``Engine.submit`` (InputError naming the field, renamed with
``names`` to the protocol's own field names) before any run.
"""

from __future__ import annotations

from typing import Any

from pyrt.errors import PyrtError
from pyrt.llm.convention import follows_convention
from pyrt.llm.engine import Engine, engine_convention
from pyrt.llm.stream import Generation, GenerationResult


def serves(program: Any, method: str = "forward") -> str | None:
    """None when an :class:`Engine` can run ``program``'s ``method``; else why not (for the routes' 404)."""
    if not follows_convention(program, method):
        return "it does not follow pyrt.llm's convention (forward(tokens, input_pos) -> logits with a KV cache)"
    try:
        engine_convention(program, method)
    except PyrtError as exc:
        return str(exc)
    return None


__all__ = ["Engine", "Generation", "GenerationResult", "follows_convention", "serves"]
