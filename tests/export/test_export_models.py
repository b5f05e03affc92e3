"""Exports of real architectures (GPT-2, Llama, BERT, ViT, ResNet; small random-init configs).

Default run: every model through the reference builder, static and dynamic, run with
pyrt.Program on a simulated GPU and compared with eager; both builders' partitions
compared on every model; GPT-2 and Llama built with TensorRT-RTX (dynamic). The other
TensorRT-RTX builds are ``slow``. Each export is made once per module (fixtures).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from pyrt.export import to_pte
from pyrt.testing import archs
from tests.export.test_export_helpers import run_pte

pytest.importorskip("transformers")

pytestmark = [pytest.mark.export]
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``exports(name, builder, dynamic) -> (summary, path, model)``, each made once."""
    made: dict[tuple[str, str, bool], Any] = {}
    folder = tmp_path_factory.mktemp("archs")

    def get(name: str, builder: str, dynamic: bool) -> Any:
        key = (name, builder, dynamic)
        if key not in made:
            model, x = archs.build(name)
            path = folder / f"{name}-{builder}-{'dyn' if dynamic else 'static'}.pte"
            summary = to_pte(model, path, (x,), builder=builder, progress=False,
                             dynamic_shapes=archs.dynamic_shapes(name) if dynamic else None)
            made[key] = (summary, path, model)
        return made[key]

    return get


def _max_error(path: Path, model: torch.nn.Module, x: torch.Tensor) -> float:
    (got,) = run_pte(path, x, gpus=1)
    with torch.no_grad():
        want = model(x)
    assert tuple(np.shape(got)) == tuple(want.shape)
    return float(np.abs(np.asarray(got) - want.numpy()).max())


@pytest.mark.parametrize("name", archs.NAMES)
def test_reference_static_matches_eager(name: str, exports: Any) -> None:
    summary, path, model = exports(name, "reference", False)
    assert len(summary.engines) == 1 and summary.fallback_ops == {}, str(summary)
    _, x = archs.build(name)
    assert _max_error(path, model, x) <= TOLERANCE


@pytest.mark.parametrize("name", archs.NAMES)
def test_reference_dynamic_is_one_engine_at_every_size(name: str, exports: Any) -> None:
    """Dynamic batch (and sequence) dims: the same single engine as the static export, any size in range."""
    static, _, _ = exports(name, "reference", False)
    summary, path, model = exports(name, "reference", True)
    assert len(summary.engines) == len(static.engines) == 1 and summary.fallback_ops == {}, str(summary)
    assert -1 in summary.engines[0].inputs[0].shape
    for i, size in enumerate(archs.sizes(name)):
        assert _max_error(path, model, archs.example(name, size, seed=i)) <= TOLERANCE, size


@pytest.mark.parametrize("name", archs.NAMES)
def test_both_builders_partition_alike(name: str, tmp_path: Path) -> None:
    pytest.importorskip("tensorrt_rtx")
    from pyrt.export._engines.builders import make_builder
    from pyrt.export._engines.engine_graph import _Planner
    from pyrt.export._files.engine_store import EngineStore
    from pyrt.export._graph.pass_order import prepare_graph
    from pyrt.export.api import make_options

    model, x = archs.build(name)
    program = torch.export.export(model, (x,), dynamic_shapes=archs.dynamic_shapes(name), strict=False)
    plans = {}
    for builder in ("reference", "tensorrt_rtx"):
        options = make_options(builder=builder, progress=False)
        _, gm, forced = prepare_graph(program, frozenset(), options.progress)
        with EngineStore(tmp_path) as store:
            parts = _Planner(gm, make_builder(builder), options, store, forced).plan()
        plans[builder] = [[n.name for n in p.nodes] for p in parts]
    assert plans["reference"] == plans["tensorrt_rtx"] and len(plans["reference"]) == 1


def _rtx(name: str, dynamic: bool, exports: Any) -> None:
    pytest.importorskip("tensorrt_rtx")
    reference, _, _ = exports(name, "reference", dynamic)
    summary, path, _ = exports(name, "tensorrt_rtx", dynamic)
    assert [e.flavour for e in summary.engines] == ["tensorrt_rtx"] and summary.fallback_ops == {}, str(summary)
    assert [e.ops for e in summary.engines] == [e.ops for e in reference.engines]
    binding = summary.engines[0].inputs[0]
    assert (-1 in binding.shape) == dynamic


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_tensorrt_rtx_builds_decoders_as_one_engine(name: str, exports: Any) -> None:
    """They used to fail (assertion nodes made unused engine outputs)."""
    _rtx(name, True, exports)


@pytest.mark.slow
@pytest.mark.parametrize("name, dynamic", [(n, d) for n in archs.NAMES for d in (False, True)
                                           if not (d and n in ("gpt2", "llama"))])
def test_tensorrt_rtx_builds_one_engine(name: str, dynamic: bool, exports: Any) -> None:
    _rtx(name, dynamic, exports)
