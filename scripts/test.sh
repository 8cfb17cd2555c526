#!/usr/bin/env bash
# Set up from nothing, lint, and run the whole test suite (the services it needs are started by the tests).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
.venv/bin/ruff check .
exec .venv/bin/python -m pytest "$@"
