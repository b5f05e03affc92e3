"""Device-memory facts the memory plan (issue #23) and the fake driver's capacity model rest on.

Run on a GPU machine (``python3 scripts/gpu_memory_facts.py OUT.json``), and with
``--simulated`` here, to compare the fake driver with the real one on the same sequence:

1. ``mem_info`` (free, total) before anything is allocated;
2. ``alloc`` of more than the free memory: the typed error pyrt raises and its text;
3. ``alloc_async`` (stream-ordered) of more than the free memory: the same;
4. allocations of 1 GiB until one fails: how many fit, and ``mem_info`` at that point;
5. after freeing them: ``mem_info`` again (does free memory come back at once?);
6. the address alignment of small allocations.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyrt.cuda as pcuda  # noqa: E402
from pyrt.errors import PyrtError  # noqa: E402

GiB = 1 << 30


def _error(fn: Any) -> dict[str, Any]:
    try:
        fn()
    except PyrtError as exc:
        return {"raised": type(exc).__name__, "text": str(exc)}
    except Exception as exc:  # an untyped failure is itself a finding
        return {"raised": f"UNTYPED {type(exc).__name__}", "text": str(exc)}
    return {"raised": None}


def facts(cuda: pcuda.Cuda) -> dict[str, Any]:
    out: dict[str, Any] = {"devices": [str(d) for d in cuda.devices()]}
    free, total = cuda.mem_info(0)
    out["mem_info_start"] = {"free": free, "total": total}
    out["alloc_past_free"] = _error(lambda: cuda.alloc(free + GiB, 0))
    stream = cuda.stream(0)
    out["alloc_async_past_free"] = _error(lambda: cuda.alloc_async(free + GiB, stream))
    held = []
    while True:
        try:
            held.append(cuda.alloc(GiB, 0))
        except PyrtError as exc:
            out["fill"] = {"GiB_allocated": len(held), "error": str(exc), "mem_info_full": cuda.mem_info(0)}
            break
        if len(held) > 4096:
            out["fill"] = {"GiB_allocated": len(held), "error": "stopped at 4096 GiB"}
            break
    for a in held:
        a.free()
    out["mem_info_after_free"] = cuda.mem_info(0)
    small = [cuda.alloc(n, 0) for n in (1, 3, 100, 4097)]
    out["small_alignment"] = [a.ptr % 4096 for a in small] + [min((a.ptr & -a.ptr) for a in small)]
    for a in small:
        a.free()
    return out


def main() -> int:
    target = Path(sys.argv[1]) if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else None
    if "--simulated" in sys.argv:
        from pyrt.sim import simulated_gpus

        with simulated_gpus(1):
            result = facts(pcuda.current())
    else:
        result = facts(pcuda.current())
    text = json.dumps(result, indent=1, default=str)
    print(text)
    if target:
        target.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
