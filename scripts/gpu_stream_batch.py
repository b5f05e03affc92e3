"""The model behind batched generation of a weight-streamed LLM, measured on a real GPU (issue #31).

A decode step of a model whose weights do not fit the GPU moves every non-resident weight byte over
the host link, so a step costs about ``S / BW`` whatever the batch: ``B`` sequences sharing the step
decode at most ``B * BW / S`` tokens per second. TensorRT does not run on the GPUs lent here, so this
script streams the weights itself, as weight streaming does: ``L`` layers of float16 weights in pinned
host memory, copied to the device one layer ahead on a copy stream (double-buffered) while the
previous layer's matrix products run on the compute stream for ``B`` tokens.

It reports the host-to-device bandwidth (pinned and pageable), then per batch size: the step time,
tokens/s, and tokens/s as a share of ``B * BW / S``. Needs torch with CUDA::

    python3 scripts/gpu_stream_batch.py --layers 8 --hidden 4096 --batch 1,2,4,8,16,32,64,128,256
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any


def bandwidth(torch: Any, nbytes: int, pinned: bool, repeats: int = 5) -> float:
    """Host-to-device bytes per second for one ``nbytes`` copy (best of ``repeats``)."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
    host.fill_(1)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    best = float("inf")
    for _ in range(repeats + 1):
        torch.cuda.synchronize()
        t = time.perf_counter()
        dev.copy_(host, non_blocking=pinned)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return nbytes / best


def device_to_host(torch: Any, nbytes: int, repeats: int = 5) -> float:
    dev = torch.ones(nbytes, dtype=torch.uint8, device="cuda")
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    best = float("inf")
    for _ in range(repeats + 1):
        torch.cuda.synchronize()
        t = time.perf_counter()
        host.copy_(dev, non_blocking=True)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return nbytes / best


def pyrt_htod(nbytes: int, repeats: int = 5) -> float | None:
    """Bytes per second of ``pyrt.cuda``'s synchronous copy from a pageable numpy array (None without pyrt)."""
    try:
        import numpy as np

        import pyrt.cuda as pcuda
    except ImportError:
        return None
    cuda = pcuda.Cuda()
    host = np.ones(nbytes, np.uint8)
    best = float("inf")
    with cuda.alloc(nbytes, 0) as dev:
        for _ in range(repeats + 1):
            t = time.perf_counter()
            cuda.memcpy_htod(dev, host)
            best = min(best, time.perf_counter() - t)
    return nbytes / best


class StreamedStack:
    """``layers`` blocks of four ``hidden x 3*hidden``-ish float16 matrices kept in pinned host memory."""

    def __init__(self, torch: Any, layers: int, hidden: int) -> None:
        self.torch = torch
        shapes = [(hidden, 3 * hidden), (hidden, hidden), (hidden, 4 * hidden), (4 * hidden, hidden)]
        self.host = [[torch.randn(s, dtype=torch.float16).mul_(0.02).pin_memory() for s in shapes]
                     for _ in range(layers)]
        self.buffers = [[torch.empty(s, dtype=torch.float16, device="cuda") for s in shapes] for _ in range(2)]
        self.copy_stream = torch.cuda.Stream()
        self.loaded = [torch.cuda.Event() for _ in range(2)]
        self.used = [torch.cuda.Event() for _ in range(2)]
        self.streamed_bytes = sum(t.numel() * t.element_size() for layer in self.host for t in layer)
        self.hidden = hidden

    def _load(self, layer: int, slot: int) -> None:
        with self.torch.cuda.stream(self.copy_stream):
            self.copy_stream.wait_event(self.used[slot])  # the previous user of this buffer is done
            for dst, src in zip(self.buffers[slot], self.host[layer], strict=True):
                dst.copy_(src, non_blocking=True)
            self.loaded[slot].record(self.copy_stream)

    def step(self, x: Any) -> Any:
        torch = self.torch
        compute = torch.cuda.current_stream()
        self._load(0, 0)
        for i in range(len(self.host)):
            slot = i % 2
            if i + 1 < len(self.host):
                self._load(i + 1, 1 - slot)
            compute.wait_event(self.loaded[slot])
            qkv, o, up, down = self.buffers[slot]
            h = (x @ qkv)[:, : self.hidden]
            x = x + h @ o
            x = x + torch.relu(x @ up) @ down
            self.used[slot].record(compute)
        return x


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--batch", default="1,2,4,8,16,32,64,128,256")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    gib = 1 << 30
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    result["h2d_pinned_GBps"] = bandwidth(torch, gib, pinned=True) / 1e9
    result["h2d_pageable_GBps"] = bandwidth(torch, gib, pinned=False) / 1e9
    result["d2h_pinned_GBps"] = device_to_host(torch, gib) / 1e9
    pyrt_bw = pyrt_htod(gib)
    result["h2d_pyrt_pageable_GBps"] = None if pyrt_bw is None else pyrt_bw / 1e9
    print(json.dumps(result))
    stack = StreamedStack(torch, args.layers, args.hidden)
    bw = result["h2d_pinned_GBps"] * 1e9
    s = stack.streamed_bytes
    result["streamed_bytes"] = s
    result["bound_step_ms"] = s / bw * 1e3
    rows = []
    print(f"streamed {s / 1e9:.2f} GB per step; S/BW = {s / bw * 1e3:.1f} ms")
    print(f"{'B':>5} {'step ms':>9} {'tok/s':>10} {'B*BW/S':>10} {'share':>6} {'resident tok/s':>15}")
    for b in [int(v) for v in args.batch.split(",")]:
        x = torch.randn(b, args.hidden, dtype=torch.float16, device="cuda") * 0.1
        stack.step(x)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(args.steps):
            stack.step(x)
        torch.cuda.synchronize()
        step = (time.perf_counter() - t) / args.steps
        # The same matrix products with the weights already resident (layer 0's buffers reused):
        # what the step costs once nothing is streamed.
        qkv, o, up, down = stack.buffers[0]
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(args.steps):
            y = x
            for _layer in range(args.layers):
                y = y + (y @ qkv)[:, : args.hidden] @ o
                y = y + torch.relu(y @ up) @ down
        torch.cuda.synchronize()
        resident = (time.perf_counter() - t) / args.steps
        row = {"batch": b, "step_ms": step * 1e3, "tokens_per_s": b / step, "bound_tokens_per_s": b * bw / s,
               "share_of_bound": (b / step) / (b * bw / s), "resident_step_ms": resident * 1e3,
               "resident_tokens_per_s": b / resident}
        rows.append(row)
        print(f"{b:5d} {step * 1e3:9.2f} {b / step:10.1f} {b * bw / s:10.1f} {row['share_of_bound']:6.2f}"
              f" {b / resident:15.1f}")
    result["rows"] = rows
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
