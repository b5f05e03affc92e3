"""Hugging Face tokenizers trained in code, for the LLM tests and benchmarks: no hub, no download.

:func:`byte_level_bpe` trains a byte-level BPE (GPT-2's kind) on a text in well under a second
and saves it as a tokenizer directory that ``transformers.AutoTokenizer.from_pretrained(dir,
local_files_only=True)`` loads, with a chat template. Ids 0, 1, 2 are ``<pad>``, ``<s>``, ``</s>``
(the pad, BOS and EOS ids of :func:`pyrt.testing.archs.causal_lm`'s models). With
``full_alphabet=False`` the byte alphabet is only the bytes the text has, so a small vocabulary
(the ``llm`` models' 100 ids) still holds every byte of the text's multi-byte characters as a
token of its own.

>>> path = byte_level_bpe(tmp / "tok", "hello world", vocab_size=20)      # doctest: +SKIP
"""

from __future__ import annotations

import random
from pathlib import Path

from pyrt.errors import PyrtError

SPECIALS = ("<pad>", "<s>", "</s>")
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def byte_level_bpe(directory: str | Path, text: str, vocab_size: int, *, full_alphabet: bool = False,
                   chat_template: str = CHAT_TEMPLATE) -> Path:
    """Train on ``text`` a byte-level BPE of exactly ``vocab_size`` tokens and save it in ``directory``.

    PyrtError when the text has too few pairs to merge up to ``vocab_size`` (give a longer text),
    or more distinct bytes than fit.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet() if full_alphabet else []
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=alphabet, special_tokens=list(SPECIALS),
                                  show_progress=False)
    tokenizer.train_from_iterator(text.splitlines() or [text], trainer)
    if tokenizer.get_vocab_size() != vocab_size:
        raise PyrtError(f"the training text gives {tokenizer.get_vocab_size()} tokens, not {vocab_size}: "
                        "give a longer text (more pairs to merge) or one with fewer distinct bytes")
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token=SPECIALS[0], bos_token=SPECIALS[1],
                                   eos_token=SPECIALS[2])
    fast.chat_template = chat_template
    fast.save_pretrained(str(directory))
    return Path(directory)


def words(count: int, seed: int = 0) -> str:
    """``count`` made-up words of two to four syllables, one line per 12 (a corpus with many pairs to merge)."""
    rng = random.Random(seed)
    onsets, vowels, codas = "bcdfghjklmnprstvwz", "aeiou", ["", "n", "r", "s", "t", "l", "ng", "st"]
    made = ["".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas) for _ in range(rng.randint(2, 4)))
            for _ in range(count)]
    return "\n".join(" ".join(made[i:i + 12]) for i in range(0, count, 12))
