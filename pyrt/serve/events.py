"""Server-sent events for the streamed generation routes, and a watch for a client that goes away.

:class:`EventStream` is the response of a streamed route: one ``data:`` event per JSON body the
route yields (:func:`sse`), ending at once when the client disconnects (its async generator is
closed then, whose ``finally`` cancels the generation). :func:`watch_disconnect` is the same
watch for a route that waits for a whole answer.

>>> sse(b'{"a":1}')
b'data: {"a":1}\\n\\n'
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from pydantic import BaseModel
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

MAX_MESSAGES = 10_000  # ASGI messages read while watching for a disconnect (after the body there are none)
DONE = b"data: [DONE]\n\n"


def sse(data: bytes) -> bytes:
    """One server-sent event carrying ``data`` (a JSON document)."""
    return b"data: " + data + b"\n\n"


def sse_of(body: BaseModel, *, leave_out: set[str] | None = None) -> bytes:
    """The event of a response model (``leave_out``: fields not in its JSON)."""
    return sse(body.model_dump_json(exclude=leave_out).encode())


async def watch_disconnect(receive: Receive) -> bool:
    """Wait until the client disconnects (True); False after :data:`MAX_MESSAGES` other messages."""
    for _ in range(MAX_MESSAGES):
        message = await receive()
        if message.get("type") == "http.disconnect":
            return True
    return False


class EventStream(Response):
    """Server-sent events from ``events``; a client that disconnects ends the stream at once.

    Starlette's ``StreamingResponse`` notices a gone client only at its next write on ASGI 2.4
    servers; a generation waiting for a slot writes nothing for a while, so this one listens.
    Closing ``events`` (an async generator) runs its ``finally``, which cancels the generation.
    """

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[bytes]) -> None:
        self.events = events
        self.status_code = 200
        self.background = None
        self.init_headers({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        sending = asyncio.ensure_future(self._send_all(send))
        watching = asyncio.ensure_future(watch_disconnect(receive))
        try:
            await asyncio.wait({sending, watching}, return_when=asyncio.FIRST_COMPLETED)
            if not sending.done() and not watching.result():  # no disconnect message will come
                await sending
        finally:
            for task in (sending, watching):
                task.cancel()
            await asyncio.gather(sending, watching, return_exceptions=True)
            await self.events.aclose()  # type: ignore[attr-defined]

    async def _send_all(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        try:
            async for data in self.events:
                await send({"type": "http.response.body", "body": data, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # the client went away mid-write
            return
