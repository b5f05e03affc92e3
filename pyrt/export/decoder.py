"""``decoder_to_pte``: a Hugging Face causal LM -> a .pte that follows ExecuTorch's LLM convention.

The file's ``forward(tokens [batch, seq] int64, input_pos [seq] int64) -> logits`` keeps a
static KV cache as program state (device memory when engines update it), and the file
carries the constant methods ExecuTorch's llama export writes (``get_max_seq_len``,
``get_max_context_len``, ``get_vocab_size``, ``get_bos_id``, ``get_eos_ids``, ``get_n_layers``,
``use_kv_cache``, ``enable_dynamic_shape``), so ExecuTorch's runners and :func:`pyrt.generate`
read the same files.

``max_batch_size=B`` (B > 1) writes one file for B sequences at once: ``forward(tokens [T], slots [T],
positions [T], writes [T], rows [R], window [W], visible [T, W]) -> logits [R, vocab]`` over a KV cache of B slots
(each token's cache row and the rows it reads beside its position: files that verify trees of guesses)
(:mod:`pyrt.export._graph.slot_decoder`), where one step may prefill a new sequence's prompt while the
others decode, with the weights stored once. ``get_max_batch_size`` and ``get_max_tokens_per_step``
(the token budget of one step) say so in the file. A step returns up to ``max_tokens_per_step``
logits rows, so speculative decoding can check several guessed tokens of every sequence in one step.

Routes (``summary.route``): ``"upstream"`` (transformers' ExecuTorch integration) is tried
first by ``route="auto"``; where it fails (torch 2.13 cannot decompose its dynamic-length
program) pyrt's own wrapper (:class:`pyrt.export._graph.hf_decoder.DecoderModule`) takes over and
``summary.route_reason`` says why.

``decoder_to_pte`` checks its options once (:func:`pyrt.export.decoder_options.decoder_options`) and
:func:`write_decoder` follows them; ``checkpoint_to_pte`` checks them before the weights load and
calls :func:`write_decoder` itself.

>>> import transformers as tf                                               # doctest: +SKIP
>>> model = tf.LlamaForCausalLM(tf.LlamaConfig(num_hidden_layers=2, hidden_size=32, ...))  # doctest: +SKIP
>>> s = decoder_to_pte(model, "m.pte", max_seq_len=64, builder="reference")  # doctest: +SKIP
>>> s.route, s.constant_methods["get_max_seq_len"]                          # doctest: +SKIP
('pyrt', 64)
"""

from __future__ import annotations

import copy
import logging
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import sympy
import torch
from torch.utils._sympy.numbers import int_oo

from pyrt.checks import is_int
from pyrt.errors import ExportError
from pyrt.export._engines.progress import Progress
from pyrt.export._files.atomic import atomic_write_all
from pyrt.export._graph import hf_decoder as wrap
from pyrt.export._graph import portable_quant, slot_decoder
from pyrt.export._graph.passes import decompose
from pyrt.export._write.lower import fallback_ops
from pyrt.export.api import write_pte
from pyrt.export.decoder_options import ROUTES, DecoderOptions, decoder_options
from pyrt.export.options import DECODER_BUILDERS, DEFAULT_BUILDER, DEFAULT_DEVICE
from pyrt.export.summary import ExportSummary, QuantSummary
from pyrt.format.weight_quant import DEFAULT_GROUP_SIZE, Scheme

log = logging.getLogger("pyrt.export")
BUILDERS = DECODER_BUILDERS


def decoder_to_pte(
    model: Any,
    path: str | Path,
    *,
    max_seq_len: int,
    builder: str = DEFAULT_BUILDER,
    batch_size: int = 1,
    max_batch_size: int = 1,
    max_tokens_per_step: int | None = None,
    dtype: Any = None,
    dynamic_prefill: bool = True,
    route: str = "auto",
    weight_streaming: bool = False,
    weight_streaming_budget: Any = None,
    device: Any = DEFAULT_DEVICE,
    bos_id: int | None = None,
    eos_ids: Any = None,
    progress: bool | Progress | None = None,
    quantize: str | None = None, group_size: int = DEFAULT_GROUP_SIZE,
    max_engine_size: int | str | None = None,
) -> ExportSummary:
    """Export a causal LM with a static KV cache of ``max_seq_len`` positions; returns the summary.

    ``builder``: as for :func:`pyrt.export.to_pte`, or ``"portable"``: no delegate, every
    operator on ExecuTorch's portable kernels (the file ExecuTorch's own runtime runs).
    ``dynamic_prefill``: the sequence length is dynamic (1..max_seq_len), so a whole prompt is
    prefilled in one call; False exports one token per call. ``dtype``: cast the model first
    (``torch.float16``, ``"bfloat16"``, ...; the caller's model is not changed).
    ``route``: "auto", "upstream" (transformers' recipe) or "pyrt" (pyrt's wrapper).
    ``bos_id`` / ``eos_ids``: written as ``get_bos_id`` / ``get_eos_ids``; default from the
    model's generation config (else its config). Weight streaming, budgets and devices
    mean what they mean for ``to_pte``. Every option is checked before any work.
    ``max_batch_size``: sequences the file serves at once, each in its own KV-cache slot (1: today's
    one-sequence file; ``batch_size`` is the older fixed batch of sequences that move in step).
    ``max_tokens_per_step``: the most tokens one forward call takes (prefill chunks and decode tokens
    together; default ``max(max_batch_size, min(max_seq_len, 256))``).
    ``quantize`` / ``group_size``: weight-only INT8 / INT4 linear layers, LM head included, as for ``to_pte``;
    portable files dequantize with ExecuTorch's quantized kernels (:mod:`pyrt.export._graph.portable_quant`).
    ``max_engine_size``: the most weight bytes of one engine (an int, or ``"2GiB"``): the decoder is cut at layer
    boundaries into the fewest engines that fit (:mod:`pyrt.export._graph.layer_groups`); None: one engine when
    the export's estimated peak fits the host's available memory, else the fewest groups that do
    (:mod:`pyrt.export.engine_size`; ``summary.grouping`` says which and why).
    """
    started = time.perf_counter()
    options = decoder_options(
        model, max_seq_len=max_seq_len, builder=builder, batch_size=batch_size, max_batch_size=max_batch_size,
        max_tokens_per_step=max_tokens_per_step, dtype=dtype, dynamic_prefill=dynamic_prefill, route=route,
        bos_id=bos_id, eos_ids=eos_ids, weight_streaming=weight_streaming,
        weight_streaming_budget=weight_streaming_budget, device=device, progress=progress, quantize=quantize,
        group_size=group_size, max_engine_size=max_engine_size)
    return replace(write_decoder(model, path, options), seconds=time.perf_counter() - started)


def write_decoder(model: Any, path: str | Path, options: DecoderOptions) -> ExportSummary:
    """Export ``model`` as ``options`` say (checked already: :func:`~pyrt.export.decoder_options.decoder_options`)."""
    started, bars = time.perf_counter(), options.progress
    methods = constant_methods(model, options.max_seq_len, options.dynamic_prefill, options.bos_id, options.eos_ids)
    model, quantized = _prepared(model, options.dtype, options.quantize if options.export is None else None)
    with bars.task("wrapping the decoder with its KV cache and exporting it (torch.export)", stage="export"):
        if options.tokens_per_step is None:
            program, chosen, reason = _program(model, options.route, options.batch_size, options.max_seq_len,
                                               options.dynamic_prefill)
        else:
            methods.update(get_max_batch_size=options.max_batch_size, get_max_tokens_per_step=options.tokens_per_step,
                           enable_dynamic_shape=True)
            program, chosen, reason = _slot_program(model, options.max_seq_len, options.max_batch_size,
                                                    options.tokens_per_step)
    if options.export is None:
        summary = replace(_portable(program, path, methods, started, bars), quantization=quantized)
    else:
        summary = write_pte(program, path, options.export, constant_methods=methods)
    return replace(summary, route=chosen, route_reason=reason, constant_methods=methods, grouping=options.grouping,
                   seconds=time.perf_counter() - started)


def _prepared(model: Any, cast: Any, scheme: Scheme | None) -> tuple[Any, QuantSummary | None]:
    """The model to export: the caller's, or a copy cast to ``cast`` (:func:`_cast`) and, for a portable file,
    with its linear layers quantized for ExecuTorch's kernels (the caller's model is never changed)."""
    prepared = _cast(model, cast)
    if scheme is None:
        return prepared, None
    if prepared is model:  # quantizing changes the layers: never the caller's
        prepared = copy.deepcopy(model)
    return prepared, portable_quant.quantize_linears(prepared, scheme)


def _cast(model: Any, dtype: Any) -> Any:
    """``model`` in ``dtype``: a converted copy (the caller's model unchanged), or the model itself when every
    floating tensor already has that dtype (no copy of weights that may be a checkpoint's mapped pages)."""
    if dtype is None:
        return model
    tensors = [*model.parameters(), *model.buffers()]
    if all(t.dtype == dtype for t in tensors if t.is_floating_point()):
        return model
    return copy.deepcopy(model).to(dtype)


def constant_methods(model: Any, max_seq_len: int, dynamic: bool, bos_id: Any = None, eos_ids: Any = None
                     ) -> dict[str, Any]:
    """The metadata methods ExecuTorch's llama export writes (``get_bos_id``/``get_eos_ids`` when known)."""
    config = wrap.text_config(model)
    vocab: Any = getattr(config, "vocab_size", None)
    layers: Any = getattr(config, "num_hidden_layers", None)
    if not is_int(vocab) or not is_int(layers):
        raise ExportError(f"model config {type(config).__name__} has no integer vocab_size / num_hidden_layers: "
                          "is it a causal language model?")
    generation = getattr(model, "generation_config", None)
    bos = bos_id if bos_id is not None else _first(generation, config, "bos_token_id")
    eos = eos_ids if eos_ids is not None else _first(generation, config, "eos_token_id")
    methods: dict[str, Any] = {"get_max_seq_len": max_seq_len, "get_max_context_len": max_seq_len,
                               "get_vocab_size": vocab, "get_n_layers": layers, "use_kv_cache": True,
                               "use_sdpa_with_kv_cache": False, "enable_dynamic_shape": dynamic}
    if bos is not None:
        methods["get_bos_id"] = _token_id(bos, vocab, "bos_id")
    if eos is not None:
        ids = [eos] if isinstance(eos, int) else list(eos) if isinstance(eos, (list, tuple)) else eos
        if not isinstance(ids, list):
            raise ExportError(f"eos_ids={eos!r} must be an int or a list of ints")
        methods["get_eos_ids"] = [_token_id(i, vocab, "eos_ids") for i in ids]
    return methods


def _first(generation: Any, config: Any, name: str) -> Any:
    for source in (generation, config):
        value = getattr(source, name, None)
        if value is not None:
            return value
    return None


def _token_id(value: Any, vocab: int, name: str) -> int:
    if not is_int(value, low=0, end=vocab):
        raise ExportError(f"{name}: {value!r} is not a token id in [0, {vocab})")
    return int(value)


ASKED = "asked for"  # the route reason when the caller named the route


def _slot_program(model: Any, max_seq_len: int, max_batch_size: int, max_tokens: int
                  ) -> tuple[torch.export.ExportedProgram, str, str]:
    """(exported program, route, why) of a file of ``max_batch_size`` slots (pyrt's wrapper: the only route)."""
    module = slot_decoder.wrap(model, max_seq_len, max_batch_size)
    program = slot_decoder.export(module, max_tokens, max_seq_len)
    return program, "pyrt", f"max_batch_size={max_batch_size}: pyrt's slot layout"


def _program(model: Any, route: str, batch_size: int, max_seq_len: int, dynamic: bool
             ) -> tuple[torch.export.ExportedProgram, str, str]:
    """(exported program, route taken, why): "auto" tries upstream, then pyrt's wrapper."""
    if route == "pyrt":
        module = wrap.wrap("pyrt", model, max_seq_len, batch_size)
        return wrap.export(module, "pyrt", batch_size, max_seq_len, dynamic), "pyrt", ASKED
    try:
        module = wrap.wrap("upstream", model, max_seq_len, batch_size)
        program = wrap.export(module, "upstream", batch_size, max_seq_len, dynamic)
        _check_bounded(decompose(program))  # decomposing fails in torch 2.13 (issue #22); to_pte redoes it
        return program, "upstream", ASKED if route == "upstream" else "the upstream route worked"
    except ExportError as exc:
        if route == "upstream":
            raise
        reason = f"upstream route failed: {exc}"
    log.info("decoder_to_pte: %s; using pyrt's wrapper", reason)
    module = wrap.wrap("pyrt", model, max_seq_len, batch_size)
    return wrap.export(module, "pyrt", batch_size, max_seq_len, dynamic), "pyrt", _short(reason)


def _check_bounded(program: torch.export.ExportedProgram) -> None:
    """ExportError when a size has no upper bound (engines need one; OPT's upstream program has one)."""
    for symbol, bounds in program.range_constraints.items():
        if bounds.upper in (int_oo, sympy.oo):
            raise ExportError(f"size {symbol} has no upper bound ({bounds})")


def _short(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[:limit - 3] + "..."


def _portable(program: torch.export.ExportedProgram, path: str | Path, methods: dict[str, Any], started: float,
              bars: Progress) -> ExportSummary:
    """No delegate: ExecuTorch's ``to_edge`` + ``to_executorch`` (portable kernels), written atomically.

    A slot file's caches are written in place (ExecuTorch's reinplace pass: ``index_put_`` into the buffer);
    otherwise each step copies every layer's whole cache twice (``index_put`` into a new tensor, then the
    buffer's write-back). One-sequence files are written as they always were.
    """
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge

    target = Path(path)
    if target.is_dir() or not target.parent.is_dir():
        raise ExportError(f"path {str(target)!r} is a directory or its directory does not exist")
    try:
        # No IR-validity pass (as ExecuTorch's own llama export and pyrt's lowering): its dtype check runs
        # GPT-2's ops on the example sizes and pins a slot file's token count to the example's 2.
        with bars.task("lowering with ExecuTorch (portable kernels)", stage="write"):
            edge = to_edge(program, constant_methods=methods,
                           compile_config=EdgeCompileConfig(_check_ir_validity=False))
            ops: Counter[str] = fallback_ops(edge.exported_program().graph_module)
            manager = edge.to_executorch(ExecutorchBackendConfig(run_reinplace_pass="get_max_batch_size" in methods))
    except Exception as exc:  # ExecuTorch raises many error types
        raise ExportError(f"ExecuTorch lowering (portable kernels) failed: {type(exc).__name__}: {exc}") from exc
    with bars.task(f"writing {target.name}", stage="write"):
        (size,) = atomic_write_all([(target, manager.write_to_file)])
    return ExportSummary(str(target.resolve()), size, (), dict(ops), "portable", time.perf_counter() - started)


__all__ = ["decoder_to_pte", "write_decoder", "constant_methods", "BUILDERS", "ROUTES"]
