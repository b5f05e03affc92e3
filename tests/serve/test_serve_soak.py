"""A one-minute soak (``benchmarks/soak_serve.py``), in the default suite: mixed traffic on 2 + 2 replicas.

The same checks as the ten-minute run recorded in benchmarks/RESULTS.md, over six windows of 10 s (the
first is warm-up): no valid request fails and every bad one gets a 4xx; each replica's RSS and open
descriptors grow less than 5% after warm-up; the p50 latency does not drift (last window under 3 times
the first after warm-up); the same replicas serve throughout.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray.serve")
pytest.importorskip("executorch")
pytest.importorskip("tritonclient.http")
pytest.importorskip("transformers")  # the GPT-2-style decoder of pyrt.testing.archs

pytestmark = [pytest.mark.ray, pytest.mark.soak]

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(1200)
def test_a_minute_of_mixed_traffic_fails_nothing_and_leaks_nothing() -> None:
    done = subprocess.run([sys.executable, "benchmarks/soak_serve.py", "--minutes", "1", "--window-s", "10",
                           "--check", "--no-write"], cwd=ROOT, capture_output=True, text=True, timeout=1100)
    lines = done.stdout.strip().splitlines()
    assert lines and lines[-1].startswith("{"), done.stderr[-4000:]
    assert json.loads(lines[-1])["problems"] == [], done.stdout[-3000:]
    assert done.returncode == 0, done.stdout[-3000:]
