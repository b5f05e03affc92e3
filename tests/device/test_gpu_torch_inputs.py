"""torch CUDA inputs read on another stream: torch's caching allocator must not reuse them meanwhile (real GPU).

pyrt reads a torch CUDA input on its run's stream. When that is not torch's current
stream, pyrt calls ``Tensor.record_stream`` for it (``pyrt.memory.interop.device_input``):
otherwise a caller who drops the input right after the call lets torch's allocator hand
the same block to the next tensor, whose writes on torch's stream can land before pyrt's
stream has read the input. Only torch's real caching allocator on a real GPU shows this
(CPU-only torch has no CUDA tensors), so the test is marked ``gpu``; it needs torch with
CUDA and no TensorRT.
"""

from __future__ import annotations

import pytest

from pyrt.memory.interop import device_input

N = 1 << 20
CYCLES = 200_000_000  # keeps the reader's stream busy long enough for the caller's next write to run first


@pytest.mark.gpu
def test_an_input_read_on_another_stream_is_not_reused_before_the_read() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    reader = torch.cuda.Stream()
    x = torch.full((N,), 1.0, device="cuda")  # written on torch's current stream
    torch.cuda.current_stream().synchronize()
    with torch.cuda.stream(reader):
        torch.cuda._sleep(CYCLES)  # the reader is busy: what it queues next runs late
    desc = device_input(x, "input 0", consumer=lambda device: int(reader.cuda_stream))
    assert desc is not None and desc.stream == int(torch.cuda.current_stream().cuda_stream)
    read = torch.empty(N, device="cuda")
    with torch.cuda.stream(reader):  # pyrt's read of the input, on its stream (by pointer, as a copy)
        read.copy_(x)
    read.record_stream(reader)
    ptr = x.data_ptr()
    del desc, x  # the caller drops its input right after the call
    y = torch.full((N,), 2.0, device="cuda")  # the next tensor of that size, written on torch's stream
    reused = y.data_ptr() == ptr
    reader.synchronize()
    assert not reused, "torch's allocator handed the input's block out while pyrt's stream still had to read it"
    assert bool((read == 1.0).all()), "pyrt's stream read the input after the caller's next tensor overwrote it"
