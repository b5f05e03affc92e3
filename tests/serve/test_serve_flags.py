"""``pyrt serve``'s flags come from one table: the parser, the configs it fills, and errors that name the flag."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from pyrt.errors import InputError
from pyrt.llm.config import GenerationConfig
from pyrt.serve.config import ServeConfig, StartOptions
from pyrt.serve.flags import CONFIGS, FLAGS, add_flags, configs, default_of


def parsed(*argv: str) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="pyrt serve")
    add_flags(parser)
    return vars(parser.parse_args(list(argv)))


def test_no_flag_given_is_every_config_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYRT_API_KEY", raising=False)
    path = str(tmp_path / "m.pte")
    cfg, where = configs(parsed(path))
    assert cfg == ServeConfig(path) and where == StartOptions()
    assert cfg.generation == GenerationConfig() and cfg.max_queued_requests is None


def test_each_flag_fills_its_field(tmp_path: Path) -> None:
    path = str(tmp_path / "m.pte")
    cfg, where = configs(parsed(path, "--name", "m", "org/M", "small", "--replicas", "3", "--max-queued-requests",
                                "5", "--draft", "ngram", "--draft-tokens", "2", "--port", "9000", "--ray-proxy",
                                "--data", "a.ptd", "--data", "b.ptd", "--batch-wait-ms", "0.5", "--api-key", "k"))
    assert (cfg.name, cfg.aliases, cfg.replicas, cfg.batch_wait_ms) == ("m", ("org/M", "small"), 3, 0.5)
    assert cfg.api_key == "k"
    assert [Path(d).name for d in cfg.data] == ["a.ptd", "b.ptd"]
    assert cfg.generation == GenerationConfig(draft="ngram", draft_tokens=2, max_queued=5)
    assert cfg.max_queued_requests == 5  # one bound: the infer queue's and the generation queue's
    assert (where.port, where.ray_proxy, where.host) == (9000, True, "127.0.0.1")


def test_every_row_names_a_field_of_its_config_and_shows_its_default() -> None:
    fields = {name: {f.name for f in dataclasses.fields(config)} for name, config in CONFIGS.items()}
    for row in FLAGS:
        for path in filter(None, (row.field, row.rest)):
            config, _, name = path.rpartition(".")
            assert name in fields[config], row
        help_text = row.argparse_options()["help"]
        assert "{" not in help_text, row
    assert "(default 4)" in next(r for r in FLAGS if r.field == "generation.draft_tokens").argparse_options()["help"]
    assert default_of("generation.draft_tokens") == 4 and default_of("start.port") == 8000
    assert len({name for row in FLAGS for name in row.names}) == sum(len(row.names) for row in FLAGS)


@pytest.mark.parametrize(("given", "message"), [
    ({"generation.draft_tokens": 0}, "--draft-tokens=0 must be an int >= 1"),
    ({"generation.max_queued": 0}, "--max-queued-requests=0 must be an int >= 1"),
    ({"batch_wait_ms": float("inf")}, "--batch-wait-ms=inf must be a finite number >= 0"),
    ({"name": ["a b"]}, "--name='a b': a model name must be non-empty"),
    ({"start.port": 0}, "--port=0 must be an int >= 1"),
])
def test_a_value_a_config_refuses_names_the_flag(tmp_path: Path, given: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError, match=message) as caught:
        configs({"path": str(tmp_path / "m.pte"), **given})
    assert str(caught.value).startswith(message.split("=")[0] + "=")


def test_a_bad_flag_value_is_argparse_s_usage_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as caught:
        parsed(str(tmp_path / "m.pte"), "--draft-tokens", "0")
    assert caught.value.code == 2
