#!/usr/bin/env bash
# Create .venv and install pyrt with everything its demo and tests use.
# Idempotent: a second run only checks what is there (the install is redone only when
# pyproject.toml or this script changed since the last one that succeeded).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
EXTRAS="export,cuda,tensorrt-rtx,cli,plot,serve,dev"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.pyrt-setup
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && .venv/bin/python -m pip show -q pyrt-executorch torch >/dev/null 2>&1; then
  exit 0
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
# CPU torch first, pinned: an unpinned torch pulls several GB of CUDA wheels.
.venv/bin/python -m pip install -q "torch==2.13.0"
# The distribution was called `pyrt` before it became `pyrt-executorch`: drop an old install,
# whose files (the `pyrt` command) would clash with the new one.
if .venv/bin/python -m pip show -q pyrt >/dev/null 2>&1; then .venv/bin/python -m pip uninstall -q -y pyrt; fi
# setuptools' notes about editable installs go to a log, not the terminal (they are not pyrt's).
.venv/bin/python -m pip install -q -e ".[$EXTRAS]" 2>.venv/pip-install.log || { cat .venv/pip-install.log >&2; exit 1; }
echo "$want" > "$stamp"
