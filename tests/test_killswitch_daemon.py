"""The kill switch on a REAL persistent Dagster instance with `dagster-daemon run`.

A plain SQL UPDATE of `pipelines.enabled` (no CLI, no reload, no redeploy) must: terminate the
in-flight run within 30 s, cancel the queued run, make a sensor tick skip with the reason, and
leave main without any Iceberg commit after the flip. Re-enabling then loads every file exactly
once (the stopped run's audit branch never reached main, so nothing is lost or doubled).
"""

from __future__ import annotations

import json
import time

import pytest
import sqlalchemy as sa
from pyiceberg.catalog.sql import SqlCatalog

from lakehouse.metadata.loader import load_metadata
from lakehouse.metadata.store import MetadataStore
from lakehouse.table.iceberg import branch_name_for_run

FILES, ROWS_PER_FILE = 60, 5


def _pipeline_yaml() -> str:
    return """
pipelines:
  - {pipeline_id: ks}
sources:
  - {source_id: ks_raw, kind: files, format: jsonl, path: ks, glob: "*.jsonl", batch_files: 1,
     columns: [{name: id, type: bigint}, {name: v, type: string}]}
targets:
  - {target_id: ks_bronze, namespace: bronze, table: ks, write_mode: append}
stages:
  - {pipeline_id: ks, stage_order: 1, stage_name: ingest, layer: bronze, source_id: ks_raw, target_id: ks_bronze}
"""


def _wait(predicate, timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


@pytest.mark.timeout(2400)  # a JVM per run worker on a loaded 2-core machine
def test_flag_flip_by_sql_stops_runs_on_a_real_daemon(settings, tmp_path, dagster_daemon_factory):
    import dagster as dg
    from dagster._core.scheduler.instigation import TickStatus

    store = MetadataStore(settings.control_db_url)
    meta = tmp_path / "ks.yaml"
    meta.write_text(_pipeline_yaml())
    store.apply(load_metadata(meta))
    land = settings.landing_dir / "ks"
    land.mkdir(parents=True)
    for f in range(FILES):
        (land / f"f{f:03d}.jsonl").write_text(
            "".join(json.dumps({"id": f * 100 + i, "v": "x"}) + "\n" for i in range(ROWS_PER_FILE)))

    d = dagster_daemon_factory(max_concurrent_runs=1, extra_env={"LAKEHOUSE_KILL_SWITCH_INTERVAL": "2",
                                                                    # a loaded 2-core CI box is slow to launch
                                                                    "DAGSTER_GRPC_TIMEOUT_SECONDS": "300"},
                               start=False)
    inst = d.instance
    inst.get_runs(limit=1)  # create the instance's SQLite storage once, before daemon and code server race for it
    inst.all_instigator_state()
    d.start()
    tags = {"lakehouse/pipeline": "ks"}
    long_run = d.submit_pipeline("ks", tags=tags)
    # the long run is writing batches to its audit branch (one commit per file)
    _wait(lambda: any(e.event == "stage_started" for e in store.audit_entries(run_id=long_run)), 1500,
          "the long run to start loading\n" + d.log_tail())
    queued_run = d.submit_pipeline("ks", tags=tags)
    assert inst.get_run_by_id(queued_run).status == dg.DagsterRunStatus.QUEUED

    cat = SqlCatalog(settings.catalog_name, uri=settings.catalog_uri, warehouse=settings.warehouse)
    branch = branch_name_for_run(long_run)
    _wait(lambda: cat.table_exists("bronze.ks") and branch in cat.load_table("bronze.ks").metadata.refs, 600,
          "the long run's first commit on its audit branch", interval=1)
    main_before = cat.load_table("bronze.ks").metadata.refs["main"].snapshot_id

    # ---- the flip: a plain SQL UPDATE on the control table
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE pipelines SET enabled = :v WHERE pipeline_id = :p"), {"v": False, "p": "ks"})
    flipped = time.time()

    def stopped(run_id):
        r = inst.get_run_by_id(run_id)
        return r if r.status in (dg.DagsterRunStatus.CANCELING, dg.DagsterRunStatus.CANCELED) else None

    _wait(lambda: stopped(long_run), 30, "the in-flight run to be terminated within 30 s\n" + d.log_tail())
    stop_latency = time.time() - flipped
    _wait(lambda: stopped(queued_run), 30, "the queued run to be cancelled")
    [long_final, queued_final] = d.wait_for_runs([long_run, queued_run], timeout=120)
    assert long_final.status == dg.DagsterRunStatus.CANCELED
    assert queued_final.status == dg.DagsterRunStatus.CANCELED
    assert not list(inst.all_logs(queued_run, of_type=dg.DagsterEventType.STEP_START))  # never started
    assert stop_latency < 30

    events = {(e.run_id, e.action, e.outcome) for e in store.audit_entries(event="kill_switch")}
    assert (long_run, "terminate", "terminated") in events
    assert (queued_run, "cancel", "cancelled") in events

    # ---- nothing reached main after the flip (the long run never published)
    time.sleep(3)
    table = cat.load_table("bronze.ks")
    assert table.metadata.refs["main"].snapshot_id == main_before
    assert all(s.timestamp_ms / 1000 < flipped for s in table.snapshots()
               if s.snapshot_id in {a.snapshot_id for a in _main_ancestry(table)})
    assert table.scan().to_arrow().num_rows == 0

    # ---- a sensor tick skips, saying why
    ctx = d._request_context()
    repo = next(iter(ctx.get_code_location(d.location_name).get_repositories().values()))
    arrivals = repo.get_sensor("lakehouse_arrivals")  # one sensor over every source
    inst.start_sensor(arrivals)
    tick = _wait(lambda: next(iter(inst.get_ticks(arrivals.get_remote_origin_id(), arrivals.selector_id,
                                                  statuses=[TickStatus.SKIPPED])), None),
                 120, "a skipped arrivals tick\n" + d.log_tail(), interval=1)
    assert "disabled" in (tick.skip_reason or ""), tick.skip_reason
    assert not inst.get_ticks(arrivals.get_remote_origin_id(), arrivals.selector_id,
                              statuses=[TickStatus.SUCCESS])
    inst.stop_sensor(arrivals.get_remote_origin_id(), arrivals.selector_id, arrivals)

    # ---- re-enable: a new run (same Definitions the daemon loads, executed here to spare a second
    # run-worker JVM on a small box) loads every file exactly once
    d.stop()
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE pipelines SET enabled = :v WHERE pipeline_id = :p"), {"v": True, "p": "ks"})
    from lakehouse.stage.runner import Platform
    from lakehouse_assets.definitions import build_definitions, pipeline_job

    platform = Platform(settings, store)
    resumed = pipeline_job(build_definitions(platform), "ks").execute_in_process(
        instance=inst, tags=tags, raise_on_error=False)
    assert resumed.success
    ids = cat.load_table("bronze.ks").scan().to_arrow().column("id").to_pylist()
    assert len(ids) == FILES * ROWS_PER_FILE and len(set(ids)) == len(ids)


def _main_ancestry(table):
    snaps = {s.snapshot_id: s for s in table.snapshots()}
    cur = snaps.get(table.metadata.refs["main"].snapshot_id)
    out = []
    while cur is not None:
        out.append(cur)
        cur = snaps.get(cur.parent_snapshot_id)
    return out
