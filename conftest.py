"""Collection for the whole repository: without the ``serve`` extra (Ray Serve, FastAPI), the doctests of
the pyrt.serve modules that import them are skipped instead of failing to import."""

from __future__ import annotations

import importlib.util

_SERVE_EXTRA = all(importlib.util.find_spec(m) is not None for m in ("ray", "fastapi"))
collect_ignore = [] if _SERVE_EXTRA else [
    "pyrt/serve/app.py", "pyrt/serve/generate.py", "pyrt/serve/metrics.py", "pyrt/serve/replica.py",
    "pyrt/serve/failures.py", "pyrt/serve/openai_api.py", "pyrt/serve/llm_routes.py", "pyrt/serve/llm_metrics.py",
]
