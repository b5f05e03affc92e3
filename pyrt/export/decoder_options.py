"""``decoder_to_pte``'s options: :class:`DecoderOptions`, checked once against the model's config before any work.

:func:`decoder_options` checks every option (the cache length against the model's position
limit and sliding window, the slot layout, the quantization plan, and ``to_pte``'s options
through :func:`~pyrt.export.options.make_options`) and gives one frozen value that
:func:`pyrt.export.decoder.write_decoder` follows without checking anything again.
``decoder_to_pte`` makes it from the model it is given; ``checkpoint_to_pte`` from the model
on the meta device, before the weights load.

>>> import torch, transformers as tf                                         # doctest: +SKIP
>>> model = tf.LlamaForCausalLM(tf.LlamaConfig(num_hidden_layers=1, hidden_size=32, ...))  # doctest: +SKIP
>>> o = decoder_options(model, max_seq_len=64, max_batch_size=4, builder="reference", ...)  # doctest: +SKIP
>>> o.tokens_per_step, o.export.builder                                     # doctest: +SKIP
(64, 'reference')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from pyrt.checks import checked_int, is_int
from pyrt.errors import ExportError
from pyrt.export._engines.progress import Progress
from pyrt.export._graph import hf_decoder as wrap
from pyrt.export._graph import portable_quant
from pyrt.export.engine_size import available_host_bytes, choose_engine_size
from pyrt.export.options import (
    DECODER_BUILDERS,
    PORTABLE,
    ExportOptions,
    check_devices,
    check_engine_size,
    check_quantize,
    make_options,
)
from pyrt.format.weight_quant import Scheme

ROUTES = ("auto", "upstream", "pyrt")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
TOKENS_PER_STEP_CAP = 256  # a slot file's default token budget: max(max_batch_size, min(max_seq_len, this))


@dataclass(frozen=True)
class DecoderOptions:
    """``decoder_to_pte``'s options, checked. ``dtype``: the dtype to cast the model to (None: keep its own).
    ``tokens_per_step``: a slot file's token budget of one step (None: a one-sequence file, ``max_batch_size``
    1). ``quantize``: the export's one quantization plan (``export.quantize`` itself when engines are built).
    ``export``: ``to_pte``'s options for the file's engines (None: a portable file, which has none); its
    ``max_engine_size`` is the one asked for, else the one :func:`~pyrt.export.engine_size.choose_engine_size`
    chose from the host's memory, and ``grouping`` says why."""

    max_seq_len: int
    batch_size: int
    max_batch_size: int
    tokens_per_step: int | None
    dtype: torch.dtype | None
    dynamic_prefill: bool
    route: str
    bos_id: Any
    eos_ids: Any
    quantize: Scheme | None
    progress: Progress
    export: ExportOptions | None
    grouping: str = ""  # why the engines are one or layer groups (:mod:`pyrt.export.engine_size`); "": portable


def decoder_options(model: Any, *, max_seq_len: Any, builder: Any, batch_size: Any, max_batch_size: Any,
                    max_tokens_per_step: Any, dtype: Any, dynamic_prefill: Any, route: Any, bos_id: Any, eos_ids: Any,
                    weight_streaming: Any, weight_streaming_budget: Any, device: Any, progress: Any, quantize: Any,
                    group_size: Any, max_engine_size: Any = None) -> DecoderOptions:
    """Every ``decoder_to_pte`` option checked once against ``model`` (its config and weights' dtype: a model on
    the meta device does), in ``decoder_to_pte``'s order: the decoder's own, the slot layout, the quantization
    plan, then ``to_pte``'s. ``bos_id`` / ``eos_ids`` are checked where the model's own are read (they need its
    vocabulary): :func:`pyrt.export.decoder.constant_methods`."""
    bars = Progress.of(progress)
    cast = check_decoder(model, max_seq_len, builder, batch_size, dtype, dynamic_prefill, route)
    slots = check_slots(max_batch_size, max_tokens_per_step, max_seq_len, batch_size, dynamic_prefill, route)
    export, grouping = None, ""
    if builder == PORTABLE:
        if max_engine_size is not None:
            raise ExportError(f"max_engine_size={max_engine_size!r} applies to engines; builder='portable' builds none")
        scheme = portable_scheme(model, cast, quantize, group_size)
    else:  # to_pte's own checks (device, budgets, builder: a missing TensorRT is found now) before the slow steps
        size = choose_engine_size(check_engine_size(max_engine_size, "max_engine_size"),
                                  weight_bytes=weight_bytes(model, cast), available=available_host_bytes(),
                                  devices=len(check_devices(device, "device")))
        export = make_options(device=device, weight_streaming=weight_streaming, builder=builder, progress=bars,
                              weight_streaming_budget=weight_streaming_budget, quantize=quantize,
                              group_size=group_size, max_engine_size=size.limit)
        grouping = size.reason
        scheme = export.quantize
    return DecoderOptions(max_seq_len=int(max_seq_len), batch_size=int(batch_size), max_batch_size=int(max_batch_size),
                          tokens_per_step=slots, dtype=cast, dynamic_prefill=dynamic_prefill, route=route,
                          bos_id=bos_id, eos_ids=eos_ids, quantize=scheme, progress=bars, export=export,
                          grouping=grouping)


def weight_bytes(model: Any, cast: torch.dtype | None) -> int:
    """The bytes of ``model``'s parameters and buffers once cast to ``cast`` (a meta-device model's too)."""
    total = 0
    for t in (*model.parameters(), *model.buffers()):
        size = torch.empty((), dtype=cast).element_size() if cast is not None and t.is_floating_point() \
            else t.element_size()
        total += t.numel() * size
    return total


def portable_scheme(model: Any, cast: Any, quantize: Any, group_size: Any) -> Scheme | None:
    """A portable file's quantization plan: it needs a float32 / float16 model (what ExecuTorch's quantized
    kernels take)."""
    scheme = check_quantize(quantize, group_size)
    if scheme is None:
        return None
    dtype = cast or next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    if dtype not in portable_quant.DTYPES:
        raise ExportError(f"quantize={scheme.name!r} with builder='portable' needs a float32 or float16 model "
                          f"(ExecuTorch's quantized kernels take no {dtype}); pass dtype=torch.float16")
    return scheme


def check_decoder(model: Any, max_seq_len: Any, builder: Any, batch_size: Any, dtype: Any, dynamic: Any, route: Any
                  ) -> Any:
    """Every decoder option; returns the torch dtype to cast to (None: keep the model's)."""
    if not isinstance(model, torch.nn.Module):
        raise ExportError(f"model must be a transformers causal LM (an nn.Module), got {type(model).__name__}")
    config = wrap.text_config(model)
    if getattr(config, "is_encoder_decoder", False):
        raise ExportError(f"{type(model).__name__} is an encoder-decoder model; decoder_to_pte exports "
                          "decoder-only LMs")
    checked_int(max_seq_len, "max_seq_len", low=2, error=ExportError)
    checked_int(batch_size, "batch_size", low=1, error=ExportError)
    positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if is_int(positions) and max_seq_len > positions:
        raise ExportError(f"max_seq_len={max_seq_len} exceeds the model's {positions} position embeddings")
    window = getattr(config, "sliding_window", None)
    if is_int(window) and max_seq_len > window:
        raise ExportError(f"max_seq_len={max_seq_len} exceeds the model's sliding window ({window}); "
                          "sliding-window caches are not exported")
    for name, value, choices in (("builder", builder, DECODER_BUILDERS), ("route", route, ROUTES)):
        if value not in choices:
            raise ExportError(f"{name}={value!r} is not one of {', '.join(choices)}")
    if not isinstance(dynamic, bool):
        raise ExportError(f"dynamic_prefill={dynamic!r} must be a bool")
    if dtype is None or isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise ExportError(f"dtype={dtype!r} is not one of {', '.join(DTYPES)} (or a torch dtype of them)")


def check_slots(max_batch_size: Any, max_tokens: Any, max_seq_len: int, batch_size: int, dynamic: bool,
                route: str) -> int | None:
    """The token budget of one step of a file of ``max_batch_size`` > 1 slots (None: a one-sequence file)."""
    checked_int(max_batch_size, "max_batch_size", low=1, error=ExportError)
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
        return max(max_batch_size, min(max_seq_len, TOKENS_PER_STEP_CAP))
    if not is_int(max_tokens, low=max_batch_size, end=max_batch_size * max_seq_len + 1):
        raise ExportError(f"max_tokens_per_step={max_tokens!r} must be an int in [max_batch_size, max_batch_size * "
                          f"max_seq_len] = [{max_batch_size}, {max_batch_size * max_seq_len}]: every running "
                          "sequence feeds one token per step")
    return int(max_tokens)


__all__ = ["DecoderOptions", "decoder_options", "check_decoder", "check_slots", "ROUTES", "DTYPES"]
