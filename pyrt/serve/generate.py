"""Generation routes for programs that follow ``pyrt.llm``'s convention (``/generate``, ``/generate_stream``).

``pyrt.llm.serving`` is imported lazily; where it is missing, or the program does
not follow its convention, both routes answer 404. Generation is not batched:
each request runs on the replica's worker thread, token by token.
"""


import asyncio
import json
from collections.abc import AsyncIterator, Iterator, Mapping
from concurrent.futures import Executor
from types import ModuleType
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from pyrt.errors import InputError, PyrtError

_DONE = object()


def llm_serving() -> ModuleType | None:
    """``pyrt.llm.serving``, or None where it cannot be imported."""
    try:
        from pyrt.llm import serving  # lazily: only replicas that serve load LLM generation
    except ImportError:
        return None
    return serving


def _status(exc: BaseException) -> int:
    return 400 if isinstance(exc, InputError) else 500


def _error(exc: BaseException) -> JSONResponse:
    text = str(exc) if isinstance(exc, PyrtError) else f"{type(exc).__name__}: {exc}"
    return JSONResponse({"error": text}, status_code=_status(exc))


class Generation:
    """The generate routes of one replica's models."""

    def __init__(self, program: Any, models: Mapping[str, Any], pool: Executor) -> None:
        self.program, self.pool = program, pool
        self.module = llm_serving()
        self.models = {}
        if self.module is not None:
            for name, info in models.items():
                try:
                    ok = bool(self.module.follows_convention(program, info.method))
                except PyrtError:
                    ok = False
                if ok:
                    self.models[name] = info

    async def generate(self, name: str, request: Request, *, stream: bool) -> Response:
        if name not in self.models or self.module is None:
            return JSONResponse({"error": f"model {name!r} does not generate (it does not follow pyrt.llm's "
                                          "convention, or pyrt.llm is not installed)"}, status_code=404)
        try:
            body = json.loads(await request.body())
            if not isinstance(body, dict):
                raise InputError(f"model {name!r}: the generate request must be a JSON object")
        except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested too deeply
            return _error(InputError(f"model {name!r}: the request is not valid JSON ({exc})"))
        except InputError as exc:
            return _error(exc)
        try:
            method = self.models[name].method  # the contract's signature is (program, body); forward is its default
            extra = {} if method == "forward" else {"method": method}
            events = self.module.generate_events(self.program, body, **extra)
        except Exception as exc:  # validation before any run: InputError -> 400
            return _error(exc)
        first = await self._next(events)  # validation errors surface here, before any status is sent
        if isinstance(first, BaseException):
            return _error(first)
        if stream:
            return StreamingResponse(self._sse(first, events), media_type="text/event-stream")
        last = first
        while last is not _DONE and "finish_reason" not in last:
            last = await self._next(events)
            if isinstance(last, BaseException):
                return _error(last)
        final: dict[str, Any] = last if isinstance(last, dict) else {}
        return JSONResponse({"model_name": name, "token_ids": final.get("token_ids", []),
                             "finish_reason": final.get("finish_reason"), "timings": final.get("timings", {})})

    async def _next(self, events: Iterator[dict[str, Any]]) -> Any:
        def step() -> Any:
            try:
                return next(events, _DONE)
            except Exception as exc:  # handed back: the route answers it
                return exc

        return await asyncio.get_running_loop().run_in_executor(self.pool, step)

    async def _sse(self, first: Any, events: Iterator[dict[str, Any]]) -> AsyncIterator[bytes]:
        event = first
        while event is not _DONE:
            if isinstance(event, BaseException):
                text = str(event) if isinstance(event, PyrtError) else f"{type(event).__name__}: {event}"
                yield f"data: {json.dumps({'error': text})}\n\n".encode()
                return
            yield f"data: {json.dumps(event)}\n\n".encode()
            event = await self._next(events)
