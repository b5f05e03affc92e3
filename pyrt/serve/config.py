"""What a served program is loaded with, and where ``pyrt serve`` serves it: frozen records, each checked once.

:class:`ServeConfig` goes to every replica; it embeds the :class:`pyrt.llm.config.GenerationConfig` the
replica's engines generate with (``cfg.generation``). :class:`StartOptions` is the command's own (where
HTTP listens, which Ray). Each default is written here, once: the ``pyrt serve`` flags
(:mod:`pyrt.serve.flags`) read theirs from these fields. A bad value is an
:class:`pyrt.errors.InputError` whose ``field`` is the field it names (``generation.max_queued`` for
the embedded config's), for the command line to spell as its flag.

>>> cfg = ServeConfig("model.pte", max_batch_size=16, generation=GenerationConfig(draft="ngram"))
>>> cfg.name, cfg.batch_wait_ms, cfg.replicas, cfg.generation.draft_tokens, cfg.max_queued_requests
('model', 2.0, 1, 4, None)
>>> ServeConfig("model.pte", replicas=0)
Traceback (most recent call last):
...
pyrt.errors.InputError: replicas=0 must be an int >= 1
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyrt.checks import checked_int, checked_number, is_number
from pyrt.errors import InputError
from pyrt.llm.config import GenerationConfig

API_KEY_ENV = "PYRT_API_KEY"
PORT_END = 1 << 16  # TCP ports are 1 to 65535
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
# Ray 2.x: set as Ray is imported, its node IP is the loopback's, and a node started with _node_ip_address
# 127.0.0.1 has every process listen there (GCS, raylet, agents, workers); without it Ray listens on every
# interface whatever --host says
RAY_LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


@dataclass(frozen=True)
class ServeConfig:
    """Load and serving options of one program (the ``pyrt serve`` flags).

    ``name``: the model name (default: the file's stem; ``/`` allowed, as Hugging Face ids have it);
    ``aliases``: more names clients may send for it (vLLM's ``--served-model-name a b``: answers carry
    ``name``); ``budget``, ``data``, ``kernels``:
    as for :class:`pyrt.Program`; ``gpus_per_replica``: GPUs Ray assigns each replica
    (None: 1 when the program has TensorRT delegates, else 0; :func:`pyrt.serve.app.deployment`
    resolves it), ``cpus_per_replica`` the CPUs it reserves; ``max_batch_size``: most rows
    one batched run holds (1: no batching); ``batch_wait_ms``: how long a batch waits to
    fill; ``inline_run_ms``: an idle replica runs a method whose last run was shorter on its
    event loop instead of its run thread (that hop costs about 0.5 ms, two thread switches;
    other routes wait at most that long; 0: never). Limits (:mod:`pyrt.serve.limits`):
    :attr:`max_queued_requests`; ``request_timeout_s``: an infer request not answered within that
    many seconds of its arrival gets 504 (None: no limit); ``read_timeout_s``: a client must send
    its request within that many seconds (408 after). ``tokenizer`` (a local Hugging Face tokenizer
    directory) turns on the text and OpenAI routes (``chat_template``: a Jinja file that replaces the tokenizer's
    chat template, as vLLM's ``--chat-template``); ``api_key`` guards them. ``generation``: what the
    engines of the generating models take (speculative decoding's ``draft`` and ``draft_tokens``, the
    queue bound ``max_queued``; each model's ``method`` is its own). The devices a replica runs on are
    not part of its config: :func:`pyrt.serve.app.deployment` binds a devices factory (simulated GPUs)
    to the replica where the application is wired.
    """

    path: str
    name: str = ""
    aliases: tuple[str, ...] = ()
    replicas: int = 1
    gpus_per_replica: float | None = None
    cpus_per_replica: float = 1.0
    budget: Any = None
    data: tuple[str, ...] = ()
    kernels: str | None = None
    max_batch_size: int = 8
    batch_wait_ms: float = 2.0
    max_request_bytes: int = 64 << 20
    app_name: str = "pyrt"
    inline_run_ms: float = 2.0
    tokenizer: str | None = None
    chat_template: str | None = None
    api_key: str | None = field(default=None, repr=False)
    request_timeout_s: float | None = None
    read_timeout_s: float = 30.0
    generation: GenerationConfig = field(default_factory=GenerationConfig)

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", str(Path(self.path).resolve()))
        if not self.name:
            object.__setattr__(self, "name", Path(self.path).stem)
        data = (self.data,) if isinstance(self.data, (str, os.PathLike)) else self.data
        object.__setattr__(self, "data", tuple(str(Path(d).resolve()) for d in data))
        for key in ("replicas", "max_batch_size", "max_request_bytes"):
            checked_int(getattr(self, key), key, low=1)
        for key in ("batch_wait_ms", "inline_run_ms", "cpus_per_replica"):
            checked_number(getattr(self, key), key, low=0)
        if self.gpus_per_replica is not None:
            checked_number(self.gpus_per_replica, "gpus_per_replica", low=0)
        self._check_limits()
        self._check_names()
        self._check_generation()

    @property
    def max_queued_requests(self) -> int | None:
        """Requests a replica holds waiting (None: no limit): infer requests waiting for its run thread, beyond
        which one gets 503 with ``Retry-After`` at once, and generations waiting for a KV-cache slot, beyond
        which a generate or OpenAI request gets 429. One bound, owned by ``generation.max_queued``."""
        return self.generation.max_queued

    def _check_names(self) -> None:
        object.__setattr__(self, "aliases", tuple(self.aliases))
        for key, names in (("name", (self.name,)), ("aliases", self.aliases)):
            for name in names:
                if not isinstance(name, str) or not name.strip() or any(c.isspace() or not c.isprintable()
                                                                        for c in name):
                    raise InputError(f"{key}={name!r}: a model name must be non-empty, without spaces or control "
                                     "characters", field=key)
        twice = sorted({n for n in self.aliases if n == self.name or self.aliases.count(n) > 1})
        if twice:
            raise InputError(f"aliases={list(self.aliases)!r}: {twice[0]!r} is given twice (the name "
                             f"{self.name!r} and its aliases are one list)", field="aliases")

    def _check_generation(self) -> None:
        if self.tokenizer is not None:
            if not Path(self.tokenizer).is_dir():
                raise InputError(f"tokenizer={os.fspath(self.tokenizer)!r}: not a directory (a local Hugging Face "
                                 "tokenizer: tokenizer.json, tokenizer_config.json)", field="tokenizer")
            object.__setattr__(self, "tokenizer", str(Path(self.tokenizer).resolve()))
        if self.chat_template is not None:
            if self.tokenizer is None:
                raise InputError("chat_template: needs a tokenizer (the chat routes are OpenAI's, which need one)",
                                 field="chat_template")
            if not Path(self.chat_template).is_file():
                raise InputError(f"chat_template={os.fspath(self.chat_template)!r}: no such file (a Jinja chat "
                                 "template)", field="chat_template")
            object.__setattr__(self, "chat_template", str(Path(self.chat_template).resolve()))
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key.strip()):
            raise InputError("api_key: expected a non-empty string", field="api_key")
        if not isinstance(self.generation, GenerationConfig):
            raise InputError(f"generation={self.generation!r} must be a pyrt.llm.config.GenerationConfig",
                             field="generation")

    def _check_limits(self) -> None:
        if self.max_queued_requests is not None:  # an int >= 0 (GenerationConfig's); a queue holds one at least
            checked_int(self.max_queued_requests, "max_queued", low=1, field="generation.max_queued")
        for key in ("request_timeout_s", "read_timeout_s"):
            value = getattr(self, key)
            if value is None and key == "request_timeout_s":
                continue
            if not is_number(value) or value <= 0:
                raise InputError(f"{key}={value!r} must be a number of seconds > 0", field=key)


@dataclass(frozen=True)
class StartOptions:
    """Where ``pyrt serve`` answers HTTP and on which Ray (the options of :func:`pyrt.serve.app.start`).

    ``address``: a running Ray cluster to join (``auto``, ``ray://HOST:PORT``; None: start one);
    ``host``, ``port``: where HTTP listens; ``metrics_port``: the Prometheus port of a Ray started here;
    ``ray_proxy``: HTTP through Ray Serve's proxy actor instead of HAProxy (:mod:`pyrt.serve.ingress`).

    >>> StartOptions(port=9000).host, StartOptions().port
    ('127.0.0.1', 8000)
    """

    address: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    metrics_port: int | None = None
    ray_proxy: bool = False

    @property
    def loopback(self) -> bool:
        """Whether HTTP listens on the loopback only: then so does everything a local Ray started here runs."""
        return self.host in LOOPBACK_HOSTS

    def __post_init__(self) -> None:
        checked_int(self.port, "port", low=1, end=PORT_END)
        if self.metrics_port is not None:
            checked_int(self.metrics_port, "metrics_port", low=1, end=PORT_END)


def api_key_from_env() -> str | None:
    """``$PYRT_API_KEY`` (None when unset or empty)."""
    return os.environ.get(API_KEY_ENV, "").strip() or None
