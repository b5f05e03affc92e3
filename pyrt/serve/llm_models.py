"""A replica's generating models: which model names an engine, under which names, and the 404 of the others.

Models whose method an engine can run (``pyrt.llm.serves``) get an
:class:`pyrt.serve.llm_host.EngineHost` when the replica starts, each generating with the
replica's :class:`pyrt.llm.config.GenerationConfig` on its own method; the others keep the reason
they do not generate, which their 404 gives. Aliases (``pyrt serve --name NAME ALIAS...``) name
the same models; answers carry the model's own name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyrt.llm import serves
from pyrt.llm.config import GenerationConfig
from pyrt.serve.failures import ApiError
from pyrt.serve.llm_host import EngineHost


class LlmModels:
    """The generating models of ``program`` among ``methods`` (model name -> method), with ``config``.

    ``aliases``: another name -> the model it names; ``metrics``: the replica's
    :class:`pyrt.serve.metrics.ServeMetrics`, which counts the requests for an unknown model.
    """

    def __init__(self, program: Any, methods: Mapping[str, str], config: GenerationConfig,
                 aliases: Mapping[str, str], metrics: Any) -> None:
        self.metrics = metrics
        self.aliases = dict(aliases)
        self.hosts: dict[str, EngineHost] = {}
        self.refused: dict[str, str] = {}  # model -> why it does not generate
        for name, method in methods.items():
            why = serves(program, method)
            if why is None:
                self.hosts[name] = EngineHost(program, method, name, config)
            else:
                self.refused[name] = why

    def close(self) -> None:
        """Stop every engine host: the generations still queued or running end as cancelled."""
        for host in self.hosts.values():
            host.close()

    def canonical(self, name: str) -> str:
        """The model ``name`` names (itself, or the model it is an alias of)."""
        return self.aliases.get(name, name)

    def generates(self, name: str) -> bool:
        """Whether the model ``name`` (a model's own name) is driven by an engine."""
        return name in self.hosts

    def names(self) -> list[str]:
        """Every name of a model that generates (aliases too), sorted."""
        return sorted([*self.hosts, *(a for a, m in self.aliases.items() if m in self.hosts)])

    def host(self, name: str | None, list_names: bool) -> EngineHost:
        """``name``'s engine host (an alias's model's; None: the one model that generates, as vLLM serves its one
        model to a request that names none); else 404 naming the model (``list_names``: listing the names that
        generate; else pointing to ``GET /v1/models``), or 400 when no name is given and several models generate."""
        if name is None:
            if len(self.hosts) == 1:
                return next(iter(self.hosts.values()))
            raise ApiError(f"model: a model name is required: {len(self.hosts)} models generate here "
                           f"({', '.join(sorted(self.hosts)) or 'none'})", 400, param="model")
        host = self.hosts.get(self.canonical(name))
        if host is not None:
            return host
        self.metrics.error("", "UnknownModel")  # not the name: clients must not mint label values
        if name in self.refused:
            raise ApiError(f"model {name!r} does not generate: {self.refused[name]}", 404, param="model",
                           code="model_not_found")
        where = f"models are {self.names()}" if list_names else "GET /v1/models lists the ones that generate"
        raise ApiError(f"no model {name!r}; {where}", 404, param="model", code="model_not_found")
