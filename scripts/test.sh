#!/usr/bin/env bash
# Set up from nothing, lint, and run the whole test suite (the services it needs are started by the tests):
# the fast lane first (no Spark, no services: fails fast, its time printed), then the slow lane.
# With arguments, runs pytest with them instead (e.g. one module).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
.venv/bin/ruff check .
if [ $# -gt 0 ]; then
    exec .venv/bin/python -m pytest "$@"
fi
start=$(date +%s)
.venv/bin/python -m pytest -m "not slow"
echo "fast lane (pytest -m 'not slow'): $(( $(date +%s) - start )) s"
exec .venv/bin/python -m pytest -m slow --durations=25
