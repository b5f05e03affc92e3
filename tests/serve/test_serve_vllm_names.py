"""vLLM's serve flag names fill the same fields (issue 46): ``--served-model-name`` is ``--name``,
``--chat-template FILE`` replaces the tokenizer's chat template."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from pyrt.errors import InputError
from pyrt.serve.flags import add_flags, configs


def parsed(*argv: str) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="pyrt serve")
    add_flags(parser)
    return vars(parser.parse_args(list(argv)))


def test_vllm_s_names_fill_the_same_fields(tmp_path: Path) -> None:
    path = str(tmp_path / "m.pte")
    cfg, _ = configs(parsed(path, "--served-model-name", "org/M", "small"))
    assert (cfg.name, cfg.aliases) == ("org/M", ("small",))
    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    cfg, _ = configs(parsed(path, "--tokenizer", str(tmp_path), "--chat-template", str(template)))
    assert cfg.chat_template == str(template)
    with pytest.raises(InputError, match="--chat-template: needs a tokenizer"):
        configs(parsed(str(tmp_path / "elsewhere" / "m.pte"), "--chat-template", str(template)))
    with pytest.raises(InputError, match="--chat-template='nowhere.jinja': no such file"):
        configs(parsed(path, "--tokenizer", str(tmp_path), "--chat-template", "nowhere.jinja"))


def test_a_chat_template_file_replaces_the_tokenizer_s(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from pyrt.serve.tokenization import Tokenization
    from tests.fixtures import llm_serve as S

    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }};{% endfor %}")
    texts = Tokenization(str(S.tokenizer_dir()), str(template))
    try:
        tok: Any = texts.tokenizer
        assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "[user] hi;"
    finally:
        texts.close()
