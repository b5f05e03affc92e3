"""Hugging Face causal LMs as one forward over a flat list of tokens, each with its KV-cache slot and position.

Files written now take two inputs more (:class:`TreeSlotDecoderModule`, so that they verify trees of guesses):
``forward(tokens, slots, positions, writes [T], rows, window, visible [T, W])``, each token's cache row apart
from its position, and the rows it reads. What follows describes the older layout, where the row is the position.

``forward(tokens [T], slots [T], positions [T], rows [R], window [W]) -> logits [R, vocab]`` (int64
inputs): token ``t`` of sequence ``slots[t]`` sits at ``positions[t]``; ``rows`` names the tokens whose
logits come back (the last token each sequence fed this step, and for speculative decoding each guessed
token it checks: up to one row per token, ``R <= T``); ``window`` is ``0, 1, ..., W-1``, the
cache positions the step attends to (at least its largest position + 1). This is
the layout vLLM and TensorRT-LLM's in-flight batching use: prefill chunks of new sequences and one
decode token of each running sequence share a step, and one engine holds the weights once.

The cache of each layer is ``[max_batch_size, kv_heads, max_seq_len + 1, head_dim]``, stored flat as
rows of ``head_dim`` (row ``(slot * kv_heads + head) * (max_seq_len + 1) + position``; the one position
more than any token takes keeps a window of every position from being a special case that
``torch.export`` would pin). A step first writes its
tokens' keys and values at their rows (``index_copy_``), then gives every token its own slot's first
W positions, masked to the positions at or before its own: a token never reads another slot, and a
new sequence never reads what a slot's earlier owner left (each position is written before any token
at or after it reads it).

Each token is one row of the model's batch with sequence length 1, so the model's own attention
(eager or SDPA), rotary or learned position embeddings and grouped-query heads run unchanged;
the mask is passed in 4-D, which transformers takes as it is.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch

from pyrt.errors import ExportError
from pyrt.export._graph.hf_decoder import text_config, untouched_zeros


@functools.cache
def _slot_layer_class() -> Any:
    from transformers.cache_utils import StaticLayer

    class SlotLayer(StaticLayer):
        """One layer's cache: writes this step's keys/values at their rows, returns each token's slot."""

        rows: torch.Tensor  # [T * kv_heads] cache rows of this step's tokens' keys and values
        reads: torch.Tensor  # [T * kv_heads * W] cache rows each token reads: its slot's first W positions
        window: int  # W: the cache positions this step attends to
        keys: Any  # [slots * kv_heads * (max_seq_len + 1), head_dim]
        values: Any

        def __init__(self, max_batch_size: int, max_seq_len: int, kv_heads: int) -> None:
            super().__init__(max_seq_len)
            self.batch, self.seq, self.heads = max_batch_size, max_seq_len, kv_heads

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
                   ) -> tuple[torch.Tensor, torch.Tensor]:
            dim = key_states.shape[-1]
            self.keys.index_copy_(0, self.rows, key_states.reshape(-1, dim))  # [T, kv, 1, D] -> [T * kv, D]
            self.values.index_copy_(0, self.rows, value_states.reshape(-1, dim))
            return self._of_slots(self.keys), self._of_slots(self.values)

        def _of_slots(self, cache: torch.Tensor) -> torch.Tensor:
            """[T, kv_heads, W, head_dim]: each token's own slot, its first W positions (one gather)."""
            return cache.index_select(0, self.reads).view(-1, self.heads, self.window, cache.shape[-1])

        def get_seq_length(self) -> int:
            return 0

        def get_mask_sizes(self, *args: Any, **kwargs: Any) -> tuple[int, int]:
            return self.window, 0

    return SlotLayer


class SlotDecoderModule(torch.nn.Module):
    """``forward(tokens, slots, positions, rows, window) -> logits [R, vocab]`` over a cache of slots.

    The cache tensors are registered (non-persistent) buffers ``key_cache_N`` / ``value_cache_N``;
    ``torch.export`` turns them into mutable program state, as for the one-sequence layout.
    """

    def __init__(self, model: Any, max_seq_len: int, max_batch_size: int) -> None:
        super().__init__()
        from transformers import StaticCache
        from transformers.configuration_utils import get_head_shapes

        config = text_config(model)
        self.model = model
        self.max_seq_len, self.max_batch_size = max_seq_len, max_batch_size
        self.cache = StaticCache(max_cache_len=max_seq_len, config=config)
        layer_class = _slot_layer_class()
        heads, head_dim = get_head_shapes(config)
        if not isinstance(heads, int) or not isinstance(head_dim, int):
            raise ExportError(f"{type(model).__name__} has per-layer head shapes ({heads}, {head_dim}); the slot "
                              "layout needs one KV-head count and head size for every layer")
        self.kv_heads = heads
        self.positions = max_seq_len + 1  # cache positions per slot and head (see the module docstring)
        self.layers: list[Any] = [layer_class(max_batch_size, self.positions, heads) for _ in self.cache.layers]
        self.cache.layers[:] = self.layers
        first = next(model.parameters())
        self.dtype = first.dtype
        for i, layer in enumerate(self.layers):
            for kind in ("key", "value"):
                buffer = untouched_zeros((max_batch_size * heads * self.positions, head_dim), first.dtype,
                                         first.device)
                self.register_buffer(f"{kind}_cache_{i}", buffer, persistent=False)
            layer.is_initialized = True
        self.head_only = _head_gives_logits(model)

    def forward(self, tokens: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor,
                window: torch.Tensor) -> torch.Tensor:
        seen = window[None, :] <= positions[:, None]  # window's values, so W is an input of any engine that uses it
        return self._step(tokens, slots, positions, positions, rows, window, seen)

    def _step(self, tokens: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor, writes: torch.Tensor,
              rows: torch.Tensor, window: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
        """Tokens at their RoPE ``positions`` write cache rows ``writes`` of their slots and read the rows of the
        first W where ``seen`` ([T, W] bool) is True."""
        heads = torch.arange(self.kv_heads, device=slots.device)
        starts = (slots[:, None] * self.kv_heads + heads[None, :]) * self.positions  # [T, kv]: each head's row 0
        cache_rows = (starts + writes[:, None]).reshape(-1)
        reads = (starts[:, :, None] + window[None, None, :]).reshape(-1)
        width = window.shape[0]
        for i, layer in enumerate(self.layers):  # the buffers, as export lifted them
            layer.keys, layer.values = getattr(self, f"key_cache_{i}"), getattr(self, f"value_cache_{i}")
            layer.rows, layer.reads, layer.window = cache_rows, reads, width
        blocked = torch.tensor(torch.finfo(self.dtype).min, dtype=self.dtype, device=positions.device)
        mask = torch.where(seen, torch.zeros((), dtype=self.dtype, device=positions.device), blocked)[:, None, None, :]
        args = {"input_ids": tokens[:, None], "position_ids": positions[:, None], "attention_mask": mask,
                "past_key_values": self.cache, "use_cache": True}
        if self.head_only:  # the head over the rows asked for only (a prefill chunk needs one row)
            hidden = self.model.base_model(**args).last_hidden_state[:, 0, :]
            logits: torch.Tensor = self.model.get_output_embeddings()(hidden.index_select(0, rows))
            return logits
        return self.model(**args).logits[:, 0, :].index_select(0, rows)


class TreeSlotDecoderModule(SlotDecoderModule):
    """``forward(tokens, slots, positions, writes, rows, window, visible) -> logits [R, vocab]``: a slot file that
    verifies trees. Token ``t`` sits at RoPE position ``positions[t]`` but writes row ``writes[t]`` of its slot (rows
    are the host's to allocate: :mod:`pyrt.llm.rows`), and reads the rows ``w`` of its slot's first W where
    ``visible[t, w]`` is nonzero (the rows its sequence accepted, its ancestors in the step's tree and itself): two
    siblings at one position write two rows and never read each other."""

    def forward(self, tokens: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor,  # type: ignore[override]
                writes: torch.Tensor, rows: torch.Tensor, window: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        return self._step(tokens, slots, positions, writes, rows, window, visible != 0)


ATTENTION = "pyrt_slots"


def slot_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                   **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Attention of one query token per row over its own slot: ``[T, heads, 1, D]`` against ``[T, kv_heads, W, D]``.

    The query heads that share a KV head are grouped (``[T, kv_heads, heads / kv_heads, D]``), so grouped-query
    models read their keys once instead of a copy repeated per query head (what ``repeat_kv`` makes); the
    softmax runs in float32, as transformers' eager attention does. Returns ``[T, 1, heads, D]``.
    """
    rows, heads, _, dim = query.shape
    groups, width = key.shape[1], key.shape[2]
    share = heads // groups  # query heads per KV head
    grouped = query.reshape(rows * groups, share, dim)
    keys_t = key.reshape(rows * groups, width, dim).transpose(1, 2)
    scores = torch.bmm(grouped, keys_t) * (dim ** -0.5 if scaling is None else scaling)  # bmm: no broadcast copy
    if attention_mask is not None:  # [T, 1, 1, W]: the positions each token may read
        scores = (scores.view(rows, groups, share, width) + attention_mask).view(rows * groups, share, width)
    weights = torch.softmax(scores.float(), dim=-1).to(query.dtype)
    out = torch.bmm(weights, value.reshape(rows * groups, width, dim))  # [T * kv_heads, share, D]
    return out.view(rows, 1, heads, dim), None


@functools.cache
def _register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, slot_attention)


@contextlib.contextmanager
def _attention_of_slots(model: Any) -> Iterator[None]:
    """``model`` attends with :func:`slot_attention` inside the block (its configs' own choice restored after)."""
    _register_attention()
    configs = [c for c in {id(c): c for c in (model.config, text_config(model))}.values()]
    saved = [c._attn_implementation for c in configs]
    try:
        for config in configs:
            config._attn_implementation = ATTENTION
        yield
    finally:
        for config, name in zip(configs, saved, strict=True):
            config._attn_implementation = name


def _head_gives_logits(model: Any) -> bool:
    """True when ``lm_head(base_model(...))`` is the model's logits (no scaling or soft-capping after it).

    Checked on the model itself, eagerly, with a plain causal mask: where a family post-processes its
    logits, the head runs over every token and the rows are picked afterwards (always right, more work).
    The check runs on the first decoder layer alone (:func:`_first_layer_only`; what follows the base model
    does not depend on its depth), so it reads one layer's weights and the head, not the whole checkpoint;
    a family that does not run so shortened is checked whole.
    """
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    base = getattr(model, "base_model", None)
    if head is None or base is None or base is model:
        return False
    vocab = int(text_config(model).vocab_size)
    ids = torch.arange(3, device=next(model.parameters()).device)[None, :] % vocab

    def same() -> bool:
        with torch.no_grad():
            full = model(input_ids=ids, use_cache=False).logits
            mine = head(base(input_ids=ids, use_cache=False).last_hidden_state)
        return bool(full.shape == mine.shape and torch.equal(full, mine))

    with contextlib.suppress(Exception), _first_layer_only(model, base) as shortened:
        if shortened:
            return same()
    try:
        return same()
    except Exception:  # a family whose pieces do not run apart: the whole model it is
        return False


@contextlib.contextmanager
def _first_layer_only(model: Any, base: Any) -> Iterator[bool]:
    """Within: ``base``'s decoder layers cut to the first (its config says one layer); yields False, changing
    nothing, when no module list of ``num_hidden_layers`` layers is found. Restored on the way out."""
    config = text_config(model)
    count = getattr(config, "num_hidden_layers", None)
    found = [(name, child) for name, child in base.named_children()
             if isinstance(child, torch.nn.ModuleList) and len(child) == count]
    if not isinstance(count, int) or count < 2 or len(found) != 1:
        yield False
        return
    name, layers = found[0]
    types = getattr(config, "layer_types", None)
    setattr(base, name, torch.nn.ModuleList(layers[:1]))
    config.num_hidden_layers = 1
    if isinstance(types, list):
        config.layer_types = types[:1]
    try:
        yield True
    finally:
        setattr(base, name, layers)
        config.num_hidden_layers = count
        if isinstance(types, list):
            config.layer_types = types


def wrap(model: Any, max_seq_len: int, max_batch_size: int, tree: bool = True) -> torch.nn.Module:
    """The slot-layout module (``tree``: the one that verifies trees, as files are written now; False: the older
    layout, row = position); transformers' errors become ExportError."""
    try:
        return (TreeSlotDecoderModule if tree else SlotDecoderModule)(model, max_seq_len, max_batch_size).eval()
    except Exception as exc:  # transformers raises many types for models it cannot cache
        raise ExportError(f"wrapping {type(model).__name__} with a cache of {max_batch_size} slots failed: "
                          f"{type(exc).__name__}: {exc}") from exc


def export(module: torch.nn.Module, max_tokens: int, max_seq_len: int, max_rows: int | None = None
           ) -> torch.export.ExportedProgram:
    """torch.export the slot decoder: 1..``max_tokens`` tokens per step, 1..``max_rows`` logits rows (default
    ``max_tokens``: a row for every token, so a step can check every sequence's guesses), a window of
    1..``max_seq_len`` positions. (Files written before speculative decoding bound the rows by the slots.)"""
    example: tuple[torch.Tensor, ...] = (torch.tensor([3, 4]), torch.tensor([0, 1]), torch.tensor([0, 1]),
                                         torch.tensor([0, 1]), torch.arange(3))  # sizes >= 2: torch.export
    tokens = torch.export.Dim("tokens", min=1, max=max_tokens)  # specializes sizes 0 and 1
    rows = torch.export.Dim("rows", min=1, max=max_tokens if max_rows is None else max_rows)
    window = torch.export.Dim("window", min=1, max=max_seq_len)
    shapes: tuple[dict[int, Any], ...] = ({0: tokens}, {0: tokens}, {0: tokens}, {0: rows}, {0: window})
    if isinstance(module, TreeSlotDecoderModule):  # ... writes [T] after positions, visible [T, W] last
        example = (*example[:3], torch.tensor([0, 1]), *example[3:], torch.tensor([[1, 0, 0], [1, 1, 0]]))
        shapes = (*shapes[:3], {0: tokens}, *shapes[3:], {0: tokens, 1: window})
    model = getattr(module, "model", None)
    try:
        with torch.no_grad(), _attention_of_slots(model) if model is not None else contextlib.nullcontext():
            return torch.export.export(module, example, dynamic_shapes=shapes, strict=False)
    except Exception as exc:  # torch.export raises many error types
        slots = getattr(module, "max_batch_size", "?")
        raise ExportError(f"torch.export of the {slots}-slot decoder failed: {type(exc).__name__}: {exc}") from exc
