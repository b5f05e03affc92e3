"""A replica's routes: (method, path, handler) declared with Starlette's routing, matched in the replica's ``__call__``.

The replica answers HTTP in its own ``__call__`` (no web framework between Ray Serve and it:
FastAPI's routing, dependency solving and query parsing cost more than a small model's run), so
Starlette's ``Router`` holds the routes and :func:`match` finds the one a request takes, as the
router does when it is the application: the first route whose path and method match; 405 where
only other methods have the path, else 404. A handler takes the request; its path parameters
are ``request.path_params``. Paths are below the application's route prefix (Ray Serve puts the
prefix in ``root_path``).

>>> async def infer(request): ...
>>> router = Router([route("POST", "/v2/models/{name}/infer", infer)])
>>> def scope(method, path): return {"type": "http", "method": method, "path": path, "root_path": "/portable"}
>>> endpoint, params = match(router, scope("POST", "/portable/v2/models/mlp/infer"))
>>> endpoint is infer, params
(True, {'name': 'mlp'})
>>> match(router, scope("GET", "/portable/v2/models/mlp/infer")), match(router, scope("POST", "/nowhere"))
(405, 404)
>>> route_path(scope("GET", "/portable/v2/health/live"))
'/v2/health/live'
>>> guarded("/v1/models"), guarded("/v2/models/m/infer"), guarded("/v2/health/ready"), guarded("/v2")
(True, True, False, False)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route, Router
from starlette.types import Scope

Handler = Callable[[Request], Awaitable[Response]]
OPENAI_PREFIX = "/v1"  # OpenAI's API: errors in its shape
OPENAI_SHAPED = ("/tokenize", "/detokenize")  # vLLM's server routes beside /v1: errors in OpenAI's shape too


def openai_shaped(path: str) -> bool:
    """Whether ``path``'s errors are OpenAI's ``{"error": {"message", ...}}`` (else ``{"error": "text"}``).

    >>> openai_shaped("/v1/models"), openai_shaped("/tokenize"), openai_shaped("/v2/models/m/infer")
    (True, True, False)
    """
    return path.startswith(OPENAI_PREFIX) or path in OPENAI_SHAPED


def route(method: str, path: str, handler: Handler) -> Route:
    """``method`` on ``path`` (a Starlette template such as ``/v2/models/{name}``) is answered by ``handler``."""
    found = Route(path, handler, methods=[method])
    found.methods = {method}  # Starlette adds HEAD to a GET route; the replica answers HEAD with 405, as before
    return found


def match(router: Router, scope: Scope) -> tuple[Handler, dict[str, Any]] | int:
    """(handler, path parameters) of the route ``scope`` takes; 405 where only other methods have its path, else 404."""
    status = 404
    for candidate in router.routes:
        found, child = candidate.matches(scope)
        if found is Match.FULL:
            return child["endpoint"], child["path_params"]
        if found is Match.PARTIAL:
            status = 405
    return status


def slashed(router: Router) -> Router:
    """``router``'s routes whose paths have a ``{name}`` or ``{model}`` parameter, that parameter taking ``/`` too
    (Hugging Face style names, ``org/Model``), the more specific first (a name cannot swallow a route's tail).
    Tried after ``router`` found nothing, so a path it knows keeps its answer (405 included).

    >>> async def meta(request): ...
    >>> async def ready(request): ...
    >>> router = Router([route("GET", "/v2/models/{name}", meta), route("GET", "/v2/models/{name}/ready", ready)])
    >>> def scope(path): return {"type": "http", "method": "GET", "path": path, "root_path": ""}
    >>> [(h.__name__, p) for h, p in (match(slashed(router), scope("/v2/models/org/M/ready")),
    ...                               match(slashed(router), scope("/v2/models/org/M")))]
    [('ready', {'name': 'org/M'}), ('meta', {'name': 'org/M'})]
    """
    found = []
    for old in router.routes:
        if isinstance(old, Route) and ("{name}" in old.path or "{model}" in old.path):
            path = old.path.replace("{name}", "{name:path}").replace("{model}", "{model:path}")
            found.append(route(next(iter(old.methods or {"GET"})), path, old.endpoint))
    found.sort(key=lambda r: (r.path.endswith(":path}"), "versions" not in r.path))
    return Router(found)


def route_path(scope: Mapping[str, Any]) -> str:
    """The request's path below the application's route prefix (Ray Serve puts the prefix in ``root_path``)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root):len(root) + 1] in ("", "/"):
        return path[len(root):]
    return path


def guarded(path: str) -> bool:
    """Whether an API key guards ``path``: OpenAI's routes and every model route (health and ``/v2`` do not)."""
    return path in ("/v1", "/v2/models") or path.startswith(("/v1/", "/v2/models/"))


__all__ = ["Handler", "OPENAI_PREFIX", "openai_shaped", "slashed", "Router", "guarded", "match", "route", "route_path"]
