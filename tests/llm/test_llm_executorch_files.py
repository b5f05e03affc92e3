"""pyrt.generate on files written the way ExecuTorch's own llama export writes them: ``input_pos`` [1]
(the first token's position) and logits of the last position only ([batch, vocab])."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import pyrt
import pyrt.llm
from pyrt.export._graph import hf_decoder as _decoder_wrap
from pyrt.testing import archs
from tests.fixtures import llm_models as L


def _executorch_greedy(path: Path, prompt: list[int], new: int) -> list[int]:
    """ExecuTorch's runtime, one token per call (positions as [1])."""
    from executorch.runtime import Runtime

    method = Runtime.get().load_program(path).load_method("forward")
    for i, token in enumerate(prompt):
        logits = method.execute([torch.tensor([[token]]), torch.tensor([i])])[0]
    out: list[int] = []
    for i in range(new):
        out.append(int(logits.reshape(-1, logits.shape[-1])[-1].argmax()))
        logits = method.execute([torch.tensor([[out[-1]]]), torch.tensor([len(prompt) + i])])[0]
    return out


@pytest.mark.export
def test_start_position_and_last_logits_files(tmp_path: Path) -> None:
    """A decoder exported in ExecuTorch's llama signature generates what model.generate does."""
    from executorch.exir import to_edge

    model = archs.causal_lm("llama")
    inner = _decoder_wrap.wrap("pyrt", model, L.MAX_SEQ_LEN, 1)

    class StartPosition(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
            positions = input_pos + torch.arange(tokens.shape[1])
            return self.inner(tokens, positions)[:, -1]

    seq = torch.export.Dim("seq", min=1, max=L.MAX_SEQ_LEN - 1)
    with torch.no_grad():
        program = torch.export.export(StartPosition(), (torch.tensor([[1, 2]]), torch.tensor([0])),
                                      dynamic_shapes=({1: seq}, None), strict=False)
    from pyrt.export.decoder import constant_methods

    path = tmp_path / "start.pte"
    path.write_bytes(to_edge(program, constant_methods=constant_methods(model, L.MAX_SEQ_LEN, True))
                     .to_executorch().buffer)
    with pyrt.Program(path) as prog:
        conv = pyrt.llm.read_convention(prog)
        assert conv.start_position and conv.dynamic
        out = pyrt.generate(prog, L.PROMPT, max_new_tokens=L.NEW_TOKENS, eos_ids=[])
    assert out.tokens == archs.greedy(model, L.PROMPT, L.NEW_TOKENS) == _executorch_greedy(path, L.PROMPT,
                                                                                         L.NEW_TOKENS)


@pytest.mark.slow
def test_a_file_from_executorchs_llama_export(tmp_path: Path) -> None:
    """``python -m executorch.examples.models.llama.export_llama`` (random weights, portable kernels)."""
    pytest.importorskip("executorch.examples.models.llama.export_llama")
    params = {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 128, "multiple_of": 32,
              "norm_eps": 1e-5}
    (tmp_path / "params.json").write_text(json.dumps(params))
    code = ("import json, torch, sys\n"
            "from executorch.examples.models.llama.llama_transformer import construct_transformer\n"
            "from executorch.examples.models.llama.model_args import ModelArgs\n"
            "torch.manual_seed(0)\n"
            "m = construct_transformer(ModelArgs(**json.load(open(sys.argv[1])), max_seq_len=48, max_context_len=48))\n"
            "torch.save({k: torch.randn_like(v) * 0.2 if v.is_floating_point() else v\n"
            "            for k, v in m.state_dict().items()}, sys.argv[2])\n")
    run: Any = lambda *a: subprocess.run([sys.executable, *a], cwd=tmp_path, check=True, capture_output=True)  # noqa: E731
    run("-c", code, "params.json", "ck.pt")
    run("-m", "executorch.examples.models.llama.export_llama", "--checkpoint", "ck.pt", "--params", "params.json",
        "--use_kv_cache", "--max_seq_length", "48", "--max_context_length", "48", "--output_name",
        str(tmp_path / "et.pte"), "--metadata", '{"get_bos_id": 1, "get_eos_ids": [2]}')
    prompt = [1, 5, 6, 7]
    with pyrt.Program(tmp_path / "et.pte") as prog:
        conv = pyrt.llm.read_convention(prog)
        assert (conv.max_context_len, conv.vocab_size, conv.eos_ids, conv.start_position) == (48, 128, (2,), True)
        got = pyrt.generate(prog, prompt, max_new_tokens=20, eos_ids=[]).tokens
    want = _executorch_greedy(tmp_path / "et.pte", prompt, 20)
    assert got == want and len(set(want)) > 1  # random weights give varied tokens, not one repeated id
