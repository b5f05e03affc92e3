"""Export-time weight quantization works a block of rows at a time (issue 43: host memory within a layer group).

What it holds beyond its result is one block's float32 temporaries, not about 13 bytes per weight: a 70B model's
LM head (262 M weights) would otherwise need about 3 GiB of them on the host that exports it. The blocks give the
values and scales of quantizing the whole weight at once, bit for bit.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from pyrt.errors import ExportError  # noqa: E402
from pyrt.export._graph.quantize import BLOCK_ELEMENTS, quantize_rows  # noqa: E402
from pyrt.format import weight_quant as wq  # noqa: E402
from pyrt.format.weight_quant import Scheme  # noqa: E402


def _whole(rows_first: torch.Tensor, scheme: Scheme, layout: str) -> tuple[np.ndarray, np.ndarray]:
    """The whole weight quantized in one call: what the blocks must reproduce."""
    group = scheme.group_for(rows_first.shape[1])
    q, scales = wq.quantize(rows_first.float().numpy(), bits=scheme.bits, group=group,
                            scale_dtype=str(rows_first.dtype).removeprefix("torch."))
    return (wq.pack_int4(q, layout) if scheme.bits == 4 else q), scales


@pytest.mark.parametrize(("name", "dtype", "transposed"), [
    ("int8", torch.float16, False), ("int4", torch.bfloat16, True), ("int4", torch.float32, False),
    ("int8", torch.bfloat16, True)], ids=["int8-float16", "int4-bfloat16-transposed", "int4-float32",
                                          "int8-bfloat16-transposed"])
def test_blocks_give_the_whole_weights_values_and_scales(name: str, dtype: torch.dtype, transposed: bool) -> None:
    cols = 256
    rows = BLOCK_ELEMENTS // cols + 5  # two blocks, the second a partial one
    torch.manual_seed(0)
    weight = torch.randn(rows, cols, dtype=torch.float32).mul(0.02).to(dtype)
    if transposed:  # GPT-2's Conv1D: a [in, out] weight read through .t()
        weight = weight.t().contiguous().t()
    scheme = Scheme(name, 64)
    for layout in ("twos", "offset8") if name == "int4" else ("twos",):
        result = quantize_rows(weight, scheme, "layers.0.mlp", int4_layout=layout)
        assert not isinstance(result, str)
        stored, scales, group = result
        want_stored, want_scales = _whole(weight, scheme, layout)
        assert group == 64
        assert stored.dtype == want_stored.dtype and stored.shape == want_stored.shape
        assert np.array_equal(stored, want_stored)
        assert np.array_equal(scales, want_scales)


def test_what_it_holds_beyond_its_result_is_a_block_not_the_weight() -> None:
    weight = torch.randn(4096, 2048, dtype=torch.float32).mul(0.02).to(torch.float16)  # 8 M weights
    for name in ("int8", "int4"):
        tracemalloc.start()  # numpy's buffers are traced (torch's are not: the per-block float32 copy is small too)
        try:
            result = quantize_rows(weight, Scheme(name, 128), "lm_head")
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert not isinstance(result, str)
        beyond = peak - result[0].nbytes - result[1].nbytes
        # one block is BLOCK_ELEMENTS weights (~10 bytes each of temporaries); the whole weight at once: ~70 MiB
        assert beyond < 16 * BLOCK_ELEMENTS, f"{name}: {beyond / 2**20:.1f} MiB beyond the result"


def test_a_non_finite_weight_in_a_later_block_is_named() -> None:
    cols = 128
    weight = torch.zeros(BLOCK_ELEMENTS // cols * 2 + 1, cols, dtype=torch.float16)
    weight[-1, 3] = float("inf")
    with pytest.raises(ExportError, match="'layers.7.self_attn.q_proj'.*inf or NaN"):
        quantize_rows(weight, Scheme("int4", 128), "layers.7.self_attn.q_proj")


def test_an_odd_input_size_stays_float_for_int4() -> None:
    assert isinstance(quantize_rows(torch.ones(4, 7, dtype=torch.float16), Scheme("int4", 16), "w"), str)
