"""docs/architecture.md's module map lists every module of the package with its docstring's first line."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_module_map_is_current() -> None:
    proc = subprocess.run([sys.executable, "scripts/module_map.py", "--check"], cwd=ROOT, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr


def test_every_package_says_its_job_and_what_it_may_import() -> None:
    for init in sorted((ROOT / "pyrt").glob("*/__init__.py")):
        text = init.read_text(encoding="utf-8")
        assert text.lstrip().startswith('"""'), f"{init.relative_to(ROOT)} has no docstring"
        where = init.relative_to(ROOT)
        assert "may import" in text.split('"""')[1].lower(), f"{where}'s docstring does not say what it may import"


def test_no_file_over_500_lines_and_no_function_over_60() -> None:
    """Issue 19's limits, kept: a module a newcomer can read, a function that fits a screen."""
    too_long = []
    for path in sorted((ROOT / "pyrt").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        where = path.relative_to(ROOT)
        if text.count("\n") > 500:
            too_long.append(f"{where}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > 60:
                    too_long.append(f"{where}:{node.lineno} {node.name}: {length} lines")
    assert not too_long, "split along a real seam: " + "; ".join(too_long)
