"""A loaded program as generation sees it: the Program, its convention, its KV-cache slots.

:class:`LLMProgram` is made once per engine (``pyrt.llm.Engine``, ``pyrt.generate``) from a
:class:`pyrt.Program` that follows the convention; the slot pool is kept with the Program
itself (:meth:`pyrt.Program.extension`), so every engine and call on one Program shares it
and it lives and ends with the Program. :func:`serves` says whether (and why not) a method
can generate, for servers that pick the methods they offer.

>>> llm = LLMProgram(pyrt.Program("m.pte"))                              # doctest: +SKIP
>>> llm.conv.slots, llm.slots.free                                       # doctest: +SKIP
(4, 4)
"""

from __future__ import annotations

from typing import Any

from pyrt.errors import InputError, PyrtError
from pyrt.llm.convention import SINGLE, Convention, follows_convention, read_convention
from pyrt.llm.slots import SlotPool

SLOTS_KEY = "pyrt.llm.slots"  # the Program extension holding its slot pool


class LLMProgram:
    """``program``'s ``method`` under the LLM convention (InputError naming what does not conform)."""

    def __init__(self, program: Any, method: str = "forward") -> None:
        self.program = program
        self.conv = engine_convention(program, method)
        size, source = self.conv.slots, str(program.source)
        self.slots: SlotPool = program.extension(SLOTS_KEY, lambda: SlotPool(size, source))

    @classmethod
    def of(cls, program: Any, conv: Convention, slots: SlotPool) -> LLMProgram:
        """An LLMProgram from its parts: ``program`` (anything with ``run(*inputs, method=...)``) whose convention
        is ``conv``, its slots ``slots`` (a stand-in program in tests, one whose convention was read elsewhere)."""
        llm = cls.__new__(cls)
        llm.program, llm.conv, llm.slots = program, conv, slots
        return llm

    @property
    def source(self) -> str:
        return str(self.program.source)


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
