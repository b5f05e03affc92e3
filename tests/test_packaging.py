"""The distribution (``pyrt-executorch``, import name ``pyrt``): its wheel builds, carries the
metadata a published package needs, installs into a fresh virtual environment and runs.

The wheel is built from a copy of the files a build reads (``pyproject.toml``, ``README.md``,
``LICENSE``, ``pyrt/``), so the checkout gets no ``build/`` or ``*.egg-info``; with
``python -m build`` when it is installed (the ``dev`` extra), else ``pip wheel``. The fresh
environment has no pip of its own (``pip --python`` installs into it) and gets numpy from the
package index pip is configured with.
"""

from __future__ import annotations

import email.parser
import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pyrt._version import __version__

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "pyrt")


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, f"{' '.join(cmd)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src, dist = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("dist")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, src / name)
    if importlib.util.find_spec("build") is not None:
        cmd = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), "."]
    else:
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), "."]
    _run(cmd, src)
    [built] = dist.glob("*.whl")
    return built


def test_wheel_is_pyrt_executorch_with_its_metadata_and_data_files(wheel: Path) -> None:
    assert wheel.name == f"pyrt_executorch-{__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        meta = email.parser.Parser().parsestr(zf.read(f"pyrt_executorch-{__version__}.dist-info/METADATA").decode())
    assert meta["Name"] == "pyrt-executorch" and meta["Version"] == __version__
    assert meta["License-Expression"] == "BSD-3-Clause" and meta["Requires-Python"] == ">=3.10"
    assert [r for r in meta.get_all("Requires-Dist") if "extra ==" not in r] == ["numpy>=1.24"]
    assert {"torch", "export", "cuda", "tensorrt", "tensorrt-rtx", "cli", "plot"} <= set(meta.get_all("Provides-Extra"))
    assert any(c.startswith("Development Status") for c in meta.get_all("Classifier"))
    assert meta.get_all("Project-URL")
    assert {"pyrt/py.typed", "pyrt/kernels/allowed_ops.txt", "pyrt/kernels/op_schemas.txt",
            f"pyrt_executorch-{__version__}.dist-info/licenses/LICENSE"} <= names
    assert not [n for n in names if n.split("/")[0] in ("tests", "benchmarks", "examples", "scripts")]


def test_wheel_installs_into_a_fresh_venv_and_inspects_a_pte(wheel: Path, delegated_pte: Path,
                                                             tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path)
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", str(wheel)], tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    where = _run([str(python), "-c", "import pyrt; print(pyrt.__file__, pyrt.__version__)"], tmp_path, env)
    assert where.startswith(str(venv)) and where.split()[1] == __version__  # the wheel's, not this checkout's
    report = _run([str(venv / "bin" / "pyrt"), "inspect", str(delegated_pte)], tmp_path, env)
    assert "TensorRTBackend" in report and "method 'forward'" in report
