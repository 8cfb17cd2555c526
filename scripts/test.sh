#!/usr/bin/env bash
# Set up from nothing, lint, and run the whole test suite (the services it needs are started by the tests):
# the fast lane first (no Spark, no services: fails fast, its time printed), then the slow lane in two
# pytest-xdist workers, one test module each at a time (most of a slow test waits on subprocesses,
# databases and daemons; each worker has its own session-scoped SparkSession and services). Test JVMs
# load their classes from an archive built beside the fast lane (tests/jvm_class_archive.py).
# With arguments, runs pytest with them instead (e.g. one module).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
.venv/bin/ruff check .
if [ $# -gt 0 ]; then
    exec .venv/bin/python -m pytest "$@"
fi
start=$(date +%s)
# the test JVMs' class archive is built on the other core while the fast lane runs (its build is
# best effort: without it, the slow lane's first test builds it, and a failed build only costs time)
.venv/bin/python -m tests.jvm_class_archive &
archive=$!
.venv/bin/python -m pytest -m "not slow"
echo "fast lane (pytest -m 'not slow'): $(( $(date +%s) - start )) s"
wait "$archive" || true
# --no-loadscope-reorder: modules go out in collection order, the longest first (tests/conftest.py),
# instead of xdist's default (most tests first), which put long one-test modules at the end
exec .venv/bin/python -m pytest -m slow -n 2 --dist loadfile --no-loadscope-reorder --durations=25
