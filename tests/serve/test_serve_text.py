"""pyrt.serve.text: incremental detokenization and stop strings, with the byte-level BPE the tests train."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from pyrt.errors import InputError  # noqa: E402
from pyrt.serve.text import Detokenizer, StopText, TextStream, load_tokenizer  # noqa: E402
from tests.fixtures import llm_serve as S  # noqa: E402


def decode(ids: list[int]) -> str:
    return str(S.tokenizer().decode(ids, skip_special_tokens=True))


def test_a_character_split_across_tokens_comes_out_whole() -> None:
    tok = S.tokenizer()
    ids = tok.encode("é")
    assert len(ids) == 2  # its two bytes are two tokens of this tokenizer
    detok = Detokenizer(tok)
    assert [detok.add([ids[0]]), detok.add([ids[1]]), detok.flush()] == ["", "é", ""]
    detok = Detokenizer(tok)
    assert detok.add([ids[0]]) == "" and detok.flush() == "\ufffd"  # it never completed


@pytest.mark.parametrize("step", [1, 3])
def test_deltas_joined_are_the_ids_decoded_at_once(step: int) -> None:
    """Random ids (lone bytes, specials, characters split or whole), fed 1 or up to 3 at a time."""
    for seed in range(100):
        rng = random.Random(seed)
        ids = [rng.randrange(100) for _ in range(rng.randint(1, 40))]
        detok, parts, i = Detokenizer(S.tokenizer()), [], 0
        while i < len(ids):
            n = rng.randint(1, step)
            parts.append(detok.add(ids[i:i + n]))
            i += n
        parts.append(detok.flush())
        assert "".join(parts) == decode(ids), (seed, ids)
        assert not any(p.endswith("\ufffd") for p in parts[:-1])


def test_stop_text_holds_back_what_may_begin_a_stop_string() -> None:
    stop = StopText(["END", "xy"])
    assert stop.add("abc E") == "abc " and stop.held == "E"
    assert stop.add("Nd") == "ENd"  # not a stop after all: released
    assert stop.add("x") == "" and stop.add("xz") == "xxz"  # "x" could begin "xy"; then it could not
    assert stop.add("zEN") == "z" and stop.add("Dtail") == "" and stop.stopped
    assert stop.add("more") == "" and stop.flush() == ""
    first = StopText(["bc", "ab"])
    assert first.add("zabc") == "z" and first.stopped  # the earliest stop string wins
    open_tail = StopText(["END"])
    assert open_tail.add("the E") == "the " and open_tail.flush() == "E"  # generation ended: held text goes out


def test_text_stream_cuts_at_a_stop_string_split_across_tokens() -> None:
    tok = S.tokenizer()
    ids = tok.encode("hello world")
    stream = TextStream(tok, ["lo wo"])
    out = [stream.add([i]) for i in ids]
    assert "".join(out) + stream.flush() == "hel" and stream.stopped
    assert stream.tokens <= len(ids)
    late = TextStream(tok, ["d"])
    assert "".join(late.add([i]) for i in tok.encode("hello wor")) + late.flush() == "hello wor"
    assert not late.stopped


def test_load_tokenizer_names_the_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not a directory"):
        load_tokenizer(str(tmp_path / "missing"))
    with pytest.raises(InputError, match=str(tmp_path)):
        load_tokenizer(str(tmp_path))  # a directory with no tokenizer in it
    loaded = load_tokenizer(str(S.tokenizer_dir()))
    assert loaded.encode("hello world") == S.tokenizer().encode("hello world") and loaded.chat_template
