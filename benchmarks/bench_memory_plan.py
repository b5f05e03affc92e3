"""Device memory of a three-engine program (a model with two graph breaks) on simulated GPUs of 8, 24 and
80 GiB: with and without shared activation memory, and budget="fit" against the per-engine automatic budgets.

The simulated GPU (pyrt.sim) counts every device byte the program holds; TensorRT's stand-in takes
what real TensorRT takes (resident weights, streaming scratch, activation memory per context or the shared
area). The model and the GPUs are scaled by 1/1024 (GiB -> MiB) so the engines' weights can live in the
.pte; every size in the plan is linear in that scale, and the table reports sizes scaled back up.

Model (scaled up): engine 0 and 1 each 14 GiB of streamable weights and 1.5 GiB of activations, engine 2
(the head) 2 GiB of weights and 0.5 GiB of activations; a 0.25 GiB device arena; streaming scratch
1/32 of each engine's weights. Headroom for "fit": 5% of the GPU (the default).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_memory_plan.py
"""

from __future__ import annotations

import os
import sys
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import pyrt  # noqa: E402
from pyrt.runtime.memory_plan import format_bytes  # noqa: E402
from pyrt.sim import simulated_devices  # noqa: E402
from pyrt.sim.refengine import Ref, RefEngine, RefNode, RefTensor  # noqa: E402

SCALE = 1024  # GiB in the report = MiB on the simulated GPU
MiB = 1 << 20
GPUS_GIB = (8, 24, 80)


def engine(value: float, weights: int, activation: int, pieces: int = 32) -> RefEngine:
    ws = {"w": np.full((2, 3), value, np.float32)}
    ws.update({f"p{k}": np.zeros(weights // pieces // 4, np.float32) for k in range(pieces)})
    nodes = [RefNode("aten::sum", [Ref("p0")], {}, ["s"]), RefNode("aten::add.Tensor", [Ref("x"), Ref("w")], {}, ["t"]),
             RefNode("aten::add.Tensor", [Ref("t"), Ref("s")], {}, ["y"])]
    return RefEngine([RefTensor("x", "float32", (2, 3))], [RefTensor("y", "float32", (2, 3))], weights=ws,
                     nodes=nodes, weight_streaming=True, device_memory=activation)


def program() -> bytes:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tests.fixtures.memplan import chain_program

    return chain_program({"forward": [engine(1.0, 14 * MiB, 3 * MiB // 2), engine(2.0, 14 * MiB, 3 * MiB // 2),
                                      engine(3.0, 2 * MiB, MiB // 2)]}, arena_on_device=True, arena_bytes=MiB // 4)


def measure(data: bytes, gpu_gib: int, budget: str | None, share: bool) -> dict[str, object]:
    sim = simulated_devices(1, memory=gpu_gib * MiB)
    row: dict[str, object] = {"gpu": f"{gpu_gib} GiB", "budget": budget or "automatic (per engine)",
                              "sharing": "shared" if share else "one per engine"}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prog = pyrt.Program(data, devices=sim, budget=budget, share_activations=share)
    except pyrt.PyrtError as exc:
        why = "out of device memory" if "memory" in str(exc) else str(exc)[:60]
        row.update(status=f"load fails ({type(exc).__name__}: {why})", held="-", activations="-", resident="-",
                   engines="-", free="-")
        return row
    with prog:
        x = np.ones((2, 3), np.float32)
        try:
            prog(x)
            status = "runs"
        except pyrt.PyrtError as exc:
            status = f"run fails: {type(exc).__name__}"
        d = prog.memory_plan.devices[0]
        row.update(status=status, held=sim.driver.memory_used(0) * SCALE, activations=d.activations * SCALE,
                   resident=sum(w.budget or 0 for w in prog.weight_streaming) * SCALE,
                   engines=" / ".join(f"{(w.budget or 0) * SCALE / (1 << 30):.2f}" for w in prog.weight_streaming),
                   free=sim.driver.free_memory(0) * SCALE)
    return row


def main() -> None:
    data = program()
    rows = [measure(data, g, b, s) for g in GPUS_GIB for b in ("fit", None) for s in (True, False)]
    cols = ("gpu", "budget", "sharing", "status", "held", "activations", "resident", "engines", "free")
    head = ("GPU", "budget", "activation memory", "result", "device bytes held", "activations", "weights resident",
            "per engine (GiB)", "left free")
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for r in rows:
        print("| " + " | ".join(format_bytes(v) if isinstance(v, int) else str(v) for v in (r[c] for c in cols)) + " |")


if __name__ == "__main__":
    main()
