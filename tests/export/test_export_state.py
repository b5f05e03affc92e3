"""Programs with state: a decoder whose static KV cache lives in mutable registered buffers.

The cache must stay in device memory between calls (a CUDA-planned buffer, written
back on the device), and a greedy decode through pyrt.Program must match eager
token for token (reference engines on a simulated GPU).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn
from torch.export import Dim

import pyrt
from pyrt.errors import ExportError
from pyrt.export import to_pte
from pyrt.sim import simulated_gpus
from pyrt.testing import archs

PROMPT = [1, 2, 3, 4]
NEW_TOKENS = 32
SEQ = Dim("seq", min=1, max=32)
EXAMPLE = (torch.tensor([[1, 2]]), torch.tensor([0, 1]))
SHAPES = ({1: SEQ}, {0: SEQ})


@pytest.fixture(scope="module")
def kv_pte(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, Any]:
    model = archs.kv_decoder()
    eager = copy.deepcopy(model)  # export must not depend on (or change) the caller's cache
    path = tmp_path_factory.mktemp("kv") / "kv.pte"
    summary = to_pte(model, path, EXAMPLE, builder="reference", dynamic_shapes=SHAPES, progress=False)
    return path, summary, eager


@pytest.mark.export
def test_greedy_decode_matches_eager_token_for_token(kv_pte: tuple[Path, Any, Any]) -> None:
    path, summary, eager = kv_pte
    assert len(summary.engines) == 1 and summary.fallback_ops == {}, str(summary)
    with torch.no_grad():
        want = archs.greedy(lambda t, p: eager(t, p), PROMPT, NEW_TOKENS)
    with simulated_gpus(1), pyrt.Program(path) as prog:
        got = archs.greedy(lambda t, p: prog(t, p), PROMPT, NEW_TOKENS)
        again = archs.greedy(lambda t, p: prog(t, p), PROMPT, NEW_TOKENS)  # the cache is rewritten, not reset
    assert len(want) == NEW_TOKENS and got == want and again == want


@pytest.mark.export
def test_the_cache_lives_in_device_memory(kv_pte: tuple[Path, Any, Any]) -> None:
    """The engine reads and updates the buffers in place: no host copy of the cache around the call."""
    path, _, _ = kv_pte
    method = pyrt.inspect(path)["methods"][0]
    ops = [i.get("op") for i in method["instructions"] if i.get("op")]
    assert ops.count("et_copy::_h2d_copy.out") == 2  # tokens, pos
    assert ops.count("et_copy::_d2h_copy.out") == 1  # logits
    assert ops.count("aten::copy_") == 4  # the write-backs, device to device
    from pyrt.pte_reader import DeviceType, PteFile

    with PteFile.open(path) as pte:
        plan = pte.program.method("forward")
        caches = [v.value for v in plan.values if v.kind == "Tensor" and v.value.data_buffer_idx > 0
                  and v.value.allocation_info is not None]
        devices = [plan.buffer_device(t.allocation_info.memory_id) for t in caches]
        assert [tuple(t.sizes) for t in caches] == [(1, 2, 64, 16)] * 4
    assert devices == [(DeviceType.CUDA, 0)] * 4


@pytest.fixture
def traffic() -> Iterator[dict[str, int]]:
    """Bytes copied host -> device and device -> host through the simulated driver (the CUDA seam)."""
    counts = {"htod": 0, "dtoh": 0}
    depth = [0]  # an Async call may be served by its synchronous twin: count the outer call only
    with simulated_gpus(1) as sim:
        driver: Any = sim.driver
        for name, key in (("cuMemcpyHtoD", "htod"), ("cuMemcpyDtoH", "dtoh"),
                          ("cuMemcpyHtoDAsync", "htod"), ("cuMemcpyDtoHAsync", "dtoh")):
            original = getattr(driver, name)

            def counted(*args: Any, _original: Any = original, _key: str = key) -> Any:
                if not depth[0]:
                    counts[_key] += int(args[2])
                depth[0] += 1
                try:
                    return _original(*args)
                finally:
                    depth[0] -= 1

            setattr(driver, name, counted)
        yield counts


@pytest.mark.export
def test_a_decode_step_moves_no_cache_bytes(kv_pte: tuple[Path, Any, Any], traffic: dict[str, int]) -> None:
    path, _, _ = kv_pte
    cache_bytes = 1 * 2 * 64 * 16 * 4
    with pyrt.Program(path) as prog:
        prog(torch.tensor([PROMPT]), torch.arange(len(PROMPT)))
        loaded = dict(traffic)
        prog(torch.tensor([[5]]), torch.tensor([len(PROMPT)]))
    step = {k: traffic[k] - loaded[k] for k in traffic}
    assert step == {"htod": 8 + 8, "dtoh": 100 * 4}  # token and position in, one row of logits out
    assert step["htod"] + step["dtoh"] < cache_bytes


class Counter(nn.Module):
    """A buffer with a non-zero initial value, updated by every call."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.tensor([5.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count.add_(1.0)
        return x * self.count


def test_buffer_initial_values_load_and_updates_persist(tmp_path: Path) -> None:
    """The registered value is stored in the file (ExecuTorch leaves mutable buffers uninitialized by default)."""
    model = Counter()
    to_pte(model, tmp_path / "c.pte", (torch.ones(3),), builder="reference", progress=False)
    assert model.count.item() == 5.0  # exporting does not run the model's update
    with simulated_gpus(1), pyrt.Program(tmp_path / "c.pte") as prog:
        got = [float(prog(torch.ones(3))[0]) for _ in range(3)]
    assert got == [6.0, 7.0, 8.0]


def test_a_program_that_mutates_an_input_is_refused(tmp_path: Path) -> None:
    class Accumulate(nn.Module):
        def forward(self, total: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            total.add_(x)
            return total * 2

    with pytest.raises(ExportError, match="USER_INPUT_MUTATION.*buffer mutations"):
        to_pte(Accumulate(), tmp_path / "a.pte", (torch.zeros(3), torch.ones(3)), builder="reference",
               progress=False)


@pytest.mark.export
@pytest.mark.slow
def test_a_cache_updated_outside_engines_stays_on_the_host(tmp_path: Path) -> None:
    """With the cache update forced to ExecuTorch, the buffers stay host memory (and still decode right)."""
    model = archs.kv_decoder()
    eager = copy.deepcopy(model)
    path = tmp_path / "host.pte"
    to_pte(model, path, EXAMPLE, builder="reference", dynamic_shapes=SHAPES,
           torch_executed_ops=["aten.index_put.default"], progress=False)
    method = pyrt.inspect(path)["methods"][0]
    assert [i.get("op") for i in method["instructions"]].count("et_copy::_h2d_copy.out") > 2
    with torch.no_grad():
        want = archs.greedy(lambda t, p: eager(t, p), PROMPT, 8)
    with simulated_gpus(1), pyrt.Program(path) as prog:
        assert archs.greedy(lambda t, p: prog(t, p), PROMPT, 8) == want


@pytest.mark.export
@pytest.mark.slow
def test_tensorrt_rtx_builds_the_kv_decoder_as_one_engine(tmp_path: Path) -> None:
    pytest.importorskip("tensorrt_rtx")
    summary = to_pte(archs.kv_decoder(), tmp_path / "kv.pte", EXAMPLE, builder="tensorrt_rtx",
                     dynamic_shapes=SHAPES, progress=False)
    assert len(summary.engines) == 1 and summary.fallback_ops == {}
    ops = [i.get("op") for i in pyrt.inspect(tmp_path / "kv.pte")["methods"][0]["instructions"]]
    assert ops.count("et_copy::_h2d_copy.out") == 2 and ops.count("aten::copy_") == 4


def test_device_copy_kernel() -> None:
    """aten::copy_ between device tensors (the write-back of a device-resident buffer), same and other device."""
    import numpy as np

    from pyrt import cuda
    from pyrt.errors import InputError
    from pyrt.format.dtypes import ScalarType
    from pyrt.kernels.prim_kernels import _copy_device
    from pyrt.memory.tensors import DeviceTensor

    with simulated_gpus(2):
        from pyrt.runtime.device_context import DeviceContext

        table = SimpleNamespace(devices=DeviceContext(cuda.current(), {0, 1}))  # the method's streams
        allocs = [cuda.current().alloc(64, d) for d in (0, 0, 1)]
        src, same, other = (DeviceTensor(a, 16, ScalarType.FLOAT, (2, 3), 6) for a in allocs)
        cuda.current().memcpy_htod(allocs[0], np.arange(6, dtype=np.float32), dst_offset=16)
        for dst in (same, other):
            _copy_device(dst, src, table, "test")
            table.devices.stream(dst.device).synchronize()
            back = np.zeros(6, np.float32)
            cuda.current().memcpy_dtoh(back, dst.allocation, src_offset=16)
            assert back.tolist() == list(range(6))
        with pytest.raises(InputError, match="test: copy_ between host and device memory"):
            _copy_device(np.zeros((2, 3), np.float32), src, table, "test")
        with pytest.raises(InputError, match=r"float32\[3, 2\] into float32\[2, 3\]"):
            _copy_device(same, DeviceTensor(allocs[0], 16, ScalarType.FLOAT, (3, 2), 6), table, "test")
        table.devices.close()
        for a in allocs:
            a.free()
