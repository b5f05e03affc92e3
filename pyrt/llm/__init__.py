"""LLM generation on .pte files that follow ExecuTorch's LLM convention.

May import: every layer below the apps (runtime, memory, format, errors) and numpy; never
the other apps: the command line (:mod:`pyrt.tools`, ``pyrt generate``, ``bench --generate``)
and the server (:mod:`pyrt.serve`, lazily) import this package.

Inside: :mod:`~pyrt.llm.params` (what a request asks, checked once), :mod:`~pyrt.llm.request`
(checked against the program), :mod:`~pyrt.llm.scheduler` (who runs, what each feeds: pure),
:mod:`~pyrt.llm.runner` (the program's inputs, the run, :mod:`~pyrt.llm.sampling`,
:mod:`~pyrt.llm.verify`), :mod:`~pyrt.llm.drafting` (speculative decoding's drafts:
:mod:`~pyrt.llm.ngram`, :mod:`~pyrt.llm.draft_model`),
:mod:`~pyrt.llm.core` (one engine core per program method: commands in, updates out; no locks),
:mod:`~pyrt.llm.stepping` (the one thread that steps a core), :mod:`~pyrt.llm.engine` (a front end:
:class:`Engine`), :mod:`~pyrt.llm.stream` (the caller's handle), :mod:`~pyrt.llm.loop`
(``pyrt.generate``).

>>> import pyrt
>>> with pyrt.Program("m.pte") as prog:                                    # doctest: +SKIP
...     out = pyrt.generate(prog, [1, 2, 3], max_new_tokens=32)
...     out.tokens, out.finish_reason, out.timings.decode_tokens_per_s
...     for token in pyrt.generate(prog, [1, 2, 3], max_new_tokens=8, stream=True):
...         print(token)
...     many = pyrt.generate(prog, [[1, 2, 3], [4, 5]], max_new_tokens=32)   # one result per prompt
...     fast = pyrt.generate(prog, [1, 2, 3], max_new_tokens=32, draft="ngram")  # the same tokens, fewer passes
...     engine = pyrt.llm.Engine(prog)                                   # continuous batching
...     s = engine.submit([1, 2, 3], params=pyrt.llm.SamplingParams(max_new_tokens=8))
...     s.wait()
"""

from __future__ import annotations

from pyrt.llm.config import GenerationConfig
from pyrt.llm.convention import Convention, follows_convention, read_convention
from pyrt.llm.drafting import Drafter, open_draft
from pyrt.llm.engine import Engine
from pyrt.llm.loop import generate
from pyrt.llm.ngram import NgramDrafter
from pyrt.llm.outputs import FinishReason, GenerationResult
from pyrt.llm.params import SamplingParams
from pyrt.llm.program import serves
from pyrt.llm.request import Request, make_request
from pyrt.llm.stepping import CoreLoop, core_loop
from pyrt.llm.stream import Generation
from pyrt.llm.timings import Timings

__all__ = ["generate", "Engine", "GenerationConfig", "Generation", "GenerationResult", "FinishReason",
           "SamplingParams", "Request", "make_request", "serves", "core_loop", "CoreLoop", "Timings", "Convention",
           "follows_convention", "read_convention", "open_draft", "Drafter", "NgramDrafter"]


def __getattr__(name: str) -> object:
    if name == "LLMProgram":  # before the engine core: what held a Program's convention and slots
        import warnings

        warnings.warn("pyrt.llm.LLMProgram is gone: a Program's engine core (its convention, its KV-cache slots) is "
                      "pyrt.llm.core_loop(program, method)", DeprecationWarning, stacklevel=2)
        return core_loop
    raise AttributeError(f"module 'pyrt.llm' has no attribute {name!r}")
