#!/usr/bin/env bash
# Set up (if needed) and run the demo: export a small model, write a .pte,
# inspect it, and run it (on a GPU when one is present).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python examples/demo.py "$@"
