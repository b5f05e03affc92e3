"""The ``pyrt serve`` flags: one table, from which the parser, the configs and the errors' spelling come.

Each :class:`Flag` row says how the flag is spelled (the first spelling is the one errors use; more
are aliases a client may type), which field it fills, its argparse type (a value that does not
parse is argparse's usage error, exit status 2) and its help, in which ``{default}`` is the field's
default as its config writes it (:mod:`pyrt.serve.config`: each default is written there, once).
A field is one of :class:`~pyrt.serve.config.ServeConfig` (``replicas``), of the
:class:`~pyrt.llm.config.GenerationConfig` it embeds (``generation.draft_tokens``), or of
:class:`~pyrt.serve.config.StartOptions` (``start.port``). :func:`configs` builds the three from the
parsed flags (a flag not given leaves its field's default), and a value a config refuses is an
:class:`pyrt.errors.InputError` naming the flag (:func:`spelled`). Adding a flag is a field in a
config and a row here.

>>> parser = argparse.ArgumentParser(prog="pyrt serve")
>>> add_flags(parser)
>>> cfg, where = configs(vars(parser.parse_args(["m.pte", "--draft", "ngram", "--port", "9000"])))
>>> cfg.generation.draft, cfg.generation.draft_tokens, where.port, cfg.replicas
('ngram', 4, 9000, 1)
>>> configs({"path": "m.pte", "generation.draft_tokens": 0})
Traceback (most recent call last):
...
pyrt.errors.InputError: --draft-tokens=0 must be an int >= 1
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from pyrt.errors import InputError
from pyrt.format.companions import find_tokenizer
from pyrt.llm.config import GenerationConfig
from pyrt.serve.arguments import PORT, number_argument, seconds_argument, whole_argument
from pyrt.serve.config import API_KEY_ENV, ServeConfig, StartOptions, api_key_from_env
from pyrt.streaming import budget_argument

T = TypeVar("T")
CONFIGS: dict[str, type[Any]] = {"": ServeConfig, "generation": GenerationConfig, "start": StartOptions}


def budget(text: str) -> Any:
    """``--budget``: :func:`pyrt.streaming.budget_argument`, its ValueError as a usage error."""
    try:
        return budget_argument(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def shown(value: Any) -> str:
    """A default as help writes it: ``2.0`` -> ``2``."""
    return f"{value:g}" if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class Flag:
    """One flag of ``pyrt serve``: its spellings (``("path",)``: the positional argument), the field it fills,
    its help (``{default}``: the field's default, written as ``shown`` writes it), what parses its value
    (argparse's ``type``) and argparse's ``metavar``, ``choices``, ``action`` and ``nargs``; ``rest``: with
    ``nargs="+"``, the field the values after the first fill."""

    names: tuple[str, ...]
    field: str
    help: str
    parse: Callable[[str], Any] | None = None
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    action: str | type[argparse.Action] | None = None  # "append", "store_true", argparse.BooleanOptionalAction
    nargs: str | None = None
    rest: str | None = None
    shown: Callable[[Any], str] = shown

    @property
    def spelling(self) -> str:
        """How errors name the flag."""
        return self.names[0]

    def fills(self, value: Any) -> dict[str, Any]:
        """The fields the parsed ``value`` fills."""
        if self.rest is None:
            return {self.field: value}
        return {self.field: value[0], self.rest: tuple(value[1:])}

    def argparse_options(self) -> dict[str, Any]:
        """``add_argument``'s keywords."""
        options: dict[str, Any] = {"help": self.help.format(default=self.shown(default_of(self.field)))}
        for key, name in (("type", "parse"), ("metavar", "metavar"), ("choices", "choices"), ("action", "action"),
                          ("nargs", "nargs")):
            if getattr(self, name) is not None:
                options[key] = getattr(self, name)
        if self.names[0].startswith("-"):
            options.update(dest=self.field, default=argparse.SUPPRESS)  # not given: the field's default
            if self.action is None and self.choices is None:
                options.setdefault("metavar", self.field.rpartition(".")[2].upper())
        return options


FLAGS: tuple[Flag, ...] = (
    Flag(("path",), "path", "the .pte file"),
    Flag(("--name", "--served-model-name"), "name", "model name (default: the file's stem; org/Model ids too) and "
         "more names clients may use for it (as vLLM's --served-model-name a b); methods serve as NAME.METHOD",
         nargs="+", metavar="NAME", rest="aliases"),
    Flag(("--replicas",), "replicas", "replicas, each with its own Program (default {default})", whole_argument(1)),
    Flag(("--gpus-per-replica",), "gpus_per_replica", "GPUs Ray assigns each replica (default: 1 when the program "
         "has TensorRT delegates, else 0)", number_argument),
    Flag(("--cpus-per-replica",), "cpus_per_replica", "CPUs Ray reserves per replica (default {default})",
         number_argument),
    Flag(("--budget",), "budget", "weight-streaming budget per replica: bytes, 50%%, auto, 0=1GiB", budget),
    Flag(("--data",), "data", "a .ptd file of external weights", metavar="PTD", action="append"),
    Flag(("--kernels",), "kernels", "kernels for non-delegated operators", choices=("torch", "numpy")),
    Flag(("--max-batch-size",), "max_batch_size", "most rows in one batched run (1: no batching; default {default})",
         whole_argument(1)),
    Flag(("--batch-wait-ms",), "batch_wait_ms", "how long a batch waits to fill (default {default})",
         number_argument),
    Flag(("--max-request-bytes",), "max_request_bytes", "larger request bodies are refused with 413 (default "
         "{default})", whole_argument(1), shown=lambda size: f"{size >> 20} MiB"),
    Flag(("--max-queued-requests",), "generation.max_queued", "requests each replica holds waiting for its run "
         "thread (more are refused at once with 503 and Retry-After), and generations waiting for a KV-cache slot "
         "(more get 429) (default: no limit)", whole_argument(1), metavar="N"),
    Flag(("--request-timeout-s",), "request_timeout_s", "an infer request not answered within T s of its arrival "
         "gets 504 (default: no limit)", seconds_argument, metavar="T"),
    Flag(("--read-timeout-s",), "read_timeout_s", "a client must send its request (headers and body) within R s, "
         "else 408 (default {default})", seconds_argument, metavar="R"),
    Flag(("--host",), "start.host", "HTTP host (default {default}; 0.0.0.0 for every interface)"),
    Flag(("--port",), "start.port", "HTTP port (default {default})", PORT),
    Flag(("--address",), "start.address", "join a running Ray cluster: auto or ray://HOST:PORT (default: start "
         "one)"),
    Flag(("--metrics-port",), "start.metrics_port", "Prometheus port of a Ray this command starts (Ray binds it on "
         "every interface; GET /metrics on the API port, which listens on --host, has the replica's own)",
         PORT),
    Flag(("--tokenizer",), "tokenizer", "a local Hugging Face tokenizer directory: text in and out on the generate "
         "routes, and OpenAI's /v1 API (default: the one pyrt export kept beside the file)", metavar="DIR"),
    Flag(("--chat-template",), "chat_template", "a Jinja chat template file that replaces the tokenizer's own "
         "(as vLLM's --chat-template)", metavar="FILE"),
    Flag(("--draft",), "generation.draft", "speculative decoding of the generating models: guess tokens by prompt "
         "lookup (ngram) or with a smaller LLM file of the same vocabulary (loaded fully resident on each "
         "replica)", metavar="ngram|D.pte"),
    Flag(("--draft-tokens",), "generation.draft_tokens", "--draft: the most tokens a sequence guesses per step "
         "(default {default})", whole_argument(1), metavar="K"),
    Flag(("--enable-prefix-caching",), "generation.prefix_caching", "a generation takes the free KV-cache slot "
         "holding the longest prefix of its prompt and prefills only the rest (vLLM's automatic prefix caching; "
         "--no-enable-prefix-caching: every prompt prefilled whole; default: on)",
         action=argparse.BooleanOptionalAction),
    Flag(("--draft-tree",), "generation.draft_tree", "--draft: guess a tree of --draft-tokens tokens grown from the "
         "draft's probabilities, verified in one pass (a slot file that verifies trees)", action="store_true"),
    Flag(("--api-key",), "api_key", f"require 'Authorization: Bearer KEY' on /v1 and /v2/models (default "
         f"${API_KEY_ENV}; health stays open)", metavar="KEY"),
    Flag(("--ray-proxy",), "start.ray_proxy", "serve HTTP through Ray Serve's proxy actor instead of HAProxy "
         "straight to the replicas (a Ray this command starts; a cluster joined with --address keeps its own "
         "setting)", action="store_true"),
)
BY_FIELD = {field: row for row in FLAGS for field in (row.field, row.rest) if field is not None}


def default_of(path: str) -> Any:
    """The default of the config field ``path`` (``generation.draft_tokens``), as its dataclass writes it."""
    config, _, name = path.rpartition(".")
    found = next(f for f in dataclasses.fields(CONFIGS[config]) if f.name == name)
    if found.default_factory is not dataclasses.MISSING:
        return found.default_factory()
    return None if found.default is dataclasses.MISSING else found.default


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Every row of :data:`FLAGS` as an argument of ``parser``."""
    for row in FLAGS:
        parser.add_argument(*row.names, **row.argparse_options())


def configs(values: Mapping[str, Any]) -> tuple[ServeConfig, StartOptions]:
    """The configs that the flags in ``values`` fill (a parsed namespace's ``vars``: field -> value; ``path``
    at least); beside the flags, the tokenizer pyrt export kept beside the file when ``--tokenizer`` is not
    given, and ``$PYRT_API_KEY`` when ``--api-key`` is not. InputError naming the flag of a refused value."""
    given: dict[str, dict[str, Any]] = {config: {} for config in CONFIGS}
    for row in FLAGS:
        if row.field in values:
            for path, value in row.fills(values[row.field]).items():
                config, _, name = path.rpartition(".")
                given[config][name] = value
    serve = given[""]
    serve["tokenizer"] = serve.get("tokenizer") or find_tokenizer(serve["path"])
    serve["api_key"] = serve.get("api_key") or api_key_from_env()
    generation = made(GenerationConfig, given["generation"], "generation.")
    return made(ServeConfig, {**serve, "generation": generation}, ""), made(StartOptions, given["start"], "start.")


def made(config: Callable[..., T], fields: dict[str, Any], prefix: str) -> T:
    """``config(**fields)``; its refusal naming the flag (``prefix``: where the config's fields sit in the table)."""
    try:
        return config(**fields)
    except InputError as exc:
        raise spelled(exc, prefix) from None


def spelled(exc: InputError, prefix: str = "") -> InputError:
    """``exc``, a config's refusal of its field ``exc.field`` (``prefix + exc.field`` in the table), naming the
    flag that fills it as the command line's user typed it; ``exc`` itself when no flag fills that field.

    >>> str(spelled(InputError("draft_tokens=0 must be an int >= 1", field="draft_tokens"), "generation."))
    '--draft-tokens=0 must be an int >= 1'
    """
    row = BY_FIELD.get(prefix + exc.field) if exc.field is not None else None
    if row is None or exc.field is None:
        return exc
    own, message = exc.field.rpartition(".")[2], str(exc)
    text = row.spelling + message[len(own):] if message.startswith(own) else f"{row.spelling}: {message}"
    return InputError(text, field=row.spelling)


__all__ = ["Flag", "FLAGS", "add_flags", "configs", "spelled", "default_of"]
