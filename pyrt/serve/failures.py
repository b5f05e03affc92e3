"""How a failed request is answered: its HTTP status, and the body in each protocol's shape.

The Open Inference Protocol's routes answer ``{"error": "text"}``; OpenAI's ``/v1`` routes answer
``{"error": {"message", "type", "param", "code"}}`` as OpenAI's API (and vLLM) do, so the
``openai`` client raises its own typed errors (``BadRequestError``, ``NotFoundError``,
``RateLimitError``, ...). Statuses: 400 a bad request (:class:`pyrt.errors.InputError`, naming
the value), 401 no or a wrong API key, 404 an unknown model or path, 429 a full generation queue
(:class:`pyrt.errors.BusyError`), 500 a failed run; the limits' errors carry their own
(:mod:`pyrt.serve.limits`: 408, 413, 503 with ``Retry-After``, 504). OpenAI's ``param`` is the
request field an InputError names (its ``field``, spelled as the client spelled it).

>>> status_of(InputError("max_tokens=0 must be an int >= 1")), openai_body(ApiError("x", 404, param="model"))
(400, {'error': {'message': 'x', 'type': 'invalid_request_error', 'param': 'model', 'code': None}})
>>> openai_body(InputError("max_tokens=0 must be an int >= 1", field="max_tokens"))["error"]["param"]
'max_tokens'
>>> status_of(Overloaded("full")), status_of(RuntimeError("boom")), headers_of(BusyError("busy"))
(503, 500, {'Retry-After': '1'})
"""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from pyrt.errors import BusyError, InputError, PyrtError
from pyrt.serve.limits import RETRY_AFTER_S, Overloaded

TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
         405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error"}
CODES = {401: "invalid_api_key", 429: "queue_full"}


class ApiError(InputError):
    """A request refused with ``status``, naming the request field ``param`` (None: no one field)."""

    def __init__(self, message: str, status: int = 400, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message, field=param)
        self.status, self.code = status, code

    @property
    def param(self) -> str | None:
        return self.field


def status_of(exc: BaseException) -> int:
    """The HTTP status a failure is answered with: its own (the limits' errors carry one), else by kind."""
    if isinstance(exc, ApiError):
        return exc.status
    status = getattr(exc, "http_status", None)
    if isinstance(status, int):
        return status
    if isinstance(exc, BusyError):
        return 429
    return 400 if isinstance(exc, InputError) else 500


def headers_of(exc: BaseException) -> dict[str, str]:
    """Extra headers of a failure's answer: ``Retry-After`` for a full queue (503) or generation queue (429)."""
    return {"Retry-After": str(RETRY_AFTER_S)} if isinstance(exc, (Overloaded, BusyError)) else {}


def message_of(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, PyrtError) else f"{type(exc).__name__}: {exc}"


def error_response(exc: BaseException) -> JSONResponse:
    """The Open Inference Protocol's answer: ``{"error": "text"}`` with :func:`status_of`'s status."""
    return JSONResponse({"error": message_of(exc)}, status_code=status_of(exc), headers=headers_of(exc))


def param_of(exc: BaseException) -> str | None:
    """The request field a failure names (an InputError's ``field``), else None."""
    return exc.field if isinstance(exc, InputError) else None


def openai_body(exc: BaseException) -> dict[str, Any]:
    """OpenAI's error object for ``exc``: its message, type, the field it names, a code."""
    status = status_of(exc)
    code = exc.code if isinstance(exc, ApiError) and exc.code else CODES.get(status)
    return {"error": {"message": message_of(exc), "type": TYPES.get(status, "server_error"),
                      "param": param_of(exc), "code": code}}


def openai_response(exc: BaseException, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(openai_body(exc), status_code=status_of(exc), headers={**headers_of(exc), **(headers or {})})
