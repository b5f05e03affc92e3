"""A quiet first run (``pyrt.logs``): pyrt's own lines on stderr, third-party chatter only on request.

The subprocess cases run as a newcomer's process does (no logging configured, a root logger
without handlers), which pytest's own handlers would hide in-process.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from pyrt.errors import PyrtError
from pyrt.logs import configure, level_from_env, reset, third_party_quiet
from pyrt.streaming import BudgetWarning
from pyrt.tools.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _child(code: str, env: dict[str, str] | None = None, *args: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "PYRT_LOG"}
    base["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    cmd = [sys.executable, *args] if args else [sys.executable, "-c", textwrap.dedent(code)]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300, env={**base, **(env or {})})


@pytest.mark.parametrize("value", ["loud", "10", "warn ing"])
def test_unknown_log_level_is_a_typed_error_naming_it(value: str) -> None:
    with pytest.raises(PyrtError, match=f"PYRT_LOG={value!r}: expected one of debug, info, warning, error"):
        level_from_env({"PYRT_LOG": value})


def test_levels_come_from_verbose_then_the_environment() -> None:
    logger = logging.getLogger("pyrt")
    before = logger.level, list(logger.handlers)
    try:
        assert configure(False, {}) == logging.WARNING
        assert configure(False, {"PYRT_LOG": "info"}) == logging.INFO
        assert configure(True, {"PYRT_LOG": "error"}) == logging.DEBUG
        ours = [h for h in logger.handlers if h.get_name() == "pyrt.logs.configure"]
        others = [h for h in before[1] if h.get_name() != "pyrt.logs.configure"]
        assert len(ours) == 1 and len(logger.handlers) == len(others) + 1  # a second call replaces its handler
    finally:
        for handler in [h for h in logger.handlers if h not in before[1]]:
            logger.removeHandler(handler)
        for handler in before[1]:
            if handler not in logger.handlers:
                logger.addHandler(handler)
        logger.setLevel(before[0])


def test_the_command_line_leaves_no_handler_behind(tmp_path: Path) -> None:
    logger = logging.getLogger("pyrt")
    before = list(logger.handlers), logger.level
    assert main(["inspect", "-v", str(tmp_path / "missing.pte")]) == 1
    assert (list(logger.handlers), logger.level) == before
    configure(True, {})
    reset()
    assert (list(logger.handlers), logger.level) == before


def test_third_party_records_and_warnings_are_held_back_and_restored(caplog: pytest.LogCaptureFixture) -> None:
    noisy = logging.getLogger("torchao")
    noisy.setLevel(logging.INFO)
    try:
        with caplog.at_level(logging.DEBUG, "pyrt.third_party"), warnings.catch_warnings(record=True) as shown:
            warnings.simplefilter("always")
            with third_party_quiet():
                noisy.warning("Failed to load _C_mxfp8")
                noisy.error("a real failure")  # errors still show
                warnings.warn_explicit("old API", FutureWarning, "/site-packages/torch/x.py", 3)
                warnings.warn_explicit("over budget", BudgetWarning, str(ROOT / "pyrt" / "streaming.py"), 9)
            assert noisy.level == logging.INFO
            noisy.warning("outside")
        texts = [r.getMessage() for r in caplog.records]
        assert "Failed to load _C_mxfp8" not in texts and "a real failure" in texts and "outside" in texts
        assert any("FutureWarning: old API" in t for t in texts)  # re-logged at DEBUG
        assert [str(w.message) for w in shown] == ["over budget"]  # pyrt's own warning is shown as usual
    finally:
        noisy.setLevel(logging.NOTSET)


def test_nothing_is_held_back_when_pyrt_logs_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, "pyrt"), third_party_quiet():
        logging.getLogger("torchao").warning("shown")
    assert "shown" in caplog.text


QUIET = """
    import logging, warnings
    from pyrt.logs import configure, third_party_quiet
    configure()
    with third_party_quiet():
        logging.getLogger("torchao").warning("torchao noise")
        logging.getLogger("torch.onnx._internal.x").warning("onnx noise")
        logging.debug("root debug")  # runs logging.basicConfig() on a root logger without handlers
        warnings.warn_explicit("deprecated", FutureWarning, "/site-packages/torch/utils/_pytree.py", 1)
    logging.getLogger("pyrt.export").warning("pyrt's own")
    logging.getLogger("pyrt.export").info("pyrt's info")
    print(len(logging.getLogger().handlers))
"""


def test_a_fresh_process_shows_only_pyrts_own_lines() -> None:
    done = _child(QUIET)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "pyrt.export: WARNING: pyrt's own\n"
    assert done.stdout.strip() == "0"  # no root handler left behind


def test_pyrt_log_debug_shows_the_third_party_messages() -> None:
    done = _child(QUIET, {"PYRT_LOG": "debug"})
    assert done.returncode == 0, done.stderr
    for text in ("torchao noise", "onnx noise", "FutureWarning: deprecated", "pyrt.export: INFO: pyrt's info"):
        assert text in done.stderr
    assert done.stderr.count("pyrt's own") == 1 and done.stdout.strip() == "0"


def test_cli_verbose_flag_and_a_bad_pyrt_log(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.pte")
    done = _child("", {"PYRT_LOG": "loud"}, "-m", "pyrt", "inspect", missing)
    assert done.returncode == 1 and "PYRT_LOG='loud'" in done.stderr
    done = _child("", None, "-m", "pyrt", "inspect", "-v", missing)
    assert done.returncode == 1 and "cannot open" in done.stderr


def test_an_export_in_a_fresh_process_prints_nothing(tmp_path: Path) -> None:
    """torch.export, torchao (its optional extensions fail to load here), ExecuTorch's lowering: all quiet."""
    pytest.importorskip("executorch")
    done = _child(f"""
        import torch
        import pyrt.export
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Sigmoid(), torch.nn.Linear(8, 2)).eval()
        summary = pyrt.export.to_pte(model, {str(tmp_path / "m.pte")!r}, (torch.randn(2, 4),), builder="reference",
                                     torch_executed_ops=("aten.sigmoid.default",), progress=False)
        print(len(summary.engines), sorted(summary.fallback_ops))
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "2 ['aten::sigmoid']" and done.stderr == ""
