#!/usr/bin/env bash
# Run the platform on its embedded defaults: SQLite control DB and Iceberg catalog, a local
# warehouse and landing zone under .lakehouse/, demo data generated on first start, dagster dev.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh

export LAKEHOUSE_HOME="${LAKEHOUSE_HOME:-$PWD/.lakehouse}"
export DAGSTER_HOME="${DAGSTER_HOME:-$LAKEHOUSE_HOME/dagster_home}"
mkdir -p "$DAGSTER_HOME"
# a home made from an older template names modules the platform no longer ships: made again (kept as .bak)
if [ -f "$DAGSTER_HOME/dagster.yaml" ] && grep -q 'lakehouse\.throughput\.\(dagster_storage\|compute_logs\)' "$DAGSTER_HOME/dagster.yaml"; then
  mv "$DAGSTER_HOME/dagster.yaml" "$DAGSTER_HOME/dagster.yaml.bak"
fi
[ -f "$DAGSTER_HOME/dagster.yaml" ] || cp deploy/dagster.dev.yaml "$DAGSTER_HOME/dagster.yaml"

.venv/bin/lakehouse metadata apply metadata/demo
if [ -z "$(ls -A "$LAKEHOUSE_HOME/landing/user_events" 2>/dev/null)" ]; then
  .venv/bin/lakehouse demo
fi
exec .venv/bin/dagster dev -h "${DAGSTER_HOST:-127.0.0.1}" -p "${DAGSTER_PORT:-3000}"
