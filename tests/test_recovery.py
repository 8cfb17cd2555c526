"""Recovery paths: the primary landing zone goes away mid-pipeline, the run completes over the
replica route chosen from the lineage graph, and the audit log says so."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from lakehouse.cli.demo import expected_daily, generate_user_events
from lakehouse.lineage.graph import build_graph, routes
from lakehouse.lineage.recovery import NoRecoveryPath, probe_source, reroute, route_report
from lakehouse.metadata.loader import load_metadata
from lakehouse.stage.runner import StageRunner

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "metadata" / "demo"

REPLICA = """
sources:
  - source_id: user_events_replica
    kind: files
    description: Replica landing zone (copied with keys and mtimes preserved)
    format: jsonl
    path: user_events_replica
    glob: "*.jsonl"
    batch_files: 4
    columns: &cols
      - {name: event_id, type: string}
      - {name: user_id, type: bigint}
      - {name: event_type, type: string}
      - {name: event_ts, type: string}
      - {name: country, type: string}
      - {name: context, type: "struct<device:string,app_version:string>"}
    promote_fields: [{path: context.device, column: device}]
  - source_id: user_events_archive
    kind: files
    description: A slower archive copy
    format: jsonl
    path: user_events_archive
    glob: "*.jsonl"
    columns: *cols
    promote_fields: [{path: context.device, column: device}]
dataset_lineage:
  - {from_dataset_id: user_events_replica, to_dataset_id: bronze_user_events, transform_name: replica_ingest, cost: 3, is_default: false}
  - {from_dataset_id: user_events_archive, to_dataset_id: bronze_user_events, transform_name: archive_ingest, cost: 10, is_default: false}
"""


def demo_with_replica(tmp_path: Path) -> Path:
    meta = tmp_path / "meta"
    shutil.copytree(DEMO, meta)
    doc = yaml.safe_load((meta / "user_events.yaml").read_text())
    raw = next(s for s in doc["sources"] if s["source_id"] == "user_events_raw")
    raw["alternative_source_id"] = "user_events_archive"
    (meta / "user_events.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    (meta / "replica.yaml").write_text(REPLICA)
    return meta


def mirror(src: Path, dst: Path) -> None:
    """A replica as an operator keeps one: same relative keys, same mtimes (copy2)."""
    dst.mkdir(parents=True, exist_ok=True)
    for p in src.rglob("*.jsonl"):
        target = dst / p.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(p, target)


@pytest.fixture
def replica_platform(platform, tmp_path):
    platform.store.apply(load_metadata(demo_with_replica(tmp_path)))
    return platform


def test_graph_holds_every_route_with_costs(replica_platform):
    from lakehouse.lineage.graph import sync

    catalog = replica_platform.catalog()
    rs = routes(build_graph(catalog), "gold_daily_user_events")
    assert [(r.as_text(), r.cost, r.is_default) for r in rs] == [
        ("user_events_raw -> bronze_user_events -> silver_user_events -> gold_daily_user_events", 3.0, True),
        ("user_events_replica -> bronze_user_events -> silver_user_events -> gold_daily_user_events", 5.0, False),
        # the alternative_source_id edge is cost primary+1 unless an explicit row says otherwise (10)
        ("user_events_archive -> bronze_user_events -> silver_user_events -> gold_daily_user_events", 12.0, False),
    ]
    counts = sync(replica_platform.store)
    catalog = replica_platform.catalog()
    edges = {(e.from_dataset_id, e.to_dataset_id): e for e in catalog.dataset_lineage}
    assert edges[("bronze_user_events", "silver_user_events")].transform_name == "stage:user_events_etl.silver_clean"
    assert edges[("silver_user_events", "gold_daily_user_events")].column_lineage["unique_users"] == ["user_id"]
    assert edges[("user_events_replica", "bronze_user_events")].cost == 3
    paths = [p for p in catalog.dataset_recovery_paths if p.dataset_id == "bronze_user_events"]
    assert [(p.path_order, p.path_sequence, p.cost) for p in sorted(paths, key=lambda p: p.path_order)] == [
        (1, ["user_events_raw", "bronze_user_events"], 1.0),
        (2, ["user_events_replica", "bronze_user_events"], 3.0),
        (3, ["user_events_archive", "bronze_user_events"], 10.0),
    ]
    assert counts["dataset_recovery_paths"] == len(catalog.dataset_recovery_paths)


def test_primary_unavailable_mid_pipeline_reroutes_to_replica(replica_platform):
    from tests.test_pipeline_e2e import pyiceberg_catalog, run_pipeline

    settings = replica_platform.settings
    primary = settings.landing_dir / "user_events"
    replica = settings.landing_dir / "user_events_replica"
    generate_user_events(primary, rows=3000, files=2, seed=11)
    mirror(primary, replica)

    first = run_pipeline(replica_platform)
    assert first.success
    assert not replica_platform.store.audit_entries(event="reroute")
    cat = pyiceberg_catalog(settings)
    bronze_rows = cat.load_table("bronze.user_events").scan().to_arrow().num_rows

    # more data arrives (in both copies), then the primary landing zone disappears
    late_src = settings.home / "late_gen"
    generate_user_events(late_src, rows=800, files=1, seed=12)
    (primary / "late").mkdir()
    for p in late_src.glob("*.jsonl"):  # fresh event ids, so the expectation is plain arithmetic
        (primary / "late" / p.name).write_text(p.read_text().replace('"event_id":"e', '"event_id":"late'))
    mirror(primary, replica)
    flat = settings.home / "all_events"
    flat.mkdir()
    for i, p in enumerate(sorted(primary.rglob("*.jsonl"))):
        shutil.copy(p, flat / f"{i:03d}.jsonl")
    expected = expected_daily(flat)
    shutil.move(str(primary), str(settings.landing_dir / "user_events.moved"))

    second = run_pipeline(replica_platform)
    assert second.success
    entries = [e for e in replica_platform.store.audit_entries(event="reroute") if e.run_id == second.run_id]
    assert len(entries) == 1
    e = entries[0]
    assert e.outcome == "rerouted" and e.action == "switch_to_recovery_path"
    assert e.dataset == "bronze_user_events" and e.stage_name == "bronze_ingest"
    assert e.details["from"] == "user_events_raw" and e.details["to"] == "user_events_replica"
    assert e.details["path"] == ["user_events_replica", "bronze_user_events"] and e.details["cost"] == 3
    assert "does not exist" in e.message

    # the replica supplied only the new file (same keys + etags as the primary's), nothing twice
    bronze = cat.load_table("bronze.user_events").scan().to_arrow()
    late_lines = sum(1 for p in (settings.landing_dir / "user_events.moved" / "late").glob("*.jsonl")
                     for ln in p.read_text().splitlines() if '"event_id":null' not in ln)
    assert bronze.num_rows == bronze_rows + late_lines
    gold = cat.load_table("gold.daily_user_events").scan().to_arrow().to_pylist()
    assert {str(r["event_date"]): (r["total_events"], r["unique_users"]) for r in gold} == expected
    # the rerouted stage's materialization records where it read from
    published = [x for x in replica_platform.store.audit_entries(run_id=second.run_id, event="stage_started")
                 if x.stage_name == "bronze_ingest"]
    assert published


def test_reroute_api_with_platform_and_no_route(replica_platform):
    settings = replica_platform.settings
    (settings.landing_dir / "user_events_archive").mkdir(parents=True)
    # nothing under the primary or the replica: the archive (cost 10) is the only live route
    decision = reroute(replica_platform, "bronze_user_events", failed="user_events_raw",
                       error=OSError("disk gone"), run_id="r1")
    assert (decision.to_dataset_id, decision.cost) == ("user_events_archive", 10.0)
    shutil.rmtree(settings.landing_dir / "user_events_archive")
    with pytest.raises(NoRecoveryPath, match="no available route into 'bronze_user_events'"):
        reroute(replica_platform, "bronze_user_events", failed="user_events_raw", run_id="r2")
    outcomes = [(e.run_id, e.outcome) for e in replica_platform.store.audit_entries(event="reroute")]
    assert outcomes == [("r1", "rerouted"), ("r2", "no_route")]


def test_runner_reroute_sets_override_and_reuses_it_in_the_run(replica_platform):
    settings = replica_platform.settings
    generate_user_events(settings.landing_dir / "user_events_replica", rows=100, files=1, seed=3)
    runner = StageRunner(replica_platform, "user_events_etl", "bronze_ingest", run_id="runx0001")
    decision = reroute(runner.platform, runner.stage.target_id, ctx=runner, error=RuntimeError("source read failed"))
    assert decision.from_dataset_id == "user_events_raw" and decision.to_dataset_id == "user_events_replica"
    assert runner.source.source_id == "user_events_replica"
    # a retry in the same run (a new runner) reads the replica too, without probing again
    again = StageRunner(replica_platform, "user_events_etl", "bronze_ingest", run_id="runx0001")
    plan = again.extract()
    assert plan.source_id == "user_events_replica" and len(plan.files) == 1


def test_probes_per_kind(replica_platform, s3_server, postgres_server, monkeypatch):
    from lakehouse.metadata.model import Source

    p = replica_platform
    ok, why = probe_source(p, p.catalog().source("user_events_raw"))
    assert not ok and "does not exist" in why
    bucket = s3_server.new_bucket()
    s3 = Source(source_id="s", kind="s3", format="jsonl", bucket=bucket, endpoint_url=s3_server.endpoint_url)
    assert probe_source(p, s3)[0] is True
    gone = s3.model_copy(update={"bucket": bucket + "-missing"})
    assert probe_source(p, gone)[0] is False
    monkeypatch.setenv("T_PG_USER", postgres_server.user)
    monkeypatch.setenv("T_PG_PASSWORD", postgres_server.password)
    db = Source(source_id="d", kind="jdbc", jdbc_url=postgres_server.jdbc_url(), table="t",
                user_env="T_PG_USER", password_env="T_PG_PASSWORD")
    ok, why = probe_source(p, db)
    assert ok, why
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    dead = db.model_copy(update={"jdbc_url": f"jdbc:postgresql://127.0.0.1:{dead_port}/postgres"})
    assert probe_source(p, dead)[0] is False
    ice = Source(source_id="i", kind="iceberg", table_identifier="bronze.nope")
    assert probe_source(p, ice)[0] is False


def test_route_report_marks_availability(replica_platform):
    (replica_platform.settings.landing_dir / "user_events_replica").mkdir(parents=True)
    rs, chosen = route_report(replica_platform, "bronze_user_events")
    avail = {r.path[0]: r.available for r in rs}
    assert avail == {"user_events_raw": False, "user_events_replica": True, "user_events_archive": False}
    assert chosen.path == ["user_events_replica", "bronze_user_events"]
