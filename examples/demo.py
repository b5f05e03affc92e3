"""pyrt demo: export a small model to a .pte with TensorRT delegates, inspect it, run it.

    bash scripts/demo.sh [--verbose]          # sets up .venv, then runs this file
    .venv/bin/python examples/demo.py [DIR] [--verbose]   # writes DIR/demo.pte (default: ./demo-out)

Only pyrt's own lines are printed; ``--verbose`` (or ``PYRT_LOG=debug``) adds pyrt's
debug log and the third-party messages (torch.export, torchao, TensorRT) it keeps out
of sight otherwise (``pyrt.logs``).

1. Export with a real TensorRT engine (full TensorRT if installed, else
   TensorRT-RTX, which builds on a CPU-only machine), part of the model
   forced to stay in ExecuTorch (a graph break), weight streaming on.
2. Inspect the file with pyrt.
3. Run it with a load-time weight-streaming budget on a GPU when one is present,
   and compare with eager PyTorch. Without a GPU (or on one the TensorRT flavour
   cannot run on, such as TensorRT-RTX on Hopper), real engines cannot run: the
   demo says so and runs a reference-engine export of the same model on
   pyrt.sim's simulated GPU instead, exercising the same runtime code.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import pyrt
import pyrt.export
import pyrt.logs
from pyrt import cuda
from pyrt.tools.report import format_report


class SmallNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 256)
        self.fc2 = torch.nn.Linear(256, 256)
        self.head = torch.nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        h = torch.sigmoid(h)  # forced to run in ExecuTorch below: a graph break
        return self.head(torch.relu(self.fc2(h)))


def compare(prog: pyrt.Program, model: torch.nn.Module, x: torch.Tensor, budget: str) -> None:
    out = prog(x)
    expected = model(x)
    print(f"ran forward with budget {budget!r}: output {tuple(out.shape)}, "
          f"max |pyrt - eager| = {(out.cpu() - expected).abs().max().item():.2e}")
    for w in prog.weight_streaming:
        print(f"  engine {w.index} on cuda:{w.device}: streamable {w.streamable_bytes} B, "
              f"budget {w.budget} ({w.source})")


def main() -> None:
    parser = argparse.ArgumentParser(description="pyrt demo: export, inspect and run a small model")
    parser.add_argument("dir", nargs="?", default="demo-out", help="where demo.pte goes (default: demo-out)")
    parser.add_argument("-v", "--verbose", action="store_true", help="pyrt's debug log and third-party messages")
    args = parser.parse_args()
    pyrt.logs.configure(args.verbose)
    out_dir = Path(args.dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = SmallNet().eval()
    x = torch.randn(4, 64)
    options = dict(torch_executed_ops=("aten.sigmoid.default",), weight_streaming=True)

    path = out_dir / "demo.pte"
    summary = pyrt.export.to_pte(model, path, (x,), builder="auto", **options)
    print(f"exported {path} ({summary.file_size} bytes) with {len(summary.engines)} TensorRT engine(s), "
          f"fallback ops: {', '.join(summary.fallback_ops) or 'none'}\n")
    print(format_report(pyrt.inspect(path)), "\n")

    with torch.no_grad():
        if cuda.device_count() > 0:
            try:
                with pyrt.Program(path, budget="50%") as prog:
                    compare(prog, model, x.cuda(), "50%")
                return
            except pyrt.DeviceError as exc:  # e.g. TensorRT-RTX on a Hopper GPU (docs/hardware.md)
                print(f"the TensorRT engines cannot run on this GPU: {exc}")
        else:
            print("no CUDA device here: real TensorRT engines need a GPU to run.")
        from pyrt.sim import simulated_gpus
        from pyrt.sim.gpu_reference import reference_tensorrt

        ref_path = out_dir / "demo-reference.pte"
        pyrt.export.to_pte(model, ref_path, (x,), builder="reference", **options)
        if cuda.device_count() > 0:
            print(f"running {ref_path} (reference engines, host-computed) on the real GPU's memory instead:")
            with pyrt.Program(ref_path, budget="50%", trt=reference_tensorrt()) as prog:
                compare(prog, model, x.cuda(), "50%")
            return
        print(f"running {ref_path} (reference engines) on pyrt.sim's simulated GPU instead:")
        with simulated_gpus(1), pyrt.Program(ref_path, budget="50%") as prog:
            compare(prog, model, x, "50%")

if __name__ == "__main__":
    main()
