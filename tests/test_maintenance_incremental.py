"""Maintenance that does not cost the next run (issue 39, item 5), on real Spark and Iceberg.

Proven: the demo pipeline (bronze -> incremental silver merge -> gold by touched partitions) runs two
rounds, `lakehouse maintain` compacts bronze and silver and expires their old snapshots, new rows
land, and the next run is still incremental at both stages: their decisions in the audit log step
over the compactions' `replace` snapshots, gold recomputes exactly the days the new rows touched,
Iceberg's own incremental read of bronze over the compaction returns exactly the new rows, and
silver and gold equal the independent expectation (plain Python over the landed files). And a
target's quarantine table is maintained with it: `lakehouse maintain` compacts it and expires its
snapshots under the target's policy, with results in the audit log, and the data table keeps its
own consumed-marks snapshot through expiry. A dimension read in full beside the incremental upstream
whose files were only rewritten is no change of it.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from lakehouse.cli import main as cli
from lakehouse.metadata.loader import load_metadata
from lakehouse.stage.incremental import MERGE, PARTITIONS, consumed_marks
from lakehouse.table import maintenance
from tests.test_incremental import DEMO, Feed, _last_incremental, _mode, _tables, run_stages

pytestmark = pytest.mark.slow

#: every file of these small tables is "small"; snapshots older than 0.36 s may go; keep the newest one
POLICY = """
platform_settings:
  - {setting_key: maintenance.small_file_mb, setting_value: "64"}
  - {setting_key: maintenance.compact_min_small_files, setting_value: "2"}
  - {setting_key: maintenance.snapshot_max_age_hours, setting_value: "0.0001"}
  - {setting_key: maintenance.min_snapshots_to_keep, setting_value: "1"}
"""


def _demo_with_policy(tmp_path: Path) -> Path:
    d = tmp_path / "demo"
    for p in DEMO.rglob("*"):
        if p.is_file():
            (d / p.relative_to(DEMO)).parent.mkdir(parents=True, exist_ok=True)
            (d / p.relative_to(DEMO)).write_text(p.read_text())
    (d / "maintenance.yaml").write_text(POLICY)
    return d


def _marks(cat, ident: str) -> dict[str, int]:
    md = cat.load_table(ident).metadata
    return consumed_marks(md, md.refs["main"].snapshot_id)


def test_next_run_after_maintain_stays_incremental_and_exact(platform, tmp_path):
    platform.store.apply(load_metadata(_demo_with_policy(tmp_path)))
    feed = Feed(platform.settings.landing_dir)
    for spec in (dict(days=[0, 1, 2]), dict(days=[3], late_day=0)):  # a late event: a second file in day 0
        feed.land(**spec)
        run_stages(platform)
    cat, silver, gold = _tables(platform.settings)
    assert (silver, gold) == (feed.silver(), feed.gold())
    assert (_mode(cat, "silver.user_events"), _mode(cat, "gold.daily_user_events")) == (MERGE, PARTITIONS)
    marks = {t: _marks(cat, t) for t in ("silver.user_events", "gold.daily_user_events")}
    snapshots = {t: len(cat.load_table(t).metadata.snapshots) for t in ("bronze.user_events", "silver.user_events")}

    time.sleep(1)  # every snapshot is older than snapshot_max_age_hours
    assert cli(["maintain"]) == 0
    done = {e.dataset: e.details for e in platform.store.audit_entries(limit=50)
            if e.event == maintenance.AUDIT_EVENT and e.outcome == "success"}
    for t in ("bronze.user_events", "silver.user_events"):
        assert done[t].get("data_files_rewritten", 0) > done[t].get("data_files_added", 0) > 0, (t, done[t])
        assert done[t]["snapshots_expired"] > 0, done[t]
        tbl = cat.load_table(t)
        assert tbl.current_snapshot().summary.operation.value == "replace"
        assert len(tbl.metadata.snapshots) < snapshots[t] + 1
    # what each incremental table consumed, and where its upstream's read starts, survived the expiry
    assert {t: _marks(cat, t) for t in marks} == marks
    assert done["silver.user_events"]["protected_for_consumers"] == {
        "gold.daily_user_events": marks["gold.daily_user_events"]["silver.user_events"],
        "silver.user_events": cat.load_table("silver.user_events").current_snapshot().parent_snapshot_id}
    # the maintained tables read the same
    cat, silver, gold = _tables(platform.settings)
    assert (silver, gold) == (feed.silver(), feed.gold())

    # new rows land (no event sent again: the days they touch are exactly the new rows' days)
    feed.land(days=[4], late_day=1)
    consumed_bronze = marks["silver.user_events"]["bronze.user_events"]
    run_stages(platform)
    cat, silver, gold = _tables(platform.settings)
    assert silver == feed.silver() and gold == feed.gold()
    assert (_mode(cat, "silver.user_events"), _mode(cat, "gold.daily_user_events")) == (MERGE, PARTITIONS)
    s, g = _last_incremental(platform, "silver_clean"), _last_incremental(platform, "gold_aggregate")
    for entry, compacted in ((s, "bronze.user_events"), (g, "silver.user_events")):
        assert entry.outcome == "incremental", entry.message
        assert "only rewrote files (compaction or manifest rewrite, operation replace): stepped over" in entry.message
        assert "full recompute" not in entry.message
        replaced = {snap.snapshot_id for snap in cat.load_table(compacted).metadata.snapshots
                    if snap.summary.operation.value == "replace"}
        assert set(entry.details["rewrites_skipped"]) == replaced, entry.details
    assert s.details["consumed"] == consumed_bronze
    assert set(g.details["partitions"]) == feed.touched  # exactly the days the new rows fall on
    assert len(feed.touched) < len(feed.gold())

    # the change set silver read: Iceberg's incremental read over the compaction is exactly round 3's rows
    tables = platform.tables()
    bronze_end = s.details["end"]
    new = (tables.spark.read.format("iceberg").option("start-snapshot-id", str(consumed_bronze))
           .option("end-snapshot-id", str(bronze_end)).load(tables.qualified("bronze.user_events")))
    landed = {p.name for p in feed.dir.glob("r03_*.jsonl")}
    bronze = cat.load_table("bronze.user_events").scan(snapshot_id=bronze_end).to_arrow().to_pylist()
    want = sorted((r["event_id"], r["_source_file"]) for r in bronze  # PyIceberg: the rows of round 3's files
                  if r["_source_file"].rsplit("/", 1)[-1] in landed)
    assert len(want) >= 6 and sorted((r[0], r[1]) for r in new.select("event_id", "_source_file").collect()) == want


QUARANTINED = """
targets:
  - target_id: events
    namespace: {ns}
    table: events
    maintenance: {{small_file_mb: 1, compact_min_small_files: 5, snapshot_max_age_hours: 0.0001,
                  min_snapshots_to_keep: 2}}
"""


def test_quarantine_table_is_compacted_and_expired_with_its_table(platform, spark, tmp_path, unique_ns):
    f = tmp_path / "q.yaml"
    f.write_text(QUARANTINED.format(ns=unique_ns))
    platform.store.apply(load_metadata(f))
    tables = platform.tables()
    ident = f"{unique_ns}.events"
    qident = f"{ident}__quarantine"
    spark.sql(f"CREATE TABLE {tables.qualified(ident)} (id BIGINT, v STRING) USING iceberg")
    spark.sql(f"CREATE TABLE {tables.qualified(qident)} (id BIGINT, v STRING, _failed_rules ARRAY<STRING>, "
              "_run_id STRING) USING iceberg")
    for i in range(8):  # eight runs' quarantined rows: eight small files, eight snapshots
        spark.createDataFrame([(i * 10 + j, None, ["v_not_null"], f"run-{i}") for j in range(3)],
                              "id BIGINT, v STRING, _failed_rules ARRAY<STRING>, _run_id STRING") \
            .coalesce(1).writeTo(tables.qualified(qident)).append()
    rows = sorted(tuple(map(str, r.values())) for r in
                  platform.pyiceberg_catalog().load_table(qident).scan().to_arrow().to_pylist())
    # the data table is an incremental consumer: its write recorded what it read of its upstream; small
    # writes follow that carry no mark (as a compaction's snapshot carries none)
    for i in range(8):
        w = spark.createDataFrame([(i, "x")], "id BIGINT, v STRING").coalesce(1).writeTo(tables.qualified(ident))
        if i == 0:
            w = w.option(f"snapshot-property.{maintenance.CONSUMED_PREFIX}{unique_ns}.src", "123")
        w.append()
        if i == 0:
            md_first = tables.snapshot_id(ident)
    time.sleep(1)

    assert cli(["maintain", "--namespace", unique_ns]) == 0  # the namespace's tables: its quarantine table too
    [entry] = [e for e in platform.store.audit_entries(limit=20)
               if e.event == maintenance.AUDIT_EVENT and e.dataset == qident]
    d = entry.details
    assert entry.outcome == "success" and d["due"][:2] == ["compact", "expire"], d
    assert d["data_files_rewritten"] == 8 and d["files_after"] == 1 and d["snapshots_expired"] >= 6, d
    tbl = platform.pyiceberg_catalog().load_table(qident)
    assert len(tbl.metadata.snapshots) <= 2
    assert sorted(tuple(map(str, r.values())) for r in tbl.scan().to_arrow().to_pylist()) == rows
    # the data table was compacted and expired too, but kept the snapshot with what it consumed
    [data] = [e for e in platform.store.audit_entries(limit=20)
              if e.event == maintenance.AUDIT_EVENT and e.dataset == ident]
    assert data.details["data_files_rewritten"] == 8 and not data.details.get("snapshots_expired"), data.details
    assert data.details["protected_for_consumers"] == {ident: md_first}
    md = platform.pyiceberg_catalog().load_table(ident).metadata
    assert consumed_marks(md, md.refs["main"].snapshot_id) == {f"{unique_ns}.src": 123}
    # and by name, as its table's companion: the target's kill switch stops it too
    assert cli(["target", "disable", "events"]) == 0
    res = maintenance.maintain(platform, maintenance.resolve_target(platform.catalog(), qident))
    assert res["skipped"] == "target 'events' is disabled by control_flags"


def test_a_compacted_dimension_is_no_change(platform, tmp_path):
    """Orders joined to users (read in full beside the orders): users' files rewritten (a replace
    snapshot) is not a change of users, so the next run still merges only the new orders."""
    import json

    from lakehouse.stage.runner import StageRunner
    from lakehouse.table.iceberg import quote, sql_string
    from tests.test_incremental import ORDERS, _apply_one

    cat = _apply_one(platform, tmp_path, ORDERS)
    s = platform.settings
    for d in ("orders", "users"):
        (s.landing_dir / d).mkdir(parents=True)

    def round_(n: int, orders: list[tuple], users: dict | None = None) -> dict:
        (s.landing_dir / "orders" / f"{n}.jsonl").write_text(
            "".join(json.dumps({"id": i, "uid": u, "amount": a}) + "\n" for i, u, a in orders))
        if users is not None:
            (s.landing_dir / "users" / f"{n}.jsonl").write_text(
                "".join(json.dumps({"uid": u, "country": c}) + "\n" for u, c in users.items()))
        for stage in ("orders_in", "users_in", "enrich"):
            r = StageRunner(platform, "orders", stage)
            r.load(r.extract())
        return {r["id"]: (r["amount"], r["country"]) for r in cat.load_table("silver.orders").scan().to_arrow().to_pylist()}

    round_(1, [("o1", 1, 10), ("o2", 2, 20)], {1: "US", 2: "DE"})
    round_(2, [("o3", 1, 30)])
    assert _mode(cat, "silver.orders") == MERGE
    spark = platform.spark()
    for t in ("bronze.users", "bronze.orders"):  # every file rewritten: a replace snapshot on each
        spark.sql(f"CALL {quote(s.catalog_name)}.system.rewrite_data_files(table => {sql_string(t)}, "
                  "options => map('rewrite-all', 'true'))").collect()
        assert cat.load_table(t).current_snapshot().summary.operation.value == "replace"
    got = round_(3, [("o4", 2, 40)])
    assert got == {"o1": (10, "US"), "o2": (20, "DE"), "o3": (30, "US"), "o4": (40, "DE")}
    e = [e for e in platform.store.audit_entries(pipeline_id="orders", event="incremental")
         if e.stage_name == "enrich"][-1]
    assert (_mode(cat, "silver.orders"), e.outcome) == (MERGE, "incremental"), e.message
    assert "only rewrote files" in e.message and "changed since" not in e.message
    props = cat.load_table("silver.orders").current_snapshot().summary.additional_properties
    assert props["lakehouse.consumed.bronze.users"] == str(cat.load_table("bronze.users").current_snapshot().snapshot_id)
