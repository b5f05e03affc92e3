"""What a fresh process imports on the runtime path: neither torch nor executorch where no kernel needs them.

Cold start (``benchmarks/bench_cold_start.py``) is mostly imports: torch alone is about a
second and 200+ MiB. Each case runs in a fresh subprocess and reads ``sys.modules`` (or
``-X importtime``, for the command line) after loading and running:

- a TensorRT-only program (reference engines, ``pyrt.sim``'s simulated GPU), through the
  Python API and through ``pyrt run`` / ``pyrt inspect``;
- a program of portable operators run with pyrt's numpy kernels.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("executorch")

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "executorch", "torchao", "transformers", "onnx", "onnxscript", "tensorrt", "tensorrt_rtx",
         "tensorrt_lean")


class EngineOnly(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(4, 3)

    def forward(self, x: Any) -> Any:
        return torch.relu(self.l1(x))


class Portable(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(4, 6)

    def forward(self, x: Any) -> Any:
        return torch.tanh(self.l1(x)).sum(dim=-1) * 3


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from executorch.exir import to_edge

    from pyrt.export import to_pte

    folder = tmp_path_factory.mktemp("cold")
    torch.manual_seed(0)
    engine_only, portable = EngineOnly().eval(), Portable().eval()
    trt_only = folder / "trt_only.pte"
    to_pte(engine_only, trt_only, (torch.randn(2, 4),), builder="reference", progress=False)
    plain = folder / "portable.pte"
    plain.write_bytes(to_edge(torch.export.export(portable, (torch.randn(2, 4),))).to_executorch().buffer)
    return {"trt_only": trt_only, "engine_only": engine_only, "portable": plain, "portable_model": portable}


def _child(code: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, *args, "-c", textwrap.dedent(code)] if code else [sys.executable, *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=120, env={**base, **(env or {})})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


def _load_and_run(path: Path, kernels: str | None) -> tuple[list[str], np.ndarray]:
    out = _child(f"""
        import json, sys
        import numpy as np
        import pyrt
        from pyrt.sim import simulated_gpus
        x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
        with simulated_gpus(1), pyrt.Program({str(path)!r}, kernels={kernels!r}) as prog:
            y = prog(x)
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})
        print(json.dumps({{"heavy": heavy, "type": type(y).__name__, "y": np.asarray(y).tolist()}}))
    """).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["type"] == "ndarray"  # numpy in -> numpy out: no torch tensor was made
    return result["heavy"], np.asarray(result["y"], dtype=np.float32)


def _expected(model: torch.nn.Module) -> np.ndarray:
    x = torch.from_numpy(np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4))
    with torch.no_grad():
        return model(x).numpy()


def test_trt_only_program_loads_and_runs_without_torch_or_executorch(programs: dict[str, Any]) -> None:
    heavy, y = _load_and_run(programs["trt_only"], None)
    assert heavy == []
    np.testing.assert_allclose(y, _expected(programs["engine_only"]), rtol=1e-5, atol=1e-6)


def test_numpy_kernels_run_a_portable_program_without_torch(programs: dict[str, Any]) -> None:
    heavy, y = _load_and_run(programs["portable"], "numpy")
    assert heavy == []
    np.testing.assert_allclose(y, _expected(programs["portable_model"]), rtol=1e-5, atol=1e-6)


def _imported_by_cli(*argv: str) -> tuple[list[str], str]:
    """Top-level packages of HEAVY that ``python -X importtime -m pyrt ARGV`` imported, and its stdout."""
    done = _child("", "-X", "importtime", "-m", "pyrt", *argv, env={"PYRT_SIMULATED_GPUS": "1"})
    names = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    return sorted(n for n in names if n.split(".")[0] in HEAVY), done.stdout


def test_cli_run_and_inspect_of_a_trt_only_program_import_neither(programs: dict[str, Any]) -> None:
    heavy, out = _imported_by_cli("run", str(programs["trt_only"]), "--random", "--json")
    assert heavy == [] and "outputs" in json.loads(out)
    heavy, out = _imported_by_cli("inspect", str(programs["trt_only"]))
    assert heavy == [] and "TensorRTBackend" in out


# What `pyrt generate` of a file that needs no torch must not import: the heavy libraries but transformers (the
# tokenizer), Ray and the server's libraries, and pyrt's modules for other commands (the server's, the exporter's,
# the bench's, the simulated GPU's).
NOT_FOR_GENERATE = tuple(h for h in HEAVY if h != "transformers") + (
    "ray", "starlette", "fastapi", "uvicorn", "pyrt.sim", "pyrt.export", "pyrt.serve.command", "pyrt.serve.flags",
    "pyrt.serve.config", "pyrt.tools.commands", "pyrt.tools.bench", "pyrt.tools.report", "pyrt.tools.export_command")


@pytest.mark.export
def test_cli_generate_imports_what_generating_needs_and_no_more(tmp_path: Path) -> None:
    """``pyrt generate`` is mostly start-up (``benchmarks/bench_generate_startup.py``): a portable file run with
    numpy kernels and a transformers tokenizer imports none of :data:`NOT_FOR_GENERATE`, and prints what
    transformers' greedy ``generate`` does."""
    from tests.fixtures import llm_models as L

    llama = L.exported("llama", "portable")
    tokenizer = L.word_tokenizer(tmp_path / "tok")
    done = _child("", "-X", "importtime", "-m", "pyrt", "generate", str(llama.path), "--kernels", "numpy",
                  "--tokenizer", str(tokenizer), "--prompt", " ".join(f"w{i}" for i in L.PROMPT),
                  "--max-new-tokens", "8", "--eos-ids", "", env={"PYRT_SIMULATED_GPUS": ""})
    names = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "pyrt.tools.generate_command" in names and "transformers" in names  # the probe sees the command's imports
    unwanted = sorted(n for n in names if any(n == p or n.startswith(p + ".") for p in NOT_FOR_GENERATE))
    assert unwanted == []
    assert done.stdout.split() == [f"w{i}" for i in llama.want[:8]]
