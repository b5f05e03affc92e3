"""Real architectures (tiny random-init ``transformers`` configs) through pyrt and ExecuTorch's runtime.

Each model is exported once per session; pyrt runs it with the numpy kernels and
with the torch kernels, and both must match ExecuTorch's own runtime on the same
file. GPT-2, BERT, Llama, ViT and ResNet run by default; Swin (as_strided_copy),
Wav2Vec2 (native_group_norm), an LSTM and a dynamic-sequence GPT-2 are ``slow``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pyrt

pytest.importorskip("transformers")
pytest.importorskip("executorch.runtime")
from pyrt.testing.archs import export_pte  # noqa: E402

FAST = ["gpt2", "bert", "llama", "vit", "resnet"]
SLOW = ["swin", "wav2vec2", "lstm"]


@pytest.fixture(scope="session")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Any:
    cache: dict[tuple[str, bool], tuple[Path, tuple[Any, ...]]] = {}
    root = tmp_path_factory.mktemp("models")

    def get(name: str, dynamic: bool = False) -> tuple[Path, tuple[Any, ...]]:
        if (name, dynamic) not in cache:
            path = root / f"{name}{'-dyn' if dynamic else ''}.pte"
            cache[name, dynamic] = (path, export_pte(name, path, dynamic_seq=dynamic))
        return cache[name, dynamic]

    return get


def _executorch(path: Path, inputs: tuple[Any, ...]) -> np.ndarray:
    from executorch.runtime import Runtime

    method = Runtime.get().load_program(str(path)).load_method("forward")
    return method.execute(list(inputs))[0].numpy()


def _pyrt(path: Path, inputs: tuple[Any, ...], kernels: str) -> np.ndarray:
    with pyrt.Program(path, kernels=kernels) as prog:
        assert prog.kernels == kernels
        out = prog(*[x.numpy() for x in inputs])
    return out[0] if isinstance(out, tuple) else out


def _check(path: Path, inputs: tuple[Any, ...]) -> None:
    want = _executorch(path, inputs)
    for kernels in ("numpy", "torch"):
        got = _pyrt(path, inputs, kernels)
        assert got.shape == want.shape and got.dtype == want.dtype, kernels
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=kernels)


@pytest.mark.parametrize("name", FAST)
def test_model_matches_executorch(exported: Any, name: str) -> None:
    _check(*exported(name))


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW)
def test_model_matches_executorch_slow(exported: Any, name: str) -> None:
    _check(*exported(name))


@pytest.mark.slow
@pytest.mark.parametrize("seq", [3, 16])
def test_dynamic_gpt2_matches_executorch(exported: Any, seq: int) -> None:
    import torch

    path, _ = exported("gpt2", True)
    tokens = (torch.randint(0, 96, (1, seq), generator=torch.Generator().manual_seed(seq)),)
    _check(path, tokens)


def test_dynamic_gpt2_shape_views(exported: Any) -> None:
    """Dynamic GPT-2: ``*_copy`` calls on dynamic tensors run as views (pyrt.runtime.fold.Folder.shape_view),
    skipped by steady runs; lengths alternate between full and steady runs, and every output is
    bitwise the unfolded program's (which copies), and ExecuTorch's within tolerance."""
    import torch

    path, _ = exported("gpt2", True)
    g = torch.Generator().manual_seed(0)
    with pyrt.Program(path, kernels="torch") as prog, pyrt.Program(path, kernels="torch", fold=False) as plain:
        runner = prog._runners["forward"]
        chain = runner.plan.chains[0]
        viewed = [pc for pc, ins in enumerate(chain) if getattr(ins.step, "__name__", "") == "shape_view"]
        assert len(viewed) >= 10, viewed
        assert sum(1 for pc in viewed if chain[pc].what.startswith("aten::cat")) == 4  # cat of one key/value
        assert runner._steady is not None and not set(viewed) & set(runner._steady[1])
        for seq in (8, 8, 8, 3, 3, 16, 16, 8, 1, 1, 5, 5):
            tokens = torch.randint(0, 96, (1, seq), generator=g)
            got, want = prog(tokens), plain(tokens)
            got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
            for a, b in zip(got, want, strict=True):
                assert torch.equal(a, b), seq
            if seq in (3, 16):
                np.testing.assert_allclose(got[0].numpy(), _executorch(path, (tokens,)), rtol=1e-4, atol=1e-5)


# Which kernel calls of the tiny Llama fold (or bind as views) at load: pinned so that
# work on pyrt.runtime.fold's analysis cannot change its decisions unnoticed. Torch kernels
# also bind five ``*_copy`` results as views of their inputs (pcs 57, 60, 139, 142:
# unsqueeze_copy; 197: view_copy).
_LLAMA_FOLDED_COMMON = [*range(1, 24), 30, 33, 36, 39, 40, 63, 64, 65, 87, 96, 100, 103, 112, 115, 118, 121, 122,
                        145, 146, 147, 169, 178, 182, 185, 195,
                        78, 160]  # full_like of the softmax: reads only its static shape
LLAMA_FOLDED = {"numpy": sorted(_LLAMA_FOLDED_COMMON),
                "torch": sorted([*_LLAMA_FOLDED_COMMON, 57, 60, 139, 142, 197,
                                 # strided views (pyrt.runtime.fold): rotary slices read by neg/cat, GQA expands
                                 # read by a clone, a key permute read by mul
                                 49, 50, 58, 61, 67, 131, 132, 140, 143, 149,
                                 # views whose static view_copy aliases follow them: q/k/v head permutes,
                                 # their rotary slices, the expands before bmm, the attention-output
                                 # permute/clone/permute
                                 32, 35, 38, 42, 43, 69, 70, 80, 81, 83, 84, 85,
                                 114, 117, 120, 124, 125, 151, 152, 162, 163, 165, 166, 167, 194,
                                 55, 56, 137, 138])}  # cat of one tensor (the empty KV cache)


@pytest.mark.parametrize("kernels", ["numpy", "torch"])
def test_llama_folding_decisions(exported: Any, kernels: str) -> None:
    path, inputs = exported("llama")
    with pyrt.Program(path, kernels=kernels) as prog:
        chain = prog._runners["forward"].plan.chains[0]
        folded = [pc for pc, ins in enumerate(chain) if ins.what.endswith("(folded at load)")]
        assert len(chain) == 198
        assert folded == LLAMA_FOLDED[kernels]
    with pyrt.Program(path, kernels=kernels, fold=False) as plain:
        assert not any(ins.what.endswith("(folded at load)") for ins in plain._runners["forward"].plan.chains[0])
