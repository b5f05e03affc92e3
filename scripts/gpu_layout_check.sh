#!/usr/bin/env bash
# Needs .gpu/assets (scripts/gpu_check.py prepare --assets .gpu) and the pre-split tree in .gpu/before
# (git archive 58ac7c4 pyrt benchmarks tests scripts | tar -x -C .gpu/before); carry .gpu.
# One device call: env, memory facts, the gpu-marked tests on this tree, bench_host_overhead --gpu after/before interleaved.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 -c "import sys, numpy, torch, cuda.bindings as cb; print(sys.version); print('numpy', numpy.__version__, 'torch', torch.__version__, 'cuda-bindings', cb.__version__)"; nproc; } > "$OUT/env.txt" 2>&1
timeout 90 python3 scripts/gpu_memory_facts.py "$OUT/memory_facts.json" > "$OUT/memory_facts.log" 2>&1; echo "memory facts rc=$?"
PYRT_PREBUILT_PTE=$PWD/.gpu/assets/programs timeout 300 python3 -m pytest -p no:cacheprovider -o addopts= -m gpu -rA --timeout 200 \
  --junitxml="$OUT/pytest-gpu.xml" tests/device/test_cuda_seam.py tests/device/test_engine.py tests/export/test_trt_builder.py tests/device/test_gpu_programs.py \
  tests/runtime/test_runtime_delegates.py tests/export/test_export_tensorrt.py > "$OUT/pytest.log" 2>&1; echo "pytest rc=$?"; tail -5 "$OUT/pytest.log"
for round in 1 2; do
  for tree in after before; do
    dir=$PWD; [ $tree = before ] && dir=$PWD/.gpu/before
    (cd "$dir" && timeout 120 python3 benchmarks/bench_host_overhead.py --gpu --programs "$OLDPWD/.gpu/assets/programs" --no-write --forwards 2000 --samples 7) > "$OUT/host_overhead_${tree}_$round.txt" 2>&1
    echo "bench $tree $round rc=$?"
  done
done
tail -20 "$OUT/host_overhead_after_1.txt"
