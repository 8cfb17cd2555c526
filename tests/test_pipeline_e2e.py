"""The demo pipeline end to end: landing files → bronze → silver → gold through real Spark and
Iceberg, read back by an independent reader (PyIceberg) and checked against plain Python."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from lakehouse.cli.demo import expected_daily, generate_user_events
from lakehouse.metadata.loader import load_metadata
from lakehouse_assets.definitions import build_definitions, pipeline_job

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "metadata" / "demo"


def pyiceberg_catalog(settings) -> SqlCatalog:
    return SqlCatalog(settings.catalog_name, uri=settings.catalog_uri, warehouse=settings.warehouse)


@pytest.fixture
def demo_platform(platform):
    platform.store.apply(load_metadata(DEMO))
    generate_user_events(platform.settings.landing_dir / "user_events", rows=6000, files=3, seed=7)
    return platform


def run_pipeline(platform, pipeline_id: str = "user_events_etl", instance=None):
    defs = build_definitions(platform)
    job = pipeline_job(defs, pipeline_id)
    return job.execute_in_process(instance=instance or dg.DagsterInstance.ephemeral(), raise_on_error=False)


def test_demo_pipeline_end_to_end(demo_platform):
    settings = demo_platform.settings
    result = run_pipeline(demo_platform)
    assert result.success

    cat = pyiceberg_catalog(settings)
    bronze = cat.load_table("bronze.user_events").scan().to_arrow()
    silver = cat.load_table("silver.user_events").scan().to_arrow()
    gold = cat.load_table("gold.daily_user_events").scan().to_arrow().to_pylist()

    landing = settings.landing_dir / "user_events"
    lines = [ln for p in sorted(landing.glob("*.jsonl")) for ln in p.read_text().splitlines()]
    missing_ids = sum(1 for ln in lines if '"event_id":null' in ln)
    assert bronze.num_rows == len(lines) - missing_ids  # rows without an id are quarantined
    expected = expected_daily(landing)
    assert silver.num_rows == sum(total for total, _ in expected.values())
    got = {str(r["event_date"]): (r["total_events"], r["unique_users"]) for r in gold}
    assert got == expected

    # every materialization carries the metadata a person needs
    mats = {e.asset_key.to_user_string(): e for e in result.get_asset_materialization_events()}
    md = mats["bronze/user_events"].materialization.metadata
    assert md["table"].value == "bronze.user_events"
    assert md["rows_written"].value == bronze.num_rows
    assert int(md["snapshot_id"].value) == cat.load_table("bronze.user_events").current_snapshot().snapshot_id
    assert "event_type" in md["partition_spec"].value
    # the demo's bronze target is `engine: auto`: its small landing is written by PyIceberg + Arrow
    # (no JVM), the SQL stages by Spark, and each materialization says which engine ran and why
    assert md["engine"].value == "arrow"
    assert md["engine_reason"].value.startswith("auto: ") and "<=" in md["engine_reason"].value
    for key in ("silver/user_events", "gold/daily_user_events"):
        assert mats[key].materialization.metadata["engine"].value == "spark"
    checks = {(c.asset_key.to_user_string(), c.check_name): c.passed for c in result.get_asset_check_evaluations()}
    assert checks[("silver/user_events", "event_id_unique")] is True
    assert checks[("gold/daily_user_events", "totals_cover_users")] is True


def duckdb_read(metadata_location: str, sql: str):
    """DuckDB's iceberg extension (shipped as a PyPI wheel), loaded offline as the README shows."""
    import importlib.resources

    import duckdb

    con = duckdb.connect()
    con.execute("SET extension_directory = ?", [str(importlib.resources.files("duckdb_ext") / "extensions")])
    con.execute("LOAD avro")
    con.execute("LOAD iceberg")
    return con.execute(sql.format(table=f"iceberg_scan('{metadata_location}')")).fetchall()


def test_tables_readable_by_duckdb(demo_platform):
    assert run_pipeline(demo_platform).success
    cat = pyiceberg_catalog(demo_platform.settings)
    gold = cat.load_table("gold.daily_user_events")
    rows = duckdb_read(gold.metadata_location.removeprefix("file://"),
                       "SELECT strftime(event_date, '%Y-%m-%d'), total_events, unique_users FROM {table}")
    expected = expected_daily(demo_platform.settings.landing_dir / "user_events")
    assert {d: (t, u) for d, t, u in rows} == expected


def test_rerun_skips_processed_files_and_new_files_append(demo_platform):
    settings = demo_platform.settings
    assert run_pipeline(demo_platform).success
    cat = pyiceberg_catalog(settings)
    first = cat.load_table("bronze.user_events").scan().to_arrow().num_rows

    assert run_pipeline(demo_platform).success  # nothing new: bronze unchanged
    assert cat.load_table("bronze.user_events").scan().to_arrow().num_rows == first

    generate_user_events(settings.landing_dir / "user_events" / "late", rows=500, files=1, seed=99)
    assert run_pipeline(demo_platform).success
    assert cat.load_table("bronze.user_events").scan().to_arrow().num_rows > first


def test_new_pipeline_from_yaml_appears_without_code_change(demo_platform, tmp_path):
    before = {k.to_user_string() for k in build_definitions(demo_platform).resolve_all_asset_keys()}
    extra = tmp_path / "orders.yaml"
    extra.write_text(
        """
pipelines:
  - {pipeline_id: orders_etl, owner: team:sales}
sources:
  - {source_id: orders_raw, kind: files, format: csv, path: orders, glob: "*.csv",
     columns: [{name: order_id, type: bigint}, {name: amount, type: double}]}
targets:
  - {target_id: bronze_orders, namespace: bronze, table: orders}
  - {target_id: gold_order_totals, namespace: gold, table: order_totals, write_mode: overwrite}
stages:
  - {pipeline_id: orders_etl, stage_order: 1, stage_name: ingest, layer: bronze, source_id: orders_raw, target_id: bronze_orders}
  - {pipeline_id: orders_etl, stage_order: 2, stage_name: totals, layer: gold, target_id: gold_order_totals,
     transformation: "SELECT count(*) AS orders, sum(amount) AS revenue FROM bronze.orders"}
"""
    )
    demo_platform.store.apply(load_metadata(extra))
    defs = build_definitions(demo_platform)
    after = {k.to_user_string() for k in defs.resolve_all_asset_keys()}
    assert after - before == {"bronze/orders", "gold/order_totals", "sources/orders_raw"}
    graph = defs.resolve_asset_graph()
    assert dg.AssetKey(["bronze", "orders"]) in graph.get(dg.AssetKey(["gold", "order_totals"])).parent_keys

    landing = demo_platform.settings.landing_dir / "orders"
    landing.mkdir(parents=True)
    (landing / "o1.csv").write_text("order_id,amount\n1,10.5\n2,4.5\n3,5\n")
    assert run_pipeline(demo_platform, "orders_etl").success
    rows = pyiceberg_catalog(demo_platform.settings).load_table("gold.order_totals").scan().to_arrow().to_pylist()
    assert rows == [{"orders": 3, "revenue": 20.0}]
