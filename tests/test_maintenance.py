"""Table maintenance (lakehouse.table.maintenance) on real Spark and Iceberg, read back with PyIceberg.

Proven: 40 small appends, then `lakehouse maintain TABLE`: the live file count drops, the rows are
identical (PyIceberg, an independent reader), old snapshots are expired but a kept failed audit's
branch and its rows stay readable, and so does the snapshot an incremental consumer recorded as read;
an orphan file older than the minimum age is removed and a younger one (a concurrent writer's,
perhaps) is kept; results land in the audit log. `--dry-run` changes nothing. The per-namespace
maintenance asset materializes with the results as metadata, and holds a slot of each table's target
pool while it maintains it (waits while loads fill the pool; freed after success, failure, termination).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from lakehouse.cli import main as cli
from lakehouse.metadata.loader import load_metadata
from lakehouse.table import branches, maintenance

pytestmark = pytest.mark.slow

APPENDS = 40


def _metadata(tmp_path: Path, ns: str) -> Path:
    f = tmp_path / "maint.yaml"
    f.write_text(f"""
targets:
  - target_id: events
    namespace: {ns}
    table: events
    maintenance:
      snapshot_max_age_hours: 0.0001
      min_snapshots_to_keep: 2
      small_file_mb: 1
      compact_min_small_files: 5
      orphan_min_age_hours: 24
  - target_id: events_daily
    namespace: {ns}
    table: events_daily
platform_settings:
  - {{setting_key: maintenance.schedule.{ns}, setting_value: "30 2 * * *"}}
""")
    return f


def _rows(platform, ident: str, ref: str = "main") -> list[tuple]:
    tbl = platform.pyiceberg_catalog().load_table(ident)
    scan = tbl.scan() if ref == "main" else tbl.scan(snapshot_id=tbl.metadata.refs[ref].snapshot_id)
    return sorted(tuple(r.values()) for r in scan.to_arrow().to_pylist())


def test_maintain_compacts_expires_and_keeps_what_is_needed(platform, spark, tmp_path, unique_ns, capsys):
    platform.store.apply(load_metadata(_metadata(tmp_path, unique_ns)))
    tables = platform.tables()
    ident, down = f"{unique_ns}.events", f"{unique_ns}.events_daily"
    q, qd = tables.qualified(ident), tables.qualified(down)
    spark.sql(f"CREATE TABLE {q} (id BIGINT, v STRING) USING iceberg")
    spark.sql(f"CREATE TABLE {qd} (n BIGINT) USING iceberg")
    for i in range(APPENDS):
        spark.createDataFrame([(i * 10 + j, f"r{i}") for j in range(3)], "id BIGINT, v STRING") \
            .coalesce(1).writeTo(q).append()
        if i == 4:  # a failed audit's branch, kept for inspection, with rows only it holds
            tables.create_branch(ident, "audit_failed1")
            spark.createDataFrame([(-1, "audit-only")], "id BIGINT, v STRING").writeTo(
                tables.qualified(ident, "audit_failed1")).append()
            branches.keep_failed_audit(platform, [ident], "audit_failed1", "run-failed-1", "rule failed")
        if i == 29:
            consumed = tables.snapshot_id(ident)
    audit_rows = _rows(platform, ident, "audit_failed1")
    assert (-1, "audit-only") in audit_rows
    # an incremental consumer recorded that it read `ident` up to `consumed`
    spark.createDataFrame([(1,)], "n BIGINT").writeTo(qd).option(
        f"snapshot-property.{maintenance.CONSUMED_PREFIX}{ident}", str(consumed)).append()

    loc = platform.pyiceberg_catalog().load_table(ident).metadata.location.removeprefix("file:")
    old_orphan, young_orphan = Path(loc) / "data" / "old-orphan.parquet", Path(loc) / "data" / "young-orphan.parquet"
    for f in (old_orphan, young_orphan):
        f.write_bytes(b"not referenced by any snapshot")
    two_days_ago = time.time() - 48 * 3600
    os.utime(old_orphan, (two_days_ago, two_days_ago))

    before_rows = _rows(platform, ident)
    before = maintenance.table_state(tables, ident, maintenance.MB)
    assert before.data_files == APPENDS and before.small_files == APPENDS
    time.sleep(1)  # every snapshot is now older than snapshot_max_age_hours (0.36 s)

    assert cli(["maintain", ident, "--dry-run"]) == 0  # says what is due, changes nothing
    out = capsys.readouterr().out
    assert "compact" in out and "40 of 40 live file(s) under 1 MB" in out
    assert maintenance.table_state(tables, ident, maintenance.MB) == before and old_orphan.exists()

    assert cli(["maintain", ident]) == 0
    after = maintenance.table_state(tables, ident, maintenance.MB)
    assert after.data_files < before.data_files and after.data_files <= 2
    assert _rows(platform, ident) == before_rows  # independent reader: same rows
    md = platform.pyiceberg_catalog().load_table(ident).metadata
    ids = {s.snapshot_id for s in md.snapshots}
    assert len(ids) < before.snapshots  # old snapshots expired...
    assert consumed in ids  # ...but not what the consumer has still to read from
    assert md.refs["audit_failed1"].snapshot_id in ids
    assert _rows(platform, ident, "audit_failed1") == audit_rows  # the kept branch's data is still readable
    assert not old_orphan.exists() and young_orphan.exists()

    # a max-ref-age that would drop the kept branch: expiry is skipped for the table, with the reason
    spark.sql(f"ALTER TABLE {q} SET TBLPROPERTIES ('history.expire.max-ref-age-ms' = '1')")
    p = maintenance.plan(platform, tables, platform.catalog(), platform.catalog().target("events"))
    assert not p.expire and "branch audit_failed1 is older than its max-ref-age" in p.reasons["expire"]
    spark.sql(f"ALTER TABLE {q} UNSET TBLPROPERTIES ('history.expire.max-ref-age-ms')")
    # the target's kill switch stops maintenance as it stops the target's writers
    assert cli(["target", "disable", "events"]) == 0
    assert maintenance.maintain(platform, platform.catalog().target("events"))["skipped"] == \
        "target 'events' is disabled by control_flags"

    entries = [e for e in platform.store.audit_entries(limit=50) if e.event == maintenance.AUDIT_EVENT]
    assert [e.message for e in entries if e.outcome == "skipped"] == ["target 'events' is disabled by control_flags"]
    [entry] = [e for e in entries if e.outcome == "success"]
    d = entry.details
    assert entry.dataset == ident and d["data_files_rewritten"] == APPENDS and d["orphan_files_removed"] == 1
    assert d["snapshots_expired"] >= 1 and d["files_after"] == after.data_files
    assert d["protected_for_consumers"] == {down: consumed}


def test_maintenance_asset_materializes_with_results(platform, spark, tmp_path, unique_ns):
    import dagster as dg

    from lakehouse_assets.maintenance_assets import asset_key, maintenance_definitions
    from resources import LakehouseResource

    platform.store.apply(load_metadata(_metadata(tmp_path, unique_ns)))
    tables = platform.tables()
    ident = f"{unique_ns}.events"
    spark.sql(f"CREATE TABLE {tables.qualified(ident)} (id BIGINT, v STRING) USING iceberg")
    for i in range(7):
        spark.createDataFrame([(i, "x")], "id BIGINT, v STRING").writeTo(tables.qualified(ident)).append()
    defs = maintenance_definitions(platform.catalog())
    [asset] = defs["assets"]
    assert asset.op.pool == f"maintenance:{unique_ns}"  # one op for the namespace's tables
    [sched] = defs["schedules"]
    assert sched.cron_schedule == "30 2 * * *" and sched.job_name == "__ASSET_JOB"  # its asset selected

    result = dg.materialize([asset], resources={"lakehouse": LakehouseResource()})
    assert result.success
    [mat] = [m for m in result.get_asset_materialization_events() if m.asset_key == asset_key(unique_ns)]
    md = mat.materialization.metadata
    assert md["tables"].value == 2 and md["data_files_rewritten"].value == 7 and md["files_after"].value == 1
    # written seconds ago: no file under the table's location can be an orphan, so no Spark listing for them
    assert f"| {ident} | compact, expire |" in md["results"].value
    assert f"| {unique_ns}.events_daily | the table does not exist yet |" in md["results"].value
    assert maintenance.table_state(tables, ident, maintenance.MB).data_files == 1


def _staged_metadata(tmp_path: Path, ns: str) -> Path:
    """One stage writing `<ns>.events` (so its load ops claim pool `target:events`), one table nobody writes."""
    f = tmp_path / "maint_pool.yaml"
    f.write_text(f"""
pipelines:
  - {{pipeline_id: p_{ns}}}
sources:
  - {{source_id: src_{ns}, kind: files, format: jsonl, path: landing, columns: [{{name: id, type: bigint}}, {{name: v, type: string}}]}}
targets:
  - target_id: events
    namespace: {ns}
    table: events
    maintenance: {{small_file_mb: 1, compact_min_small_files: 2, rewrite_manifests: false}}
stages:
  - {{pipeline_id: p_{ns}, stage_order: 1, stage_name: ingest, layer: bronze, source_id: src_{ns}, target_id: events}}
""")
    return f


def test_maintenance_holds_a_slot_of_the_target_pool(platform, spark, tmp_path, unique_ns):
    """Per table, the namespace's maintenance op holds a slot of the table's `target:<id>` pool, the
    pool its load ops claim. On a persistent instance (pools are ignored by ephemeral ones) with that
    pool at limit 1 held by another claimant (a load), maintenance waits and compacts nothing; once
    the slot is freed it proceeds (its commit is later than the freeing: PyIceberg reads the snapshot
    times). Its slot is freed after it, after a failure (a data file lost) and when the run is
    terminated while it waits."""
    import threading

    import dagster as dg

    from lakehouse_assets.maintenance_assets import maintenance_definitions, target_pool
    from resources import LakehouseResource
    from tests.fixtures.dagster_daemon import write_instance_config

    platform.store.apply(load_metadata(_staged_metadata(tmp_path, unique_ns)))
    catalog = platform.catalog()
    pool = target_pool(catalog, catalog.target("events"))
    assert pool == "target:events"
    tables = platform.tables()
    ident = f"{unique_ns}.events"
    q = tables.qualified(ident)
    spark.sql(f"CREATE TABLE {q} (id BIGINT, v STRING) USING iceberg")
    for i in range(4):
        spark.createDataFrame([(i, "x")], "id BIGINT, v STRING").coalesce(1).writeTo(q).append()
    home = tmp_path / "dagster_home"
    write_instance_config(home, max_concurrent_runs=1, tag_concurrency_limits=None, default_pool_limit=None,
                          module="lakehouse_assets.definitions", location_name="lakehouse")
    instance = dg.DagsterInstance.from_config(str(home))
    storage = instance.event_log_storage
    storage.set_concurrency_slots(pool, 1)
    [asset] = maintenance_definitions(catalog)["assets"]

    def info():
        return storage.get_concurrency_info(pool)

    def launch(outcome: dict) -> threading.Thread:
        def body():
            try:
                outcome["result"] = dg.materialize([asset], instance=instance, raise_on_error=False,
                                                   resources={"lakehouse": LakehouseResource()})
            except BaseException as exc:  # noqa: BLE001 - shown by the assertions
                outcome["error"] = exc
        t = threading.Thread(target=body, daemon=True)
        t.start()
        return t

    def wait_pending(t: threading.Thread) -> str:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and t.is_alive():
            pending = [p for p in info().pending_steps if p.run_id != "load-run"]
            if pending:
                return pending[0].run_id
            time.sleep(0.2)
        raise AssertionError(f"maintenance never queued for {pool}: {info()}")

    # 1. a load holds the pool's only slot: maintenance waits for it, then proceeds
    assert storage.claim_concurrency_slot(pool, "load-run", "p__ingest__load").is_claimed
    outcome: dict = {}
    t = launch(outcome)
    run_id = wait_pending(t)
    time.sleep(3)
    assert t.is_alive() and maintenance.table_state(tables, ident, maintenance.MB).data_files == 4  # nothing done
    assert [(s.run_id, s.step_key) for s in info().claimed_slots] == [("load-run", "p__ingest__load")]
    freed_ms = int(time.time() * 1000)
    storage.free_concurrency_slot_for_step("load-run", "p__ingest__load")
    t.join(300)
    assert outcome["result"].success, outcome
    md = platform.pyiceberg_catalog().load_table(ident).metadata
    assert md.snapshots[-1].summary.operation.value == "replace"  # the compaction, committed after the slot was freed
    assert md.snapshots[-1].timestamp_ms >= freed_ms
    assert maintenance.table_state(tables, ident, maintenance.MB).data_files == 1
    [mat] = outcome["result"].get_asset_materialization_events()
    assert f"| {ident} | compact" in mat.materialization.metadata["results"].value
    assert info().claimed_slots == [] and info().pending_steps == []  # its slot is freed
    [entry] = [e for e in platform.store.audit_entries(limit=20) if e.event == maintenance.AUDIT_EVENT
               and e.run_id == run_id]
    assert entry.outcome == "success"

    # 2. a failure (a data file of the table is lost): the step fails, the slot is freed all the same
    for i in range(3):
        spark.createDataFrame([(10 + i, "y")], "id BIGINT, v STRING").coalesce(1).writeTo(q).append()
    lost = next(iter(platform.pyiceberg_catalog().load_table(ident).scan().plan_files())).file.file_path
    Path(lost.removeprefix("file:")).unlink()
    outcome = {}
    t = launch(outcome)
    t.join(300)
    assert not outcome["result"].success
    assert "maintenance of 1 table(s)" in str(outcome["result"].get_step_failure_events()[0].event_specific_data.error)
    assert info().claimed_slots == [] and info().pending_steps == []

    # 3. the run is terminated while maintenance waits for the slot: it stops waiting, its claim is dropped
    assert storage.claim_concurrency_slot(pool, "load-run", "p__ingest__load").is_claimed
    outcome = {}
    t = launch(outcome)
    run_id = wait_pending(t)
    instance.report_run_canceling(instance.get_run_by_id(run_id))
    t.join(120)
    assert not t.is_alive() and "error" not in outcome, outcome
    [failure] = outcome["result"].get_step_failure_events()  # Dagster's interrupt: the step failed, not retried
    assert failure.event_specific_data.error_source.value == "INTERRUPT"
    assert "is being terminated: stopped waiting for a slot of pool target:events" in str(
        failure.event_specific_data.error), failure
    assert [(s.run_id, s.step_key) for s in info().claimed_slots] == [("load-run", "p__ingest__load")]
    assert [p.run_id for p in info().pending_steps] == ["load-run"]
