"""ExecuTorch's LLM convention, read from a loaded program.

``forward(tokens [batch, seq] int64, input_pos [seq or 1] int64) -> logits [batch, seq, vocab]`` (or the
last position's ``[batch, vocab]``, as ExecuTorch's llama export writes without full logits)
with a KV cache kept in the program's state; or pyrt's slot layout (``decoder_to_pte(max_batch_size=B)``):
``forward(tokens [T], slots [T], positions [T], rows [R], window [W]) -> logits [R, vocab]`` over a
cache of B slots, with ``get_max_batch_size`` and ``get_max_tokens_per_step``; or the slot layout that
verifies trees (files written now): ``forward(tokens [T], slots [T], positions [T], writes [T], rows [R],
window [W], visible [T, W])``, where ``writes`` is the cache row of its slot each token writes (its logical
position stays ``positions``, for RoPE) and ``visible[t, w]`` is 1 where token ``t`` reads row ``w`` of its slot
(``Convention.tree``); plus constant methods
(``get_max_seq_len``, ``get_max_context_len``, ``get_vocab_size``, ``get_bos_id``, ``get_eos_ids``, ``get_n_layers``,
``use_kv_cache``, ``enable_dynamic_shape``) as ExecuTorch's llama export writes them.
Missing optional methods fall back as ExecuTorch's runner does (the context is the
sequence length, the vocabulary the logits' last dimension, no BOS/EOS).

``Convention.max_rows`` is the most logits rows one call returns: a slot file's ``rows`` bound
(``max_tokens_per_step`` for files written now, ``max_batch_size`` for older ones), a one-sequence
file's sequence bound when its logits cover every position (``[1, seq, vocab]``), else 1 (the
last position's logits only). Speculative decoding checks a sequence's guesses with one row each
beside the row of its last token, so a file of ``max_rows`` 1 cannot verify any.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from pyrt.errors import InputError, PyrtError
from pyrt.format.dtypes import ScalarType
from pyrt.runtime.program import Program

CONSTANT_METHODS = ("get_max_seq_len", "get_max_context_len", "get_vocab_size", "get_bos_id", "get_eos_ids",
                    "get_n_layers", "use_kv_cache", "enable_dynamic_shape", "get_max_batch_size",
                    "get_max_tokens_per_step")
SINGLE, SLOTS = "single", "slots"  # the two layouts: one sequence per call; a flat list of tokens in slots
SLOT_INPUTS = ("tokens", "slots", "positions", "rows", "window")
TREE_INPUTS = ("tokens", "slots", "positions", "writes", "rows", "window", "visible")
INT64 = int(ScalarType.LONG)


@dataclass(frozen=True)
class Convention:
    """What a generation loop needs to know about a conforming program."""

    method: str
    batch: int
    max_prefill: int  # tokens one forward call takes (the seq dimension's upper bound)
    dynamic: bool  # the seq dimension is dynamic: a prompt is prefilled in one call
    max_context_len: int  # cache positions
    vocab_size: int
    bos_id: int | None
    eos_ids: tuple[int, ...]
    n_layers: int | None
    constants: dict[str, Any]
    start_position: bool = False  # input_pos is [1], the first token's position (ExecuTorch's llama export)
    torch_io: bool = False  # bfloat16 logits on torch kernels (numpy has no bfloat16): runs take torch tensors
    layout: str = SINGLE  # SINGLE: forward(tokens [batch, seq], input_pos); SLOTS: tokens, slots, positions, rows
    slots: int = 1  # sequences the cache holds at once (max_batch_size); 1 for SINGLE files
    max_rows: int = 1  # the most logits rows one forward call returns (see the module docstring)
    tree: bool = False  # a slot file that takes each token's cache row and visible rows: it verifies trees

    @property
    def tokens_per_step(self) -> int:
        """The most tokens one forward call takes (a dynamic SINGLE file: its sequence bound; static: 1)."""
        return self.max_prefill if self.dynamic or self.layout == SLOTS else 1


def read_convention(program: Any, method: str = "forward") -> Convention:
    """The convention ``program``'s ``method`` follows; InputError naming what does not conform."""
    if not isinstance(program, Program):
        raise InputError(f"program must be a pyrt.Program, got {type(program).__name__}")
    where = f"{program.source}: method {method!r}"
    plans = {p.name: p for p in program._pte.program.execution_plan}  # the reader's records, read-only
    plan = plans.get(method)
    if plan is None:
        raise InputError(f"{program.source}: no method {method!r} (methods: {sorted(plans)}); "
                         "an LLM file needs forward(tokens, input_pos)")
    tree = len(plan.inputs) == len(TREE_INPUTS)
    slot_layout = tree or len(plan.inputs) == len(SLOT_INPUTS)
    tokens, pos, logits = _slot_signature(plan, where, tree) if slot_layout else _signature(plan, where)
    constants = {name: _constant(program, name) for name in CONSTANT_METHODS if name in plans}
    if constants.get("use_kv_cache") is False:
        raise InputError(f"{where}: use_kv_cache is False; pyrt generates with a KV cache only")
    context = _int(constants.get("get_max_context_len", constants.get("get_max_seq_len", tokens[1])), where,
                   "get_max_context_len")
    vocab = _int(constants.get("get_vocab_size", logits[-1]), where, "get_vocab_size")
    if vocab != logits[-1]:
        raise InputError(f"{where}: get_vocab_size is {vocab} but the logits' last dimension is {logits[-1]}")
    bos = constants.get("get_bos_id")
    eos = constants.get("get_eos_ids", ())
    eos_ids = tuple(_int(e, where, "get_eos_ids") for e in (eos if isinstance(eos, (list, tuple)) else [eos]))
    layers = constants.get("get_n_layers")
    conv = Convention(method, tokens[0], tokens[1], tokens[2], context, vocab,
                      None if bos is None else _int(bos, where, "get_bos_id"), eos_ids,
                      None if layers is None else _int(layers, where, "get_n_layers"), constants,
                      start_position=pos == (1,) and tokens[1] > 1,
                      torch_io=int(plan.values[plan.outputs[0]].tensor.scalar_type) == ScalarType.BFLOAT16
                      and program.kernels != "numpy",
                      max_rows=tokens[1] if len(logits) == 3 and logits[1] == tokens[1] else 1)
    return replace(_with_slots(conv, logits[0], where), tree=tree) if slot_layout else conv


def _with_slots(conv: Convention, rows: int, where: str) -> Convention:
    """A slot-layout file's convention: its slots and token budget, checked against the signature's bounds."""
    slots = _int(conv.constants.get("get_max_batch_size", rows), where, "get_max_batch_size")
    budget = _int(conv.constants.get("get_max_tokens_per_step", conv.max_prefill), where, "get_max_tokens_per_step")
    if not 1 <= slots <= rows or not slots <= budget <= conv.max_prefill:
        raise InputError(f"{where}: get_max_batch_size {slots} and get_max_tokens_per_step {budget} do not fit "
                         f"forward's bounds ({rows} logits rows, {conv.max_prefill} tokens)")
    return replace(conv, max_prefill=budget, layout=SLOTS, slots=slots, max_rows=min(rows, budget))


def follows_convention(program: Any, method: str = "forward") -> bool:
    """True when ``program``'s ``method`` follows the LLM convention (:func:`read_convention` succeeds)."""
    try:
        read_convention(program, method)
    except PyrtError:
        return False
    return True


def _signature(plan: Any, where: str) -> tuple[tuple[int, int, bool], tuple[int, ...], tuple[int, ...]]:
    """((batch, max seq, dynamic), input_pos sizes, logits sizes) or InputError."""
    ins = [plan.values[i] for i in plan.inputs]
    outs = [plan.values[i] for i in plan.outputs]
    if len(ins) != 2 or any(v.kind != "Tensor" for v in ins):
        raise InputError(f"{where} takes {len(ins)} input(s) ({', '.join(v.kind for v in ins)}); the LLM "
                         "convention is forward(tokens [batch, seq] int64, input_pos [seq] int64)")
    tokens, pos = (v.tensor for v in ins)
    for name, t, rank in (("tokens", tokens, 2), ("input_pos", pos, 1)):
        if int(t.scalar_type) != INT64 or len(t.sizes) != rank:
            raise InputError(f"{where}: input {name} is {t.scalar_type.dtype_name}{list(t.sizes)}; "
                             f"the convention needs int64 of rank {rank}")
    if len(outs) != 1 or outs[0].kind != "Tensor" or len(outs[0].tensor.sizes) not in (2, 3):
        raise InputError(f"{where}: the convention returns one logits tensor, [batch, seq, vocab] or the last "
                         "position's [batch, vocab]")
    dynamic = tokens.shape_dynamism.name != "STATIC"
    batch, seq = tokens.sizes
    if tuple(pos.sizes) not in ((seq,), (1,)):
        raise InputError(f"{where}: input_pos has sizes {list(pos.sizes)}, tokens {list(tokens.sizes)}; the "
                         "convention's input_pos is [seq] (each token's position) or [1] (the first one's)")
    return (batch, seq, dynamic), tuple(pos.sizes), tuple(outs[0].tensor.sizes)


def _slot_signature(plan: Any, where: str, tree: bool = False
                    ) -> tuple[tuple[int, int, bool], tuple[int, ...], tuple[int, ...]]:
    """((1, max tokens, dynamic), positions sizes, logits sizes) of forward(tokens, slots, positions, rows, window)
    (``tree``: of forward(tokens, slots, positions, writes, rows, window, visible))."""
    names = TREE_INPUTS if tree else SLOT_INPUTS
    ins = dict(zip(names, (plan.values[i] for i in plan.inputs), strict=True))
    outs = [plan.values[i] for i in plan.outputs]
    layout = ("forward(tokens [T], slots [T], positions [T], writes [T], rows [R], window [W], visible [T, W])"
              if tree else "forward(tokens [T], slots [T], positions [T], rows [R], window [W])")
    for name, v in ins.items():
        rank = 2 if name == "visible" else 1
        if v.kind != "Tensor" or int(v.tensor.scalar_type) != INT64 or len(v.tensor.sizes) != rank:
            raise InputError(f"{where}: input {name} is not an int64 tensor of rank {rank}; the slot layout is "
                             f"{layout} with int64 inputs")
    tokens, slots, pos, rows = (ins[n].tensor for n in ("tokens", "slots", "positions", "rows"))
    same = [ins[n].tensor for n in ("writes",) if n in ins]
    if not tokens.sizes == slots.sizes == pos.sizes or any(t.sizes != tokens.sizes for t in same):
        raise InputError(f"{where}: tokens {list(tokens.sizes)}, slots {list(slots.sizes)} and positions "
                         f"{list(pos.sizes)}{' and writes' if tree else ''} must have one size (one entry per token)")
    if tree and ins["visible"].tensor.sizes[0] != tokens.sizes[0]:
        raise InputError(f"{where}: visible has {ins['visible'].tensor.sizes[0]} rows, tokens {tokens.sizes[0]}")
    if len(outs) != 1 or outs[0].kind != "Tensor" or len(outs[0].tensor.sizes) != 2:
        raise InputError(f"{where}: the slot layout returns one logits tensor [rows, vocab]")
    if outs[0].tensor.sizes[0] != rows.sizes[0]:
        raise InputError(f"{where}: logits have {outs[0].tensor.sizes[0]} rows at most but rows takes {rows.sizes[0]}")
    return (1, tokens.sizes[0], tokens.shape_dynamism.name != "STATIC"), tuple(pos.sizes), tuple(outs[0].tensor.sizes)


def _constant(program: Program, name: str) -> Any:
    try:
        return program.run(method=name)
    except PyrtError as exc:
        raise InputError(f"{program.source}: constant method {name!r} failed: {exc}") from exc


def _int(value: Any, where: str, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(f"{where}: {name} is {value!r}, not a non-negative int")
    return value
