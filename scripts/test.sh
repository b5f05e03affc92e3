#!/usr/bin/env bash
# Set up .venv (if needed) and run pyrt's tests. Extra arguments go to pytest.
#
#   bash scripts/test.sh               the fast tier: every package's tests that export no model, start no Ray,
#                                      soak nothing and mutate nothing (at most 8 minutes on a quiet 2-core machine)
#   bash scripts/test.sh --all         everything, every tier (what .ci/run runs)
#   bash scripts/test.sh --all tests/export    one area, every tier
#
# Both run in $PYRT_TEST_WORKERS pytest-xdist workers (default 2); tests that share an expensive fixture or a
# machine-wide resource (an LLM export, Ray, network namespaces) stay together on one worker (tests/conftest.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
workers=(-n "${PYRT_TEST_WORKERS:-2}" --dist loadgroup)
if [ "${1:-}" = "--all" ]; then
  shift
  exec .venv/bin/python -m pytest "${workers[@]}" "$@"
fi
exec .venv/bin/python -m pytest "${workers[@]}" -m "not (slow or export or ray or soak or mutants)" "$@"
