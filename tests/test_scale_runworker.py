"""A run launched by a REAL daemon materializes its own pipeline, not every pipeline (issue 22).

Three pipelines in the control DB; a run of pipeline p1 (the asset job with p1's stages selected, as
a schedule or the UI launches it) is submitted to a persistent instance; the daemon launches it
through its code server, whose run worker (a fresh process, its own JVM) loads the code location.
LAKEHOUSE_DEFS_TRACE records what each process built: the code server and the run worker each the
whole graph of the code location (Dagster's public loading path; splitting code locations is what
makes a run's build smaller). The run materializes p1 for real (Spark, Iceberg) and nothing of the
other pipelines.
"""

from __future__ import annotations

import json
import time

import pytest

from lakehouse.cli.demo import generate_user_events
from lakehouse.metadata.loader import load_metadata
from lakehouse.metadata.store import MetadataStore
from tests.test_derived_metadata import copies

pytestmark = pytest.mark.slow


@pytest.mark.timeout(2400)  # a JVM in the run worker on a loaded 2-core machine
def test_a_launched_run_materializes_its_own_pipeline(settings, tmp_path, dagster_daemon_factory):
    import dagster as dg

    MetadataStore(settings.control_db_url).apply(load_metadata(copies(tmp_path / "meta", 3)))
    generate_user_events(settings.landing_dir / "landing1", rows=300, files=2, seed=4)
    trace = tmp_path / "defs_trace.jsonl"
    d = dagster_daemon_factory(extra_env={"LAKEHOUSE_DEFS_TRACE": str(trace)})
    run_id = d.submit_pipeline("p1")  # untagged, as from the UI: the worker goes by the selection
    [run] = d.wait_for_runs([run_id], timeout=1800)
    assert run.status == dg.DagsterRunStatus.SUCCESS, d.failures([run_id]) + "\n" + d.log_tail()

    mats = {rec.dagster_event.asset_key.to_user_string()
            for rec in d.instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)}
    assert mats == {"bronze/user_events1", "silver/user_events1", "gold/daily_user_events1"}
    from pyiceberg.catalog.sql import SqlCatalog

    cat = SqlCatalog(settings.catalog_name, uri=settings.catalog_uri, warehouse=settings.warehouse)
    assert cat.load_table("silver.user_events1").scan().to_arrow().num_rows > 0
    assert not cat.table_exists("bronze.user_events0") and not cat.table_exists("bronze.user_events2")

    deadline = time.monotonic() + 60  # the trace line is written before the run starts; allow for buffering
    while time.monotonic() < deadline and not trace.exists():
        time.sleep(1)
    builds = [json.loads(x) for x in trace.read_text().splitlines()]
    assert builds and all(b["pipelines"] is None and b["stage_assets"] == 9 for b in builds), builds
    assert len({b["pid"] for b in builds}) >= 2, builds  # the code server's build and the run worker's
