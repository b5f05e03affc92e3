"""``pyrt generate``'s checks before a program is opened: the file, the tokenizer folder, flags that need others.

In process (:func:`pyrt.tools.cli.main`); no program is needed, as each is refused before one is loaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pyrt.tools.cli import main


def run(capsys: pytest.CaptureFixture[str], *args: Any) -> tuple[int, str]:
    status = main([str(a) for a in args])
    return status, capsys.readouterr().err


def one_line(err: str) -> str:
    assert err.startswith("pyrt: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_a_missing_file_is_named_as_missing_not_as_a_missing_tokenizer(capsys: Any, tmp_path: Path) -> None:
    missing = tmp_path / "nothere.pte"
    status, err = run(capsys, "generate", missing, "--prompt", "hi")
    assert status == 1 and f"{missing}: no such file" in one_line(err) and "--tokenizer" not in err


def test_a_folder_without_tokenizer_files_is_refused_on_one_line(capsys: Any, tmp_path: Path) -> None:
    pte, empty = tmp_path / "m.pte", tmp_path / "empty"
    pte.write_bytes(b"not read: the tokenizer is refused first")
    empty.mkdir()
    status, err = run(capsys, "generate", pte, "--prompt", "hi", "--tokenizer", empty)
    assert status == 1 and f"--tokenizer '{empty}' holds no tokenizer files" in one_line(err)


def test_transformers_many_lines_become_one(capsys: Any, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    pte, broken = tmp_path / "m.pte", tmp_path / "broken"
    pte.write_bytes(b"not read")
    broken.mkdir()
    (broken / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast"}')
    status, err = run(capsys, "generate", pte, "--prompt", "hi", "--tokenizer", broken)
    assert status == 1 and f"--tokenizer '{broken}' could not be loaded: " in one_line(err)


@pytest.mark.parametrize(("flags", "message"), [
    (["--group-size", "64"], "--group-size needs --quantize"),
    (["--budget", "1GiB"], "--budget needs --weight-streaming"),
    (["--max-tokens-per-step", "8"], "--max-tokens-per-step needs --max-batch-size"),
])
def test_export_flags_that_need_another_are_refused_without_it(capsys: Any, tmp_path: Path, flags: list[str],
                                                               message: str) -> None:
    status, err = run(capsys, "export", tmp_path, "-o", tmp_path / "m.pte", *flags)
    assert status == 2 and f"pyrt export: error: {message}" in err and not (tmp_path / "m.pte").exists()


@pytest.mark.parametrize(("flags", "warned"), [
    (["--temperature", "0.8"], "--temperature 0.8 without --sample: decoding is greedy and does not use it"),
    (["--top-k", "5", "--seed", "3"], "--top-k 5, --seed 3 without --sample: decoding is greedy and does not use them"),
    (["--draft-tokens", "3"], "--draft-tokens 3 without --draft: no tokens are guessed"),
    (["--draft-tree", "--draft-tokens", "8"], "--draft-tokens 8, --draft-tree without --draft: no tokens are guessed"),
])
def test_generation_options_without_the_flag_they_need_are_warned_about_by_name(
        capsys: Any, tmp_path: Path, flags: list[str], warned: str) -> None:
    pte = tmp_path / "m.pte"
    pte.write_bytes(b"not a program: the warning comes first")
    status, err = run(capsys, "generate", pte, "--prompt-ids", "1,2", *flags)
    assert status == 1 and err.startswith(f"pyrt: warning: {warned}"), err


def test_sampling_options_with_sample_and_temperature_0_are_not_warned_about(capsys: Any, tmp_path: Path) -> None:
    pte = tmp_path / "m.pte"
    pte.write_bytes(b"not a program")
    for flags in (["--sample", "--temperature", "0.8"], ["--temperature", "0"], ["--draft", "ngram", "--draft-tokens",
                                                                                  "3"]):
        status, err = run(capsys, "generate", pte, "--prompt-ids", "1,2", *flags)
        assert status == 1 and "warning" not in err, (flags, err)


def test_vllm_s_export_names_fill_the_same_options(capsys: Any, tmp_path: Path) -> None:
    from pyrt.tools.cli_args import parser
    from pyrt.tools.export_command import _decoder_options

    args = parser().parse_args(["export", str(tmp_path), "-o", "m.pte", "--max-model-len", "64", "--max-num-seqs",
                                "4", "--quantization", "int4", "--group-size", "32", "--dtype", "half"])
    assert _decoder_options(args) == {"max_seq_len": 64, "max_batch_size": 4, "quantize": "int4", "group_size": 32,
                                      "dtype": "float16"}
    for vllm, ours in (("auto", None), ("float", "float32"), ("bfloat16", "bfloat16")):
        args = parser().parse_args(["export", str(tmp_path), "-o", "m.pte", "--dtype", vllm])
        assert _decoder_options(args).get("dtype") == ours


def test_other_libraries_warnings_are_not_labelled_pyrt_s(capsys: Any, caplog: pytest.LogCaptureFixture) -> None:
    import logging
    import warnings

    import pyrt
    from pyrt.tools.terminal import warnings_to_stderr

    with caplog.at_level(logging.DEBUG, logger="pyrt.third_party"), warnings_to_stderr():
        warnings.warn_explicit("read_text is deprecated", DeprecationWarning, "/site-packages/lib/thing.py", 3)
        warnings.warn_explicit("a pyrt warning", UserWarning, pyrt.__file__, 1)
    err = capsys.readouterr().err
    assert err == "pyrt: warning: a pyrt warning\n"
    assert "thing.py:3: DeprecationWarning: read_text is deprecated" in caplog.text  # shown with --verbose
