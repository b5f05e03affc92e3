"""The slot layout's check that a family's logits are ``lm_head(base_model(...))``: it runs on the first decoder
layer alone, so an export reads one layer's weights and the head for it, not the whole checkpoint (issue 43)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from pyrt.export._graph.slot_decoder import _head_gives_logits  # noqa: E402
from pyrt.testing import archs  # noqa: E402


def _ran(model: Any) -> list[int]:
    """Each decoder layer's index, appended whenever it runs (forward hooks)."""
    ran: list[int] = []
    for i, layer in enumerate(model.model.layers):
        layer.register_forward_hook(lambda *_, i=i: ran.append(i))
    return ran


def _gemma2(softcap: float | None) -> Any:
    torch.manual_seed(0)
    config = transformers.Gemma2Config(**archs.decoder_config("llm", 3, num_key_value_heads=1, head_dim=8,
                                                               final_logit_softcapping=softcap))
    return transformers.Gemma2ForCausalLM(config).eval()


@pytest.mark.parametrize("make, want", [
    (lambda: archs.causal_lm("llama", layers=3), True),
    (lambda: archs.causal_lm("qwen2", layers=3), True),
    (lambda: _gemma2(None), True),
    (lambda: _gemma2(30.0), False),  # soft-capped logits: the head is not the last step
], ids=["llama", "qwen2", "gemma2", "gemma2-softcapped"])
def test_the_head_check_reads_the_first_layer_only_and_restores_the_model(make: Any, want: bool) -> None:
    model = make()
    layers, count = model.model.layers, model.config.num_hidden_layers
    types = getattr(model.config, "layer_types", None)
    ran = _ran(model)
    assert _head_gives_logits(model) is want
    assert ran and set(ran) == {0}  # layers 1 and 2 never ran: their weights were not read
    assert model.model.layers is layers and model.config.num_hidden_layers == count == 3
    assert getattr(model.config, "layer_types", None) == types
    ran.clear()
    model(input_ids=torch.tensor([[1, 2]]), use_cache=False)
    assert ran == [0, 1, 2]  # the model is whole again


def test_a_family_that_does_not_run_shortened_is_checked_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    model = archs.causal_lm("llama", layers=3)
    ran = _ran(model)
    real = model.model.forward

    def refuses_one_layer(*args: Any, **kwargs: Any) -> Any:
        if len(model.model.layers) == 1:
            raise RuntimeError("this family needs its layer pattern")
        return real(*args, **kwargs)

    monkeypatch.setattr(model.model, "forward", refuses_one_layer)
    assert _head_gives_logits(model) is True
    assert set(ran) == {0, 1, 2} and len(model.model.layers) == 3
