"""Operator recovery paths and rerouted SQL stages (seed 002): an operator's dataset_recovery_paths
row survives `metadata apply` (derived rows are marked derived and recomputed around it), is read
when a route is chosen and wins with a lower cost; a SQL stage whose upstream table is unavailable
reads the table's declared replica instead."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa
import yaml

from lakehouse.lineage.recovery import reroute, route_report
from lakehouse.metadata.loader import MetadataError, load_metadata
from tests.test_recovery import demo_with_replica

REPO = Path(__file__).resolve().parent.parent

OPERATOR = """
dataset_recovery_paths:
  - {dataset_id: bronze_user_events, path_order: 1, path_sequence: [user_events_archive, bronze_user_events],
     cost: 0.5}
"""


def apply(meta: Path) -> None:
    from lakehouse.cli import main as cli

    assert cli(["metadata", "apply", str(meta)]) == 0


def test_operator_path_survives_apply_and_wins(settings, tmp_path, capsys, monkeypatch):
    from lakehouse.metadata.store import TABLES, MetadataStore
    from lakehouse.stage.runner import Platform

    meta = demo_with_replica(tmp_path)
    (meta / "operator.yaml").write_text(OPERATOR)
    apply(meta)
    apply(meta)  # every apply recomputes the derived rows: the operator's stays as written
    (meta / "operator.yaml").unlink()
    apply(meta)  # and a metadata set without it merges, it does not overwrite
    platform = Platform(settings, MetadataStore(settings.control_db_url))
    paths = sorted((p for p in platform.catalog().dataset_recovery_paths if p.dataset_id == "bronze_user_events"),
                   key=lambda p: p.path_order)
    assert [(p.path_order, p.path_sequence, p.cost, p.derived) for p in paths] == [
        (1, ["user_events_archive", "bronze_user_events"], 0.5, False),
        (2, ["user_events_raw", "bronze_user_events"], 1.0, True),
        (3, ["user_events_replica", "bronze_user_events"], 3.0, True),
        # the graph's own archive route (cost 10) is not repeated: the operator's row holds that path
    ]

    # the primary is gone, replica (derived cost 3) and archive (operator cost 0.5) are both up
    for d in ("user_events_replica", "user_events_archive"):
        (settings.landing_dir / d).mkdir(parents=True)
    rs, chosen = route_report(platform, "bronze_user_events")
    assert [(r.as_text(), r.cost, r.operator) for r in rs][:2] == [
        ("user_events_archive -> bronze_user_events", 0.5, True),
        ("user_events_raw -> bronze_user_events", 1.0, False)]
    decision = reroute(platform, "bronze_user_events", failed="user_events_raw", run_id="r1")
    assert (decision.to_dataset_id, decision.cost) == ("user_events_archive", 0.5)
    from lakehouse.cli import main as cli

    capsys.readouterr()
    assert cli(["lineage", "paths", "bronze_user_events"]) == 0
    out = capsys.readouterr().out
    assert "would use: user_events_archive -> bronze_user_events (cost 0.5)" in out

    # rows from a control DB older than the `derived` column (NULL there) were all derived: they go
    rp, _ = TABLES["dataset_recovery_paths"]
    with platform.store.engine.begin() as conn:
        conn.execute(sa.insert(rp).values(dataset_id="gold_daily_user_events", path_order=99,
                                          path_sequence='["silver_user_events", "gold_daily_user_events"]',
                                          cost=7.0, derived=None))
    apply(meta)
    assert not [p for p in platform.catalog().dataset_recovery_paths if p.path_order == 99]


def test_operator_paths_are_validated(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("dataset_recovery_paths:\n  - {dataset_id: x, path_order: 1, path_sequence: [a, b], cost: 1}\n")
    with pytest.raises(MetadataError, match=r"dataset_recovery_paths\[0\]\.path_sequence: unknown dataset"):
        load_metadata(f)


def test_pre_run_check_lets_a_missing_upstream_with_a_live_replica_through(tmp_path):
    """The run's pre-run check (lakehouse.runtime.preflight) must not stop a stage whose upstream is gone
    while that table's declared replica exists: the stage reads the replica. Without a live replica
    the missing upstream is still a configuration problem."""
    from lakehouse.runtime.preflight import problems_for

    meta = tmp_path / "meta"
    shutil.copytree(REPO / "metadata" / "demo", meta)
    doc = yaml.safe_load((meta / "user_events.yaml").read_text())
    next(t for t in doc["targets"] if t["target_id"] == "silver_user_events")["alternative_source_id"] = "dr"
    doc["sources"].append({"source_id": "dr", "kind": "iceberg", "table_identifier": "dr.user_events"})
    (meta / "user_events.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    cat = load_metadata(meta).catalog
    gold = [cat.stage("user_events_etl", "gold_aggregate")]
    (msg,) = problems_for(cat, gold, {})
    assert "reads silver.user_events, which does not exist yet" in msg
    schema = {"event_id": "string", "user_id": "bigint", "event_type": "string", "event_ts": "timestamp",
              "country": "string", "device": "string", "app_version": "string"}
    assert problems_for(cat, gold, {"dr.user_events": schema}) == []


@pytest.mark.slow
def test_sql_stage_reads_the_declared_replica_when_its_upstream_is_unavailable(platform, tmp_path, monkeypatch):
    monkeypatch.setenv("LAKEHOUSE_DATAHUB", "off")
    from pyiceberg.catalog.sql import SqlCatalog

    from lakehouse.cli.demo import generate_user_events
    from lakehouse_assets.definitions import build_definitions, pipeline_job

    meta = tmp_path / "meta"
    shutil.copytree(REPO / "metadata" / "demo", meta)
    doc = yaml.safe_load((meta / "user_events.yaml").read_text())
    silver = next(t for t in doc["targets"] if t["target_id"] == "silver_user_events")
    silver["alternative_source_id"] = "silver_user_events_dr"  # the declared replica of the table
    doc["sources"].append({"source_id": "silver_user_events_dr", "kind": "iceberg",
                           "table_identifier": "dr.user_events", "description": "DR copy of silver.user_events"})
    (meta / "user_events.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    platform.store.apply(load_metadata(meta))
    s = platform.settings
    generate_user_events(s.landing_dir / "user_events", rows=1200, files=2, seed=9)
    defs = build_definitions(platform)
    assert pipeline_job(defs, "user_events_etl").execute_in_process(
        instance=dg.DagsterInstance.ephemeral()).success

    # the replica: kept by someone else, here a copy of silver with the views only (so it is telling)
    tables = platform.tables()
    tables.ensure_namespace("dr")
    platform.spark().sql(f"CREATE TABLE {tables.qualified('dr.user_events')} USING iceberg AS "
                         f"SELECT * FROM {tables.qualified('silver.user_events')} WHERE event_type = 'view'")
    cat = SqlCatalog(s.catalog_name, uri=s.catalog_uri, warehouse=s.warehouse)
    replica = cat.load_table("dr.user_events").scan().to_arrow().to_pylist()
    expected: dict[str, tuple[int, set]] = {}
    for r in replica:
        day = str(r["event_ts"].date())
        total, users = expected.get(day, (0, set()))
        expected[day] = (total + 1, users | {r["user_id"]})

    # silver becomes unavailable: its metadata files are gone (a storage outage)
    meta_dir = Path(re.sub(r"^file:(//)?", "", cat.load_table("silver.user_events").metadata_location)).parent
    shutil.move(str(meta_dir), str(tmp_path / "silver_metadata_away"))
    gold = dg.AssetKey(["gold", "daily_user_events"])
    run = defs.resolve_implicit_global_asset_job_def().execute_in_process(
        instance=dg.DagsterInstance.ephemeral(), asset_selection=[gold])
    assert run.success
    rows = cat.load_table("gold.daily_user_events").scan().to_arrow().to_pylist()
    assert {str(r["event_date"]): (r["total_events"], r["unique_users"]) for r in rows} == {
        d: (t, len(u)) for d, (t, u) in expected.items()}
    (e,) = [x for x in platform.store.audit_entries(event="reroute") if x.run_id == run.run_id]
    assert (e.dataset, e.outcome, e.details["from"], e.details["to"]) == (
        "gold_daily_user_events", "rerouted", "silver_user_events", "silver_user_events_dr")
    assert "does not load" in e.message
    started = [x for x in platform.store.audit_entries(run_id=run.run_id, event="stage_started")]
    assert started[0].details["plan"]["table_overrides"] == {"silver.user_events": "dr.user_events"}
