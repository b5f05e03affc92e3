#!/usr/bin/env bash
# Create .venv and install pyrt with everything its demo and tests use.
# Idempotent: a second run only checks what is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
# CPU torch first, pinned: an unpinned torch pulls several GB of CUDA wheels.
.venv/bin/python -m pip install -q "torch==2.13.0"
# The distribution was called `pyrt` before it became `pyrt-executorch`: drop an old install,
# whose files (the `pyrt` command) would clash with the new one.
if .venv/bin/python -m pip show -q pyrt >/dev/null 2>&1; then .venv/bin/python -m pip uninstall -q -y pyrt; fi
.venv/bin/python -m pip install -q -e ".[export,cuda,tensorrt-rtx,cli,plot,serve,dev]"
