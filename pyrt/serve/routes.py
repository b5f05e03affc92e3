"""The Open Inference Protocol's paths and OpenAI's: which replica method answers a request.

The replica answers HTTP in its own ``__call__`` (no web framework between Ray
Serve and it: FastAPI's routing, dependency solving and query parsing cost more
than a small model's run). Paths are Starlette templates; the first route whose
path matches and whose method is the request's wins.

>>> match("POST", "/v2/models/mlp/versions/1/infer")
('infer', {'name': 'mlp', 'version': '1'})
>>> match("GET", "/v2/models/mlp/infer"), match("GET", "/nowhere")
(405, 404)
>>> route_path({"path": "/portable/v2/health/live", "root_path": "/portable"})
'/v2/health/live'
>>> guarded("/v1/models"), guarded("/v2/models/m/infer"), guarded("/v2/health/ready"), guarded("/v2")
(True, True, False, False)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.routing import compile_path


@dataclass(frozen=True)
class Route:
    """``method`` on ``path`` (a Starlette template such as ``/v2/models/{name}``) is answered by ``handler``."""

    method: str
    path: str
    handler: str
    regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "regex", compile_path(self.path)[0])


ROUTES = (  # the hot path first
    Route("POST", "/v2/models/{name}/infer", "infer"),
    Route("POST", "/v2/models/{name}/versions/{version}/infer", "infer"),
    Route("GET", "/v2/health/live", "live"),
    Route("GET", "/v2/health/ready", "ready"),
    Route("GET", "/v2", "server_metadata"),
    Route("GET", "/v2/models/{name}", "model_metadata"),
    Route("GET", "/v2/models/{name}/versions/{version}", "model_metadata"),
    Route("GET", "/v2/models/{name}/ready", "model_ready"),
    Route("GET", "/v2/models/{name}/versions/{version}/ready", "model_ready"),
    Route("GET", "/v2/models/{name}/stats", "model_stats"),
    Route("POST", "/v2/models/{name}/generate", "generate"),
    Route("POST", "/v2/models/{name}/generate_stream", "generate_stream"),
    Route("POST", "/v1/chat/completions", "chat_completions"),
    Route("POST", "/v1/completions", "completions"),
    Route("GET", "/v1/models", "openai_models"),
    Route("GET", "/v1/models/{model}", "openai_model"),
)
OPENAI_PREFIX = "/v1"  # OpenAI's API: errors in its shape



def match(method: str, path: str, routes: tuple[Route, ...] = ROUTES) -> tuple[str, dict[str, str]] | int:
    """(handler, path parameters) for ``method`` on ``path``; 405 where only other methods have the path, else 404."""
    status = 404
    for route in routes:
        found = route.regex.match(path)
        if found is not None:
            if route.method == method:
                return route.handler, found.groupdict()
            status = 405
    return status


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
