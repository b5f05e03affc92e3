"""What a served program is loaded with: one frozen record, passed to every replica.

>>> cfg = ServeConfig("model.pte", max_batch_size=16)
>>> cfg.name, cfg.batch_wait_ms, cfg.replicas
('model', 2.0, 1)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyrt.errors import InputError

API_KEY_ENV = "PYRT_API_KEY"
DEFAULT_MAX_REQUEST_BYTES = 64 << 20
DEFAULT_READ_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ServeConfig:
    """Load and serving options of one program (the ``pyrt serve`` flags).

    ``name``: the model name (default: the file's stem; ``/`` allowed, as Hugging Face ids have it);
    ``aliases``: more names clients may send for it (vLLM's ``--served-model-name a b``: answers carry
    ``name``); ``budget``, ``data``, ``kernels``:
    as for :class:`pyrt.Program`; ``gpus_per_replica``: GPUs Ray assigns each replica
    (None: 1 when the program has TensorRT delegates, else 0); ``max_batch_size``: most rows
    one batched run holds (1: no batching); ``batch_wait_ms``: how long a batch waits to
    fill; ``inline_run_ms``: an idle replica runs a method whose last run was shorter on its
    event loop instead of its run thread (that hop costs about 0.5 ms, two thread switches;
    other routes wait at most that long; 0: never). Limits (:mod:`pyrt.serve.limits`):
    ``max_queued_requests``: requests a replica holds waiting for its run thread (None: no
    limit), beyond which an infer request gets 503 with ``Retry-After`` at once, and
    generations waiting for a KV-cache slot, beyond which a generate or OpenAI request gets
    429; ``request_timeout_s``: an infer request not answered within that many seconds of its
    arrival gets 504 (None: no limit); ``read_timeout_s``: a client must send its request
    within that many seconds (408 after). ``tokenizer`` (a local Hugging Face tokenizer
    directory) turns on the text and OpenAI routes; ``api_key`` guards them. ``draft``: speculative
    decoding of the generating models (``"ngram"``, or a draft LLM file loaded fully resident on the
    replica's devices); ``draft_tokens``: the most tokens a sequence guesses per step. The devices a replica
    runs on are not part of its config: :func:`pyrt.serve.app.deployment` binds a devices factory
    (simulated GPUs) to the replica where the application is wired.
    """

    path: str
    name: str = ""
    aliases: tuple[str, ...] = ()
    replicas: int = 1
    gpus_per_replica: float | None = None
    budget: Any = None
    data: tuple[str, ...] = ()
    kernels: str | None = None
    max_batch_size: int = 8
    batch_wait_ms: float = 2.0
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    app_name: str = "pyrt"
    inline_run_ms: float = 2.0
    tokenizer: str | None = None
    api_key: str | None = field(default=None, repr=False)
    max_queued_requests: int | None = None
    request_timeout_s: float | None = None
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    draft: str | None = None
    draft_tokens: int = 4

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", str(Path(self.path).resolve()))
        if not self.name:
            object.__setattr__(self, "name", Path(self.path).stem)
        if isinstance(self.data, (str, os.PathLike)):
            object.__setattr__(self, "data", (str(self.data),))
        object.__setattr__(self, "data", tuple(str(Path(d).resolve()) for d in self.data))
        for key in ("replicas", "max_batch_size", "max_request_bytes"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InputError(f"serve {key}={value!r}: expected a whole number >= 1")
        for key in ("batch_wait_ms", "inline_run_ms"):
            if not getattr(self, key) >= 0:
                raise InputError(f"serve {key}={getattr(self, key)!r}: expected a number of ms >= 0")
        self._check_limits()
        if self.gpus_per_replica is not None and not self.gpus_per_replica >= 0:
            raise InputError(f"serve gpus_per_replica={self.gpus_per_replica!r}: expected a number >= 0")
        object.__setattr__(self, "aliases", tuple(self.aliases))
        for name in (self.name, *self.aliases):
            if not isinstance(name, str) or not name.strip() or any(c.isspace() or not c.isprintable() for c in name):
                raise InputError(f"--name {name!r}: a model name must be non-empty, without spaces or control "
                                 "characters", field="name")
        if len({self.name, *self.aliases}) != 1 + len(self.aliases):
            raise InputError(f"--name {self.name} {' '.join(self.aliases)}: a name is given twice", field="name")
        self._check_generation()

    def _check_generation(self) -> None:
        if self.tokenizer is not None:
            if not Path(self.tokenizer).is_dir():
                raise InputError(f"serve tokenizer={self.tokenizer!r}: not a directory (a local Hugging Face "
                                 "tokenizer: tokenizer.json, tokenizer_config.json)")
            object.__setattr__(self, "tokenizer", str(Path(self.tokenizer).resolve()))
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key.strip()):
            raise InputError("serve api_key: expected a non-empty string")
        if self.draft is not None and self.draft != "ngram":
            if not Path(self.draft).is_file():
                raise InputError(f"--draft {self.draft!r} is neither \"ngram\" nor a file", field="draft")
            object.__setattr__(self, "draft", str(Path(self.draft).resolve()))
        tokens = self.draft_tokens
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
            raise InputError(f"--draft-tokens {tokens!r}: expected a whole number >= 1", field="draft_tokens")

    def _check_limits(self) -> None:
        queued = self.max_queued_requests
        if queued is not None and (not isinstance(queued, int) or isinstance(queued, bool) or queued < 1):
            raise InputError(f"serve max_queued_requests={queued!r}: expected a whole number >= 1 (or None: "
                             "no limit)")
        for key in ("request_timeout_s", "read_timeout_s"):
            value = getattr(self, key)
            if value is None and key == "request_timeout_s":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise InputError(f"serve {key}={value!r}: expected a number of seconds > 0")


def api_key_from_env() -> str | None:
    """``$PYRT_API_KEY`` (None when unset or empty)."""
    return os.environ.get(API_KEY_ENV, "").strip() or None
