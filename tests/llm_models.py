"""Small random-init causal LMs of eight families (Hugging Face ``transformers``, built in code, no downloads).

>>> sorted(FAMILIES)                                                        # doctest: +SKIP
['gemma', 'gpt2', 'gpt_neox', 'llama', 'mistral', 'opt', 'phi3', 'qwen2']
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

VOCAB = 100
POSITIONS = 64
_COMMON = {"vocab_size": VOCAB, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}


def _decoder(**extra: Any) -> dict[str, Any]:
    return {"num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4,
            "max_position_embeddings": POSITIONS, **_COMMON, **extra}


def llama() -> Any:
    import transformers as tf

    return tf.LlamaForCausalLM(tf.LlamaConfig(**_decoder(num_key_value_heads=2)))


def qwen2() -> Any:
    import transformers as tf

    return tf.Qwen2ForCausalLM(tf.Qwen2Config(**_decoder(num_key_value_heads=2)))


def mistral() -> Any:
    import transformers as tf

    return tf.MistralForCausalLM(tf.MistralConfig(**_decoder(num_key_value_heads=2, sliding_window=None)))


def gemma() -> Any:
    import transformers as tf

    return tf.GemmaForCausalLM(tf.GemmaConfig(**_decoder(num_key_value_heads=1, head_dim=8)))


def phi3() -> Any:
    import transformers as tf

    config = tf.Phi3Config(**_decoder(num_key_value_heads=2, original_max_position_embeddings=POSITIONS))
    return tf.Phi3ForCausalLM(config)


def gpt2() -> Any:
    import transformers as tf

    return tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=POSITIONS, **_COMMON))


def gpt_neox() -> Any:
    import transformers as tf

    return tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(**_decoder()))


def opt() -> Any:
    import transformers as tf

    return tf.OPTForCausalLM(tf.OPTConfig(num_hidden_layers=2, hidden_size=32, ffn_dim=64, num_attention_heads=2,
                                          word_embed_proj_dim=32, max_position_embeddings=POSITIONS, **_COMMON))


FAMILIES: dict[str, Callable[[], Any]] = {
    "llama": llama, "qwen2": qwen2, "mistral": mistral, "gemma": gemma, "phi3": phi3, "gpt2": gpt2,
    "gpt_neox": gpt_neox, "opt": opt,
}


def build(name: str, seed: int = 0) -> Any:
    """Family ``name``'s model, random weights from ``seed``, in eval mode."""
    torch.manual_seed(seed)
    return FAMILIES[name]().eval()


def eager_greedy(model: Any, prompt: list[int], new_tokens: int) -> list[int]:
    """``model.generate(do_sample=False)``'s new tokens, never stopping early (no EOS)."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    return [int(t) for t in out[0, len(prompt):]]


PROMPT = [5, 6, 7, 8, 9]
NEW_TOKENS = 32
MAX_SEQ_LEN = 48


class Exported:
    """One family exported once per session: its file, summary and eager reference tokens."""

    def __init__(self, name: str, path: Any, builder: str, route: str = "auto", **options: Any) -> None:
        from pyrt.export import decoder_to_pte

        self.name, self.model = name, build(name)
        self.want = eager_greedy(self.model, PROMPT, NEW_TOKENS)
        self.path = path
        self.summary = decoder_to_pte(self.model, path, max_seq_len=MAX_SEQ_LEN, builder=builder, route=route,
                                      progress=False, **options)
