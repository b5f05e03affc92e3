#!/usr/bin/env bash
# On a GPU machine (see docs/hardware.md): unpack the carried TensorRT-RTX from .gpu/
# (made here by scripts/gpu_prepare.sh) and run every check of scripts/gpu_check.py,
# writing report.json, steps.log and pytest-gpu.xml into the folder given (default $OUT).
# Fits one 10-minute device call. Extra arguments go to `gpu_check.py run`.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-gpu-out}}; shift || true
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
python3 scripts/gpu_check.py install --assets .gpu --site /tmp/site 2>&1 | tee "$out/install.log" || exit 1
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
python3 scripts/gpu_check.py run --assets .gpu --out "$out" "$@" 2>&1 | tee "$out/run.log"
