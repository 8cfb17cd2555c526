"""Several processes starting on a fresh embedded home at the same instant.

SQLAlchemy's `create_all` and PyIceberg's catalog set-up check for a table and then create it, so
the loser of two processes doing it at once used to fail with "table … already exists" (the
`throttle_buckets` table of two rate-limited runs, `iceberg_tables` of a fresh catalog). Here six
processes, released together, each open the control DB, the rate-limit buckets, the claims and
run leases, the file checkpoints, and the PyIceberg catalog, then create the same namespace and table: every one must
succeed, and the catalog must hold exactly one table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # starts subprocesses of the platform

REPO = Path(__file__).resolve().parent.parent

WORKER = """
import sys, time
sys.path.insert(0, sys.argv[1])
start_at = float(sys.argv[2])
from pyiceberg.exceptions import TableAlreadyExistsError
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField
from lakehouse.runtime import coordination
from lakehouse.table.catalog import ensure_namespace, pyiceberg_catalog
from lakehouse.stage.runner import Platform
from lakehouse.throughput.ratelimit import TokenBuckets
while time.time() < start_at:
    time.sleep(0.002)
platform = Platform.from_env()
TokenBuckets(platform.store)
coordination.engine_for(platform)
from lakehouse.ingest import checkpoints
checkpoints.engine_for(platform)
cat = pyiceberg_catalog(platform.settings)
ensure_namespace(cat, "first")  # as entity_raw creates its namespace
try:
    cat.create_table("first.t", Schema(NestedField(1, "id", LongType(), required=False)))
except TableAlreadyExistsError:
    pass
print("ok")
"""


def test_six_processes_set_up_one_fresh_home_at_once(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAKEHOUSE_", "DAGSTER_HOME"))}
    env.update({"LAKEHOUSE_HOME": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1",
                "LAKEHOUSE_CONTROL_DB_URL": f"sqlite:///{tmp_path / 'control.db'}",
                "LAKEHOUSE_CATALOG_URI": f"sqlite:///{tmp_path / 'catalog.db'}",
                "LAKEHOUSE_WAREHOUSE": f"file://{tmp_path / 'warehouse'}"})
    start_at = time.time() + 6.0  # every process has imported its modules by then
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(REPO), json.dumps(start_at)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(6)]
    outs = [p.communicate(timeout=300) for p in procs]
    failures = [err[-2000:] for p, (_, err) in zip(procs, outs, strict=True) if p.returncode != 0]
    assert not failures, failures
    assert all(out.strip().endswith("ok") for out, _ in outs)

    from pyiceberg.catalog.sql import SqlCatalog

    cat = SqlCatalog("lake", uri=env["LAKEHOUSE_CATALOG_URI"], warehouse=env["LAKEHOUSE_WAREHOUSE"])
    assert cat.list_tables("first") == [("first", "t")]
