#!/usr/bin/env bash
# Set up .venv (if needed) and run pyrt's tests. Extra arguments go to pytest.
#
#   bash scripts/test.sh               the fast tier: every package's tests that export no model, start no Ray,
#                                      soak nothing and mutate nothing (at most 8 minutes on a quiet 2-core machine)
#   bash scripts/test.sh --all         everything, every tier (what .ci/run runs)
#   bash scripts/test.sh --all tests/export    one area, every tier
#
# Both run in $PYRT_TEST_WORKERS pytest-xdist workers (default 2); tests that share an expensive fixture or a
# machine-wide resource (an LLM export, network namespaces) stay together on one worker (tests/conftest.py); with
# --all the Ray tier runs after the rest, in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
workers=(-n "${PYRT_TEST_WORKERS:-2}" --dist loadgroup)
if [ "${1:-}" = "--all" ]; then
  shift
  # The Ray tier runs last, on its own: a starting Ray node's raylet gives its dashboard agent a fixed 15 s to
  # write its port files and aborts otherwise (Ray 2.60, no setting reaches it), and that agent's Python start-up
  # is slower than that when it shares 2 busy cores with another pytest worker as well. Exit 5: no test there.
  rest=0; .venv/bin/python -m pytest "${workers[@]}" -m "not ray" "$@" || rest=$?
  ray=0; .venv/bin/python -m pytest -m ray "$@" || ray=$?
  [ "$rest" -eq 5 ] && [ "$ray" -ne 5 ] && rest=0
  [ "$ray" -eq 5 ] && [ "$rest" -ne 5 ] && ray=0
  exit $(( rest != 0 ? rest : ray ))
fi
exec .venv/bin/python -m pytest "${workers[@]}" -m "not (slow or export or ray or soak or mutants)" "$@"
