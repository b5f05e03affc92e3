"""``decoder_to_pte``: a Hugging Face causal LM -> a .pte that follows ExecuTorch's LLM convention.

The file's ``forward(tokens [batch, seq] int64, input_pos [seq] int64) -> logits`` keeps a
static KV cache as program state (device memory when engines update it), and the file
carries the constant methods ExecuTorch's llama export writes (``get_max_seq_len``,
``get_max_context_len``, ``get_vocab_size``, ``get_bos_id``, ``get_eos_ids``, ``get_n_layers``,
``use_kv_cache``, ``enable_dynamic_shape``), so ExecuTorch's runners and :func:`pyrt.generate`
read the same files.

``max_batch_size=B`` (B > 1) writes one file for B sequences at once: ``forward(tokens [T], slots [T],
positions [T], rows [R], window [W]) -> logits [R, vocab]`` over a KV cache of B slots
(:mod:`pyrt.export._graph.slot_decoder`), where one step may prefill a new sequence's prompt while the
others decode, with the weights stored once. ``get_max_batch_size`` and ``get_max_tokens_per_step``
(the token budget of one step) say so in the file. A step returns up to ``max_tokens_per_step``
logits rows, so speculative decoding can check several guessed tokens of every sequence in one step.

Routes (``summary.route``): ``"upstream"`` (transformers' ExecuTorch integration) is tried
first by ``route="auto"``; where it fails (torch 2.13 cannot decompose its dynamic-length
program) pyrt's own wrapper (:class:`pyrt.export._graph.hf_decoder.DecoderModule`) takes over and
``summary.route_reason`` says why.

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

from pyrt.errors import ExportError
from pyrt.export._engines.builders import make_builder
from pyrt.export._engines.progress import Progress
from pyrt.export._files.atomic import atomic_write_all
from pyrt.export._graph import hf_decoder as wrap
from pyrt.export._graph import portable_quant, slot_decoder
from pyrt.export._graph.passes import decompose
from pyrt.export._write.lower import CONSTANT_METHODS, fallback_ops
from pyrt.export.api import make_options, to_pte
from pyrt.export.options import check_quantize
from pyrt.export.summary import ExportSummary, QuantSummary
from pyrt.format.weight_quant import Scheme

log = logging.getLogger("pyrt.export")
BUILDERS = ("auto", "tensorrt", "tensorrt_rtx", "reference", "portable")
ROUTES = ("auto", "upstream", "pyrt")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def decoder_to_pte(
    model: Any,
    path: str | Path,
    *,
    max_seq_len: int,
    builder: str = "auto",
    batch_size: int = 1,
    max_batch_size: int = 1,
    max_tokens_per_step: int | None = None,
    dtype: Any = None,
    dynamic_prefill: bool = True,
    route: str = "auto",
    weight_streaming: bool = False,
    weight_streaming_budget: Any = None,
    device: Any = "cuda:0",
    bos_id: int | None = None,
    eos_ids: Any = None,
    progress: bool | Progress | None = None,
    quantize: str | None = None, group_size: int = 128,
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
    """
    started, bars = time.perf_counter(), Progress.of(progress)
    check = check_decoder(model, max_seq_len, builder, batch_size, dtype, dynamic_prefill, route)
    slots = check_slots(max_batch_size, max_tokens_per_step, max_seq_len, batch_size, dynamic_prefill, route)
    scheme = _check_quantize(model, builder, check, quantize, group_size)
    if builder != "portable":  # to_pte's own checks (device, budgets, builder) before the slow steps
        _check_export(device, weight_streaming, weight_streaming_budget, builder, bars)
    methods = constant_methods(model, max_seq_len, dynamic_prefill, bos_id, eos_ids)
    model, quantized = _prepared(model, check, scheme if builder == "portable" else None)
    with bars.task("wrapping the decoder with its KV cache and exporting it (torch.export)", stage="export"):
        if slots is None:
            program, chosen, reason = _program(model, route, batch_size, max_seq_len, dynamic_prefill)
        else:
            methods.update(get_max_batch_size=max_batch_size, get_max_tokens_per_step=slots, enable_dynamic_shape=True)
            program, chosen, reason = _slot_program(model, max_seq_len, max_batch_size, slots)
    if builder == "portable":
        summary = replace(_portable(program, path, methods, started, bars), quantization=quantized)
    else:
        summary = _delegated(program, path, methods, builder=builder, device=device, weight_streaming=weight_streaming,
                             weight_streaming_budget=weight_streaming_budget, progress=bars, quantize=quantize,
                             group_size=group_size)
    return replace(summary, route=chosen, route_reason=reason, constant_methods=methods,
                   seconds=time.perf_counter() - started)


def _delegated(program: torch.export.ExportedProgram, path: str | Path, methods: dict[str, Any], **options: Any
               ) -> ExportSummary:
    """``to_pte`` of the decoder's program, ExecuTorch's LLM constant methods written beside ``forward``."""
    token = CONSTANT_METHODS.set(methods)
    try:
        return to_pte(program, path, **options)
    finally:
        CONSTANT_METHODS.reset(token)


def _check_quantize(model: Any, builder: str, cast: Any, quantize: Any, group_size: Any) -> Scheme | None:
    """The quantization scheme; a portable one needs float32 / float16 (what ExecuTorch's quantized kernels take)."""
    scheme = check_quantize(quantize, group_size)
    if scheme is None or builder != "portable":
        return scheme
    dtype = cast or next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    if dtype not in portable_quant.DTYPES:
        raise ExportError(f"quantize={scheme.name!r} with builder='portable' needs a float32 or float16 model "
                          f"(ExecuTorch's quantized kernels take no {dtype}); pass dtype=torch.float16")
    return scheme


def _check_export(device: Any, weight_streaming: Any, budget: Any, builder: str, bars: Progress) -> None:
    """``to_pte``'s options checked, and its builder found (a missing TensorRT fails now, not after torch.export)."""
    options = make_options(device=device, weight_streaming=weight_streaming, builder=builder, progress=bars,
                           weight_streaming_budget=budget)
    make_builder(options.builder)


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
    vocab = getattr(config, "vocab_size", None)
    layers = getattr(config, "num_hidden_layers", None)
    if not isinstance(vocab, int) or not isinstance(layers, int):
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
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab:
        raise ExportError(f"{name}: {value!r} is not a token id in [0, {vocab})")
    return value


def check_decoder(model: Any, max_seq_len: Any, builder: Any, batch_size: Any, dtype: Any, dynamic: Any, route: Any
           ) -> Any:
    """Every decoder option; returns the torch dtype to cast to (None: keep the model's)."""
    if not isinstance(model, torch.nn.Module):
        raise ExportError(f"model must be a transformers causal LM (an nn.Module), got {type(model).__name__}")
    config = wrap.text_config(model)
    if getattr(config, "is_encoder_decoder", False):
        raise ExportError(f"{type(model).__name__} is an encoder-decoder model; decoder_to_pte exports "
                          "decoder-only LMs")
    for name, value, low in (("max_seq_len", max_seq_len, 2), ("batch_size", batch_size, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ExportError(f"{name}={value!r} must be an int >= {low}")
    positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if isinstance(positions, int) and max_seq_len > positions:
        raise ExportError(f"max_seq_len={max_seq_len} exceeds the model's {positions} position embeddings")
    window = getattr(config, "sliding_window", None)
    if isinstance(window, int) and max_seq_len > window:
        raise ExportError(f"max_seq_len={max_seq_len} exceeds the model's sliding window ({window}); "
                          "sliding-window caches are not exported")
    for name, value, choices in (("builder", builder, BUILDERS), ("route", route, ROUTES)):
        if value not in choices:
            raise ExportError(f"{name}={value!r} is not one of {', '.join(choices)}")
    if not isinstance(dynamic, bool):
        raise ExportError(f"dynamic_prefill={dynamic!r} must be a bool")
    if dtype is None or isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise ExportError(f"dtype={dtype!r} is not one of {', '.join(DTYPES)} (or a torch dtype of them)")


def _slot_program(model: Any, max_seq_len: int, max_batch_size: int, max_tokens: int
                  ) -> tuple[torch.export.ExportedProgram, str, str]:
    """(exported program, route, why) of a file of ``max_batch_size`` slots (pyrt's wrapper: the only route)."""
    module = slot_decoder.wrap(model, max_seq_len, max_batch_size)
    program = slot_decoder.export(module, max_tokens, max_seq_len)
    return program, "pyrt", f"max_batch_size={max_batch_size}: pyrt's slot layout"


def check_slots(max_batch_size: Any, max_tokens: Any, max_seq_len: int, batch_size: int, dynamic: bool,
                 route: str) -> int | None:
    """The token budget of one step of a file of ``max_batch_size`` > 1 slots (None: a one-sequence file)."""
    if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1:
        raise ExportError(f"max_batch_size={max_batch_size!r} must be an int >= 1")
    if max_batch_size == 1:
        if max_tokens is not None:
            raise ExportError(f"max_tokens_per_step={max_tokens!r} applies to files of max_batch_size > 1")
        return None
    if batch_size != 1:
        raise ExportError(f"batch_size={batch_size} and max_batch_size={max_batch_size}: give one (batch_size is "
                          "a fixed batch moving in step; max_batch_size gives each sequence its own slot)")
    if route == "upstream":
        raise ExportError(f"route='upstream' has no slot layout; max_batch_size={max_batch_size} needs route "
                          "'pyrt' or 'auto'")
    if not dynamic:
        raise ExportError(f"dynamic_prefill=False: max_batch_size={max_batch_size} files take a dynamic token count")
    if max_tokens is None:
        return max(max_batch_size, min(max_seq_len, 256))
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not (
            max_batch_size <= max_tokens <= max_batch_size * max_seq_len):
        raise ExportError(f"max_tokens_per_step={max_tokens!r} must be an int in [max_batch_size, max_batch_size * "
                          f"max_seq_len] = [{max_batch_size}, {max_batch_size * max_seq_len}]: every running "
                          "sequence feeds one token per step")
    return max_tokens


def _program(model: Any, route: str, batch_size: int, max_seq_len: int, dynamic: bool
             ) -> tuple[torch.export.ExportedProgram, str, str]:
    """(exported program, route taken, why): "auto" tries upstream, then pyrt's wrapper."""
    if route == "pyrt":
        module = wrap.wrap("pyrt", model, max_seq_len, batch_size)
        return wrap.export(module, "pyrt", batch_size, max_seq_len, dynamic), "pyrt", "asked for"
    try:
        module = wrap.wrap("upstream", model, max_seq_len, batch_size)
        program = wrap.export(module, "upstream", batch_size, max_seq_len, dynamic)
        _check_bounded(decompose(program))  # decomposing fails in torch 2.13 (issue #22); to_pte redoes it
        return program, "upstream", "asked for" if route == "upstream" else "the upstream route worked"
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


__all__ = ["decoder_to_pte", "constant_methods", "BUILDERS", "ROUTES"]
