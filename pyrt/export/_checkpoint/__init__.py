"""A Hugging Face checkpoint directory for ``pyrt export``: its files and shard headers checked
(``directory``, ``safetensors_header``), its model checked and loaded without a second copy (``model``),
its tokenizer kept beside the .pte (``tokenizer``)."""
