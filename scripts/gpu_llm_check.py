"""Batched LLM generation on a real GPU's memory: slot files, the engine, isolation (issue #31's device check).

No TensorRT runs on the GPUs lent here, so the engines are pyrt's reference engines over the real
CUDA driver (:func:`pyrt.sim.gpu_reference.reference_tensorrt`): the KV caches are device
buffers that the engines update, copied with the driver; everything pyrt does around them runs
for real. Two steps, as for ``scripts/gpu_check.py``::

    python scripts/gpu_llm_check.py prepare .gpu/llm     # here: exports (needs torch, ExecuTorch, transformers)
    python3 scripts/gpu_llm_check.py run .gpu/llm OUT.json   # on the GPU machine (numpy, cuda-python)

``run`` checks, each against transformers' greedy tokens computed by ``prepare``: several prompts in
one ``pyrt.generate`` call (more than the file's slots), the same after a budget change (contexts
re-created), an ``Engine`` with prompts joining mid-run and one cancelled, four threads on one
Program, and a one-slot file's second concurrent generation refused with ``BusyError``.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPTS = [[5, 6, 7, 8, 9], [11, 12], list(range(20, 40)), [3], [30, 31, 32], [40, 41, 42, 43]]
NEW = 12


def prepare(folder: Path) -> None:
    from pyrt.export import decoder_to_pte
    from pyrt.testing import archs

    folder.mkdir(parents=True, exist_ok=True)
    model = archs.causal_lm("llama")
    decoder_to_pte(model, folder / "slots.pte", max_seq_len=48, max_batch_size=4, max_tokens_per_step=16,
                   builder="reference", weight_streaming=True, progress=False)
    decoder_to_pte(model, folder / "single.pte", max_seq_len=48, builder="reference", progress=False)
    want = [archs.greedy(model, p, NEW) for p in PROMPTS]
    (folder / "want.json").write_text(json.dumps({"prompts": PROMPTS, "new": NEW, "want": want}))
    print("prepared", sorted(p.name for p in folder.iterdir()))


def _threads(prog: Any, prompts: list[list[int]], new: int) -> list[Any]:
    import pyrt

    out: list[Any] = [None] * len(prompts)
    gate = threading.Barrier(len(prompts))

    def work(i: int) -> None:
        gate.wait()
        out[i] = pyrt.generate(prog, prompts[i], max_new_tokens=new, eos_ids=[]).tokens

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return out


def checks(folder: Path) -> dict[str, Any]:
    import os

    import pyrt
    import pyrt.llm
    from pyrt import cuda as cuda_seam
    from pyrt.sim.gpu_reference import reference_tensorrt

    spec = json.loads((folder / "want.json").read_text())
    prompts, new, want = spec["prompts"], spec["new"], spec["want"]
    cuda = cuda_seam.current()
    # PYRT_SIMULATED_GPUS=1: a dry run here, on the simulated GPU and its TensorRT
    trt = None if os.environ.get("PYRT_SIMULATED_GPUS") else reference_tensorrt(cuda)
    report: dict[str, Any] = {"device": str(cuda.devices()[0])}
    with pyrt.Program(folder / "slots.pte", trt=trt) as prog:
        t = time.perf_counter()
        got = [r.tokens for r in pyrt.generate(prog, prompts, max_new_tokens=new, eos_ids=[])]
        report["many_prompts_equal_transformers"] = got == want
        report["many_prompts_seconds"] = time.perf_counter() - t
        prog.set_budget("50%")
        got = [r.tokens for r in pyrt.generate(prog, prompts, max_new_tokens=new, eos_ids=[])]
        report["after_budget_change_equal"] = got == want
        report["budgets"] = [w.budget for w in prog.weight_streaming]
        engine = pyrt.llm.Engine(prog)
        first = [engine.submit(p, max_new_tokens=new, eos_ids=[]) for p in prompts[:3]]
        engine.step()
        late = [engine.submit(p, max_new_tokens=new, eos_ids=[]) for p in prompts[3:]]
        engine.cancel(first[1])
        while engine.pending:
            engine.step()
        kept = first[1].result.tokens if first[1].result else None
        report["engine_join_equal"] = [s.result.tokens for s in [first[0], first[2], *late] if s.result] == [
            want[0], want[2], *want[3:]]
        report["engine_cancel_kept_prefix"] = kept is not None and kept == want[1][:len(kept)] and len(kept) < new
        report["engine_stats"] = engine.stats()
        report["threads_equal"] = _threads(prog, prompts[:4], new) == want[:4]
    with pyrt.Program(folder / "single.pte", trt=trt) as prog:
        stream = pyrt.generate(prog, prompts[0], max_new_tokens=4, eos_ids=[], stream=True)
        next(stream)
        try:
            pyrt.generate(prog, prompts[1], max_new_tokens=4, eos_ids=[])
            report["single_slot_busy_error"] = False
        except pyrt.BusyError as exc:
            report["single_slot_busy_error"] = str(exc)
        report["single_slot_first_equal"] = [next(stream), *stream] == want[0][1:4]
    report["ok"] = all(v is not False for k, v in report.items() if k.endswith(("equal", "error", "prefix")))
    return report


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "prepare":
        prepare(Path(argv[1]))
        return 0
    if len(argv) >= 2 and argv[0] == "run":
        report = checks(Path(argv[1]))
        text = json.dumps(report, indent=1, default=str)
        print(text)
        if len(argv) > 2:
            Path(argv[2]).write_text(text)
        return 0 if report["ok"] else 1
    print(__doc__)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
