"""The package stays lint- and type-clean: ruff and mypy, configured in pyproject.toml.

Both run as ``sys.executable -m TOOL`` from the repository root, so they use
this interpreter's installation and the project's configuration; a tool that
is not installed skips its test (``pip install -e ".[dev]"`` brings both).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_tool(module: str, *args: str) -> subprocess.CompletedProcess:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (it is in the 'dev' extra)")
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def assert_clean(proc: subprocess.CompletedProcess, what: str) -> None:
    assert proc.returncode == 0, f"{what} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"


def test_ruff_is_clean() -> None:
    assert_clean(run_tool("ruff", "check", "pyrt", "tests", "benchmarks", "examples"), "ruff check")


def test_mypy_is_clean() -> None:
    assert_clean(run_tool("mypy", "pyrt"), "mypy pyrt")
