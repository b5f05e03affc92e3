"""Continuous batching: :class:`Engine`, a front end of its program's one engine core.

Every :class:`Engine` and ``pyrt.generate`` call on a :class:`pyrt.Program` method talks to the
same :class:`~pyrt.llm.core.EngineCore`, stepped by one thread (:mod:`pyrt.llm.stepping`):
their generations share each forward call and the program's KV-cache slots, and no two ever
share a slot. A front end posts commands to the core's inbox and reads each generation's tokens
from that generation's own outbox (its :class:`~pyrt.llm.stream.Generation` handle); it holds no
state of the core's, and constructs no lock.

Two ways in: blocking calls (:meth:`Engine.submit` / :meth:`Engine.add` return once the core has
queued the generation, raising its refusal; iterating a handle or :meth:`Generation.wait` blocks
on its outbox (stepping the core on the caller's thread while no other thread does); :meth:`Engine.step` runs the
core's next step; :meth:`Engine.paused` holds
the core between steps), and one that never blocks, for an event loop (:meth:`Engine.post`: the
core's verdict arrives on the handle, whose :meth:`~pyrt.llm.stream.Generation.on_update` wakes
the loop). Each step feeds every running generation (a decoding sequence its last token; prompts
in chunks within the file's token budget per step, ``get_max_tokens_per_step``); a queued
generation joins when a slot is free and leaves after its last token, between steps. On a
one-sequence file the core runs one generation at a time, in submission order.

Speculative decoding (``draft="ngram"``, a draft file's path or Program, ``draft_tokens`` k):
before each step the core asks the draft for up to k guesses per decoding sequence
(:meth:`~pyrt.llm.scheduler.Scheduler.guess_room` says how many fit), the step checks them beside
each sequence's last token, and the tokens are exactly those decoding without a draft gives
(:mod:`pyrt.llm.verify`). A file whose logits cover the last position only cannot check any.

>>> with pyrt.Program("m.pte") as prog:                                   # doctest: +SKIP
...     engine = Engine(prog, draft="ngram", draft_tokens=4)
...     a = engine.submit([1, 2, 3], max_new_tokens=8)
...     b = engine.submit([4, 5], params=SamplingParams(max_new_tokens=8, do_sample=True, seed=0))
...     a.wait(); b.wait()
...     a.result.tokens, b.result.finish_reason
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

from pyrt.errors import InputError, TreeUnsupportedError
from pyrt.llm.config import GenerationConfig
from pyrt.llm.core import CloseFront, FrontEnd, Pause, Resume, StepOnce, Submit
from pyrt.llm.drafting import make_drafter
from pyrt.llm.outputs import FinishReason
from pyrt.llm.params import SamplingParams
from pyrt.llm.request import Request, make_request
from pyrt.llm.stepping import core_loop
from pyrt.llm.stream import Generation, Outbox

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from Python 3.11


class GenerationOptions(TypedDict, total=False):
    """:class:`~pyrt.llm.config.GenerationConfig`'s fields, as keywords of :class:`Engine`."""

    method: str
    draft: Any
    draft_tokens: int
    draft_tree: bool
    max_queued: int | None
    prefix_caching: bool


class Engine:
    """A front end of ``program``'s engine core (a :class:`pyrt.Program` following the LLM convention).

    ``config`` (:class:`~pyrt.llm.config.GenerationConfig`, or its fields as keywords): ``max_queued``: a
    submission that would make more than this many generations wait for a KV-cache slot (beyond the
    slots free now, which the next step fills) raises :class:`pyrt.errors.QueueFullError`, a
    :class:`pyrt.BusyError` (None: no bound). ``draft``: None, ``"ngram"`` (prompt lookup), or a draft
    LLM file with the target's vocabulary, BOS and EOS (its path, opened fully resident on the target's
    devices, or its :class:`pyrt.Program`: :func:`pyrt.llm.open_draft`); ``draft_tokens``: the most
    tokens a sequence guesses per step (fewer where its cache, ``max_new_tokens``, or the step's token
    budget and logits rows leave less). Submit and cancel from any thread; :meth:`close` (or dropping
    the engine) cancels what it still has queued or running and lets its draft go.
    """

    def __init__(self, program: Any, config: GenerationConfig | None = None, **options: Unpack[GenerationOptions]
                 ) -> None:
        if config is None:
            config = GenerationConfig(**options)
        elif options:
            raise InputError(f"give config or its fields as keywords, not both (got {sorted(options)})")
        self._open(program, config)

    @classmethod
    def transient(cls, program: Any, config: GenerationConfig, reserve: int) -> Engine:
        """A front end for one batch of generations (``pyrt.generate``'s): ``reserve`` slots set aside for it at
        its first submission (none free: its generations are refused with a BusyError), it and its draft gone when
        its last generation ends."""
        engine = cls.__new__(cls)
        engine._open(program, config, reserve)
        return engine

    def _open(self, program: Any, config: GenerationConfig, reserve: int = 0) -> None:
        self.config = config
        self._core = core_loop(program, config.method)
        self.conv, self.program = self._core.conv, self._core.program
        if config.draft_tree and not self.conv.tree:
            raise TreeUnsupportedError(self.source)
        drafter = make_drafter(config.draft, self._core)
        self._front = FrontEnd(self._core.new_id(), drafter, config.draft_tokens, config.max_queued, reserve,
                               transient=bool(reserve), prefix_caching=config.prefix_caching,
                               draft_tree=config.draft_tree)
        self._closer = weakref.finalize(self, self._core.post, CloseFront(self._front))
        if reserve:
            self._closer.detach()  # a transient front end: the core lets it go after its last generation

    # -- what a caller sees -----------------------------------------------------------------------
    @property
    def source(self) -> str:
        return self._core.source

    @property
    def slots(self) -> int:
        """Sequences one step can hold (the file's ``get_max_batch_size``; 1 for a one-sequence file)."""
        return self.conv.slots

    def _counts(self) -> tuple[int, int]:
        for front, queued, running in self._core.published.fronts:
            if front == self._front.id:
                return queued, running
        return 0, 0

    @property
    def queued(self) -> int:
        """This engine's generations that hold no slot yet (as the core last published)."""
        return self._counts()[0]

    @property
    def running(self) -> int:
        """This engine's generations holding a slot (as the core last published)."""
        return self._counts()[1]

    @property
    def pending(self) -> int:
        """This engine's generations queued or running."""
        return sum(self._counts())

    @property
    def draft(self) -> str | None:
        """The draft's name (``"ngram"``, the draft file), or None without one."""
        drafter = self._front.drafter
        return None if drafter is None else str(getattr(drafter, "name", type(drafter).__name__))

    @property
    def drafter(self) -> Any:
        """This engine's draft (None without one): used on the core's thread; read it when the core is idle."""
        return self._front.drafter

    @property
    def max_guesses(self) -> int:
        """The most tokens one sequence may guess per step: ``draft_tokens`` within the logits rows and tokens one
        step takes (0 without a draft, or on a file that returns the last position's logits only)."""
        if self._front.drafter is None:
            return 0
        return max(min(self.config.draft_tokens, self.conv.max_rows - 1, self.conv.tokens_per_step - 1), 0)

    @property
    def alive(self) -> bool:
        """Whether the core takes submissions (its Program is open)."""
        return not self._core.published.stopped

    def stats(self) -> dict[str, Any]:
        """The core's counters (every front end's generations on this method): steps (forward calls of the target),
        generated and prompt tokens, queued and running, slots and free slots, sequences per step, unexpected step
        failures; speculative decoding's ``drafted`` and ``accepted`` guessed tokens, ``acceptance_rate`` and
        ``tokens_per_pass`` (generated tokens per sequence per step that gave it tokens: 1.0 without a draft),
        ``checks`` (sequence passes that checked guesses) and ``accepted_depth`` (guesses accepted per check: a
        chain's accepted run, a tree's accepted path); prefix caching's ``prefix_cache_queries`` (prompt tokens of
        generations that looked for a cached prefix) and ``prefix_cache_hits`` (those found in a slot, not fed;
        ``prompt_tokens`` counts the fed ones); this engine's ``draft``, ``draft_tokens`` (a tree's size with
        ``draft_tree``) and ``draft_tree``. A snapshot: the stepping thread publishes it after each step."""
        p = self._core.published
        return {"steps": p.steps, "tokens_generated": p.tokens_generated, "prompt_tokens": p.prompt_tokens,
                "running": p.running, "slots": self.slots, "occupancy": {str(k): v for k, v in p.occupancy},
                "draft": self.draft, "draft_tokens": self.max_guesses, "drafted": p.drafted, "accepted": p.accepted,
                "acceptance_rate": p.accepted / p.drafted if p.drafted else 0.0,
                "tokens_per_pass": p.tokens_generated / p.passes if p.passes else 0.0,
                "draft_tree": self.config.draft_tree, "checks": p.checks,
                "accepted_depth": p.accepted / p.checks if p.checks else 0.0,
                "queued": p.queued, "free_slots": p.free_slots, "step_failures": p.failures,
                "prefix_cache_queries": p.prefix_cache_queries, "prefix_cache_hits": p.prefix_cache_hits}

    # -- submitting (any thread) ------------------------------------------------------------------
    def submit(self, prompt_ids: Any, params: SamplingParams | None = None, **sampling: Any) -> Generation:
        """Queue a generation of ``prompt_ids``; its handle, once the core has queued it. ``params``, or the same
        fields as keywords (``max_new_tokens``, ``do_sample``, ``temperature``, ``top_k``, ``top_p``, ``seed``,
        ``eos_ids``, ``stop``: token-id sequences that end it, ``finish_reason == "stop"``). Every value is checked
        here (InputError naming it); BusyError past ``max_queued``."""
        if params is None:
            params = SamplingParams(**sampling)
        elif sampling:
            raise InputError(f"give params or sampling keywords, not both (got {sorted(sampling)})")
        return self.add(make_request(self.conv, prompt_ids, params))

    def add(self, request: Request) -> Generation:
        """Queue an already checked request (:func:`pyrt.llm.request.make_request` for this engine's program); its
        handle once the core has queued it (its refusal raised)."""
        return self.add_all([request])[0]

    def add_all(self, requests: Sequence[Request]) -> list[Generation]:
        """Queue several requests at once (one command: they join the same step); raises the first refusal, and
        then none of them runs."""
        handles = self.post_all(requests, start=False)
        for handle in handles:
            handle.wait_accepted()  # steps the core here while no other thread does
        for handle in handles:
            if not handle.accepted and handle.error is not None:  # refused (a later run failure is the handle's)
                for other in handles:
                    other.cancel()
                raise handle.error
        return handles

    def post(self, request: Request) -> Generation:
        """Queue ``request`` without waiting (an event loop's way in): the core's refusal, if any, ends the handle
        (:attr:`~pyrt.llm.stream.Generation.error`)."""
        return self.post_all([request])[0]

    def post_all(self, requests: Sequence[Request], start: bool = True) -> list[Generation]:
        """:meth:`post` for several requests at once (one command: they join the same step); ``start=False`` leaves
        the stepping to the caller, who waits for them next (:func:`pyrt.llm.stream.wait_all` steps the core)."""
        now, handles, items = time.perf_counter(), [], []
        for request in requests:
            seq_id, outbox = self._core.new_id(), Outbox()
            handles.append(Generation(self._core, seq_id, request.prompt, outbox))
            items.append((seq_id, request, outbox, now))
        self._core.post(Submit(self._front, tuple(items)), start)
        return handles

    def cancel(self, generation: Generation, reason: FinishReason = "cancelled") -> None:
        """End ``generation`` at the core's next step with ``finish_reason`` ``reason``, keeping its tokens."""
        generation.cancel(reason)

    # -- the core's pace --------------------------------------------------------------------------
    def step(self) -> int:
        """Wait for the core's next step (run at once while it is paused); how many sequences it carried (0 when
        it had no work)."""
        carried: int = self._core.call(StepOnce)
        return carried

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """``with engine.paused():`` the core runs no step inside the block but those :meth:`step` asks for
        (submissions queue, as when steps are slow)."""
        self._core.call(Pause)
        try:
            yield
        finally:
            self._core.post(Resume())

    def close(self) -> None:
        """Cancel this engine's generations still queued or running and let its draft go (waits for the core)."""
        if self._closer.detach() is not None:
            self._core.call(lambda reply: CloseFront(self._front, reply))


__all__ = ["Engine", "GenerationOptions"]
