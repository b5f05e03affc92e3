"""The direct writer (pyrt.export._write.direct) against ExecuTorch's full lowering.

A program that is one engine call between its inputs and outputs is written without
ExecuTorch's lowering; ``_lower.DIRECT = False`` forces the full lowering. Both must give
the same file: compared byte for byte, structurally (pyrt's reader: values, instructions,
memory plans, delegates and their blobs), by ExecuTorch's own runtime (method metadata), and
by running both on simulated GPUs against eager PyTorch.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from pyrt.export import to_pte
from pyrt.export._write import direct as _direct
from pyrt.export._write import lower as _lower
from pyrt.pte_reader import PteFile
from tests.export.test_export_helpers import run_pte

ROOT = Path(__file__).parents[2]
EMITTED = "emitting the program (one engine, fully delegated)"


class ManyIO(torch.nn.Module):
    """Two inputs (float, int64), four outputs of several dtypes and sizes: one engine."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return a * 2 + b.sum(), (b * 3).float().relu(), a.mean(dim=1), b > 1


class SameSizes(torch.nn.Module):
    """Inputs and outputs of one size: memory planning's tie breaking decides every offset."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a + b, a * b


def _export(model: Any, path: Path, args: tuple[Any, ...], direct: bool, **kwargs: Any) -> Path:
    previous = _lower.DIRECT
    _lower.DIRECT = direct
    try:
        to_pte(model, path, args, builder="reference", progress=False, **kwargs)
    finally:
        _lower.DIRECT = previous
    return path


def _both(model: Any, folder: Path, args: tuple[Any, ...], **kwargs: Any) -> tuple[Path, Path]:
    return (_export(model, folder / "direct.pte", args, True, **kwargs),
            _export(model, folder / "full.pte", args, False, **kwargs))


def _structure(path: Path) -> dict[str, Any]:
    """Everything a runtime reads from the file, through pyrt's reader."""
    with PteFile.open(path, mmap=False) as pte:
        prog = pte.program
        plans = [{
            "name": p.name, "container": p.container_meta_type, "values": p.values, "inputs": p.inputs,
            "outputs": p.outputs, "chains": p.chains, "operators": p.operators,
            "delegates": [(d.id, d.location, d.index, d.compile_specs) for d in p.delegates],
            "blobs": [bytes(prog.delegate_data(d)) for d in p.delegates],
            "buffers": p.non_const_buffer_sizes, "buffer_devices": p.non_const_buffer_device,
        } for p in prog.execution_plan]
        return {"version": prog.version, "plans": plans, "segments": prog.segments,
                "constant_segment": prog.constant_segment, "mutable": prog.mutable_data_segments,
                "named": prog.named_data, "inline": prog.num_inline_delegate_data}


def _executorch_view(path: Path) -> str:
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(str(path))
    return str({name: str(program.metadata(name)) for name in sorted(program.method_names)})


def _assert_same(direct: Path, full: Path) -> None:
    a, b = _structure(direct), _structure(full)
    for key in a:
        assert a[key] == b[key], key
    assert _executorch_view(direct) == _executorch_view(full)
    assert direct.read_bytes() == full.read_bytes()


@pytest.fixture(scope="module")
def archs_both(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``get(name, dynamic) -> (direct path, full path, model)``, each exported once."""
    pytest.importorskip("transformers")
    from pyrt.testing import archs

    made: dict[tuple[str, bool], Any] = {}

    def get(name: str, dynamic: bool) -> Any:
        if (name, dynamic) not in made:
            model, x = archs.build(name)
            folder = tmp_path_factory.mktemp(f"{name}-{'dyn' if dynamic else 'static'}")
            shapes = archs.dynamic_shapes(name) if dynamic else None
            made[name, dynamic] = (*_both(model, folder, (x,), dynamic_shapes=shapes), model)
        return made[name, dynamic]

    return get


@pytest.mark.export
@pytest.mark.parametrize("name", ["gpt2", "llama", "bert", "vit", "resnet"])
def test_archs_dynamic_give_the_full_lowerings_file(name: str, archs_both: Any) -> None:
    direct, full, _ = archs_both(name, True)
    _assert_same(direct, full)


@pytest.mark.export
@pytest.mark.parametrize("name", ["gpt2", "resnet"])
def test_archs_static_give_the_full_lowerings_file(name: str, archs_both: Any) -> None:
    direct, full, _ = archs_both(name, False)
    _assert_same(direct, full)


@pytest.mark.export
@pytest.mark.parametrize("name", ["gpt2", "resnet"])
def test_direct_files_run_like_eager(name: str, archs_both: Any) -> None:
    from pyrt.testing import archs

    direct, full, model = archs_both(name, True)
    for i, size in enumerate(archs.sizes(name)):
        x = archs.example(name, size, seed=i)
        (got,) = run_pte(direct, x, gpus=1)
        (want,) = run_pte(full, x, gpus=1)
        with torch.no_grad():
            eager = model(x).numpy()
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        np.testing.assert_allclose(np.asarray(got), eager, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dynamic", [True, False])
def test_many_inputs_and_outputs(tmp_path: Path, dynamic: bool) -> None:
    a, b = torch.randn(3, 5), torch.randint(0, 4, (3, 7))
    batch = torch.export.Dim("batch", min=1, max=8)
    shapes = ({0: batch}, {0: batch}) if dynamic else None
    direct, full = _both(ManyIO(), tmp_path, (a, b), dynamic_shapes=shapes)
    _assert_same(direct, full)
    got, want = run_pte(direct, a, b, gpus=1), ManyIO()(a, b)
    assert len(got) == 4
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), w.numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.export
def test_equal_sizes_break_ties_as_executorch_does(tmp_path: Path) -> None:
    direct, full = _both(SameSizes(), tmp_path, (torch.randn(4, 4), torch.randn(4, 4)))
    _assert_same(direct, full)


def test_engine_on_another_device_and_extra_compile_specs(tmp_path: Path) -> None:
    direct, full = _both(torch.nn.Linear(4, 2), tmp_path, (torch.randn(3, 4),), device="cuda:1",
                         weight_streaming_budget=1 << 20, compile_specs={"extra_key": b"\x00\x01"})
    _assert_same(direct, full)


@pytest.mark.export
def test_only_fully_delegated_programs_take_the_direct_path(tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pyrt.export")
    x = torch.randn(3, 4)
    to_pte(torch.nn.Linear(4, 2), tmp_path / "one.pte", (x,), builder="reference", progress=False)
    assert EMITTED in caplog.text and "lowering with ExecuTorch" not in caplog.text
    caplog.clear()
    to_pte(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Sigmoid(), torch.nn.Linear(4, 2)),
           tmp_path / "fallback.pte", (x,), builder="reference", progress=False,
           torch_executed_ops=["aten.sigmoid.default"])
    assert EMITTED not in caplog.text and "lowering with ExecuTorch" in caplog.text
    caplog.clear()
    to_pte(torch.nn.Linear(4, 2), tmp_path / "et.pte", (x,), builder="reference", progress=False,
           writer="executorch")
    assert EMITTED not in caplog.text and "lowering with ExecuTorch" in caplog.text


@pytest.mark.export
def test_state_passthrough_and_unused_inputs_take_the_full_lowering(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    class Passthrough(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x * 2, x

    class Unused(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return x * 2

    caplog.set_level(logging.INFO, logger="pyrt.export")
    to_pte(Passthrough(), tmp_path / "p.pte", (torch.randn(3, 4),), builder="reference", progress=False)
    assert EMITTED not in caplog.text
    to_pte(Unused(), tmp_path / "u.pte", (torch.randn(3, 4), torch.randn(2)), builder="reference", progress=False)
    assert EMITTED not in caplog.text
    from pyrt.testing import archs

    caplog.clear()
    step = archs.kv_decoder(layers=1, max_len=16)
    to_pte(step, tmp_path / "kv.pte", (torch.tensor([[1]]), torch.tensor([0])), builder="reference",
           progress=False)
    assert EMITTED not in caplog.text


def test_greedy_matches_executorchs_planner_on_a_worked_example() -> None:
    # CPU pool of ManyIO-like tensors: inputs (group 0) and outputs (group 1) never overlap.
    offsets, total = _direct.greedy([160, 224, 160, 224, 32], [0, 0, 1, 1, 1])
    assert (offsets, total) == ([224, 0, 224, 0, 384], 416)
    offsets, total = _direct.greedy([160, 224, 160, 224, 32], [0] * 5)
    assert (offsets, total) == ([608, 224, 448, 0, 768], 800)


def test_a_failed_direct_write_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = _direct.writer

    def failing(*args: Any) -> Any:
        total, write = real(*args)

        def half(f: Any, progress: Any) -> None:
            f.write(b"\x01" * 100)
            raise OSError("disk full")

        return total, half

    monkeypatch.setattr(_direct, "writer", failing)
    target = tmp_path / "m.pte"
    target.write_bytes(b"old")
    with pytest.raises(OSError, match="disk full"):
        to_pte(torch.nn.Linear(4, 2), target, (torch.randn(3, 4),), builder="reference", progress=False)
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["m.pte"]


def test_a_fully_delegated_export_never_imports_executorchs_lowering(tmp_path: Path) -> None:
    child = textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {str(ROOT)!r})
        from pyrt.export import to_pte
        to_pte(torch.nn.Linear(4, 2), {str(tmp_path / "m.pte")!r}, (torch.randn(3, 4),), builder="reference",
               progress=False)
        print(sorted(m for m in sys.modules if m.startswith("executorch.exir")))
    """)
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_a_quantized_engine_gives_the_full_lowerings_file(tmp_path: Path) -> None:
    """The weight-quantization compile spec sits where the full lowering puts it (after the budget, before extras)."""
    direct, full = _both(torch.nn.Linear(32, 8), tmp_path, (torch.randn(3, 32),), quantize="int4", group_size=16,
                         weight_streaming_budget=1 << 20, compile_specs={"extra_key": b"\x00\x01"})
    _assert_same(direct, full)
    with PteFile.open(direct) as pte:
        keys = [c.key for c in pte.program.execution_plan[0].delegates[0].compile_specs]
    assert keys == ["target_device", "weight_streaming_budget", "pyrt_weight_quantization", "extra_key"]
