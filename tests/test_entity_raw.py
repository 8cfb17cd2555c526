"""entity_raw (seed 000) end to end: the applications registry, one table per application with
exactly the seed's schema, rejection of unknown applications, loads from S3 (moto_server) with
Spark to_json(struct(...)) over hostile column names, tenant separation, APPEND / UPSERT, rerun
skipping, the Dagster asset + sensor + 10-minute schedule, and the raw-to-transformed join."""

from __future__ import annotations

import io
import json

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError
from pyiceberg.catalog.sql import SqlCatalog

from lakehouse.metadata.loader import load_metadata
from lakehouse.stage import entity_raw
from tests.fixtures.ticks import tick as evaluate_tick

APPS = """
sources:
  - source_id: redshift_extract
    kind: s3
    format: parquet
    bucket: {bucket}
    prefix: artifacts/apps/redshift/
    glob: "*.parquet"
    options: {{tenant_id: acme, connection_qualified_name: "default/redshift/1700000000"}}
applications:
  - {{application_id: redshift, source_id: redshift_extract, description: Redshift connector}}
  - {{application_id: snowflake}}
  - {{application_id: retired_app, enabled: false}}
"""

HOSTILE = ["table_name", "x'); DROP TABLE entity_raw.redshift; --", "a`b", 'quo"te', "dotted.name", "sp ace"]


def pycat(platform) -> SqlCatalog:
    s = platform.settings
    return SqlCatalog(s.catalog_name, uri=s.catalog_uri, warehouse=s.warehouse)


def parquet_bytes(rows: list[dict]) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    return buf.getvalue()


def raw_rows(run: str, n: int) -> list[dict]:
    return [{"table_name": f"orders_{i}", HOSTILE[1]: f"v{i}", "a`b": i, 'quo"te': f"q{run}",
             "dotted.name": float(i) / 2, "sp ace": None if i % 2 else "s"} for i in range(n)]


@pytest.fixture
def apps(platform, s3_server, tmp_path, monkeypatch):
    monkeypatch.setenv("LAKEHOUSE_S3_ENDPOINT_URL", s3_server.endpoint_url)
    bucket = s3_server.new_bucket("extract")
    f = tmp_path / "apps.yaml"
    f.write_text(APPS.format(bucket=bucket))
    platform.store.apply(load_metadata(f))
    return platform, s3_server.client(), bucket


def key(wf: str, run: str, typename: str, n: int = 0) -> str:
    return f"artifacts/apps/redshift/workflows/{wf}/{run}/raw/{typename}/chunk-{n}.parquet"


def test_registry_creates_exact_schema_and_rejects_unknown(apps):
    platform, _, _ = apps
    created = entity_raw.ensure_all_tables(platform)
    assert created == ["entity_raw.redshift", "entity_raw.snowflake"]  # not the disabled one
    assert entity_raw.ensure_all_tables(platform) == []  # idempotent
    table = pycat(platform).load_table("entity_raw.redshift")
    got = [(f.name, str(f.field_type), f.required) for f in table.schema().fields]
    assert got == [("typename", "string", True), ("connection_qualified_name", "string", True),
                   ("workflow_id", "string", True), ("workflow_run_id", "string", True),
                   ("extracted_at", "long", True), ("tenant_id", "string", True),
                   ("entity_name", "string", False), ("raw_record", "string", True)]
    spec = table.spec()
    assert [(p.name, str(p.transform)) for p in spec.fields] == [("typename", "identity")]

    with pytest.raises(entity_raw.UnknownApplication) as exc:
        entity_raw.load(platform, {"application": "mysql", "tenant_id": "acme", "file_keys": ["x.parquet"]})
    assert "'mysql'" in str(exc.value) and "valid applications: redshift, snowflake" in str(exc.value)
    with pytest.raises(entity_raw.UnknownApplication):
        entity_raw.ensure_table(platform, "retired_app")
    assert not pycat(platform).table_exists("entity_raw.mysql")
    with pytest.raises(ValidationError, match="at least one of file_keys or patterns"):
        entity_raw.LoadRequest(application="redshift", tenant_id="acme")


def test_load_hostile_columns_tenants_upsert_and_join(apps):
    platform, client, bucket = apps
    rows_r1 = raw_rows("r1", 4)
    client.put_object(Bucket=bucket, Key=key("wf1", "r1", "table"), Body=parquet_bytes(rows_r1))
    client.put_object(Bucket=bucket, Key=key("wf1", "r1", "column"),
                      Body=parquet_bytes([{"column_name": "id", "table_name": "orders_0", "pos": 1}]))
    client.put_object(Bucket=bucket, Key=key("wf1", "r1", "table", 9), Body=b"PAR1 this is not parquet")

    res = entity_raw.load(platform, {"application": "REDSHIFT", "tenant_id": "acme",
                                     "patterns": ["artifacts/apps/redshift/workflows/wf1/r1/raw/*/*.parquet"],
                                     "extracted_at": 1_700_000_000_123})
    assert res.rows_written == 5 and res.files_loaded == 2
    assert [q["key"] for q in res.quarantined] == [key("wf1", "r1", "table", 9)]
    assert res.metadata()["quarantined_files"] == 1
    spark = platform.spark()
    t = platform.tables().read("entity_raw.redshift")
    assert t.columns == list(entity_raw.COLUMNS)
    got = t.where("typename = 'table'").orderBy("entity_name").collect()
    assert [r["entity_name"] for r in got] == [f"orders_{i}" for i in range(4)]
    assert {(r["workflow_id"], r["workflow_run_id"], r["tenant_id"], r["extracted_at"],
             r["connection_qualified_name"]) for r in got} == {
        ("wf1", "r1", "acme", 1_700_000_000_123, "default/redshift/1700000000")}
    # raw_record is the whole source row: hostile names survive as plain JSON keys, nothing executed
    assert [json.loads(r["raw_record"]) for r in got] == [
        {k: v for k, v in row.items() if v is not None} for row in rows_r1]
    col = t.where("typename = 'column'").collect()
    assert [r["entity_name"] for r in col] == ["id"]
    assert pycat(platform).table_exists("entity_raw.redshift")  # nothing was dropped

    # the same files for another tenant are that tenant's rows; a rerun for acme loads nothing
    entity_raw.load(platform, {"application": "redshift", "tenant_id": "globex",
                               "file_keys": [key("wf1", "r1", "table")], "extracted_at": 1})
    again = entity_raw.load(platform, {"application": "redshift", "tenant_id": "acme",
                                       "patterns": ["artifacts/apps/redshift/workflows/wf1/r1/raw/*/*.parquet"]})
    assert again.rows_written == 0 and again.files_skipped == 3
    counts = {r["tenant_id"]: r["n"] for r in t.groupBy("tenant_id").count().withColumnRenamed("count", "n").collect()}
    assert counts == {"acme": 5, "globex": 4}

    # UPSERT: the next extraction replaces acme's (connection, table) rows, and only those
    client.put_object(Bucket=bucket, Key=key("wf1", "r2", "table"), Body=parquet_bytes(raw_rows("r2", 2)))
    up = entity_raw.load(platform, {"application": "redshift", "tenant_id": "acme", "mode": "upsert",
                                    "file_keys": [key("wf1", "r2", "table")]})
    assert up.rows_written == 2
    t = platform.tables().read("entity_raw.redshift")
    acme = t.where("tenant_id = 'acme'")
    assert sorted((r["typename"], r["workflow_run_id"]) for r in acme.collect()) == [
        ("column", "r1"), ("table", "r2"), ("table", "r2")]
    assert t.where("tenant_id = 'globex'").count() == 4

    # raw-to-transformed join on connection_qualified_name, workflow_run_id and typename
    spark.createDataFrame(
        [("default/redshift/1700000000", "r2", "table", "orders_0"),
         ("default/redshift/1700000000", "r2", "table", "orders_1"),
         ("default/redshift/1700000000", "r1", "column", "id"),
         ("default/redshift/other", "r2", "table", "orders_0")],
        "connectionqualifiedname string, lastsyncrun string, typename string, name string",
    ).createOrReplaceTempView("entity_metadata_table")
    t.createOrReplaceTempView("raw_view")
    joined = spark.sql(
        "SELECT m.name, r.entity_name, get_json_object(r.raw_record, '$.table_name') AS raw_name "
        "FROM entity_metadata_table m JOIN raw_view r ON r.connection_qualified_name = m.connectionqualifiedname "
        "AND r.workflow_run_id = m.lastsyncrun AND r.typename = m.typename WHERE r.tenant_id = 'acme'"
    ).collect()
    assert sorted((j["name"], j["entity_name"]) for j in joined) == [
        ("id", "id"), ("orders_0", "orders_0"), ("orders_0", "orders_1"), ("orders_1", "orders_0"),
        ("orders_1", "orders_1")]


def test_asset_sensor_and_schedule(apps, tmp_path):
    from lakehouse.cli import main as cli_main
    from lakehouse_assets.definitions import build_definitions

    platform, client, bucket = apps
    assert cli_main(["metadata", "apply", str(tmp_path / "apps.yaml")]) == 0  # apply creates the tables
    assert pycat(platform).table_exists("entity_raw.snowflake")
    defs = build_definitions(platform)  # loading the definitions creates nothing
    graph = defs.resolve_asset_graph()
    node = graph.get(dg.AssetKey(["entity_raw", "redshift"]))
    assert node.group_name == "entity_raw"
    assert dg.AssetKey(["entity_raw", "snowflake"]) in graph.get_all_asset_keys()
    sched = defs.get_schedule_def("entity_raw_tables__every_10_minutes")
    assert sched.cron_schedule == "*/10 * * * *"

    client.put_object(Bucket=bucket, Key=key("wf7", "r7", "table"), Body=parquet_bytes(raw_rows("r7", 3)))
    sensor = defs.get_sensor_def("entity_raw__redshift__arrivals")
    instance = dg.DagsterInstance.ephemeral()
    tick = evaluate_tick(sensor, defs, instance=instance, cursor=None)
    assert len(tick.run_requests) == 1
    req = tick.run_requests[0]
    job = defs.resolve_implicit_global_asset_job_def()
    result = job.execute_in_process(instance=instance, tags=req.tags,
                                    asset_selection=[dg.AssetKey(["entity_raw", "redshift"])])
    assert result.success
    md = result.get_asset_materialization_events()[0].materialization.metadata
    assert md["rows_written"].value == 3 and md["table"].value == "entity_raw.redshift"
    rows = platform.tables().read("entity_raw.redshift").collect()
    assert {(r["tenant_id"], r["workflow_run_id"]) for r in rows} == {("acme", "r7")}
    # next tick: nothing new (StartAfter the cursor)
    tick2 = evaluate_tick(sensor, defs, instance=instance, cursor=tick.cursor)
    assert not tick2.run_requests
    # the 10-minute tick creates the table of an application registered since start-up (no run)
    from lakehouse.metadata.model import Application

    platform.store.upsert([Application(application_id="bigquery")])
    sched_tick = evaluate_tick(sched, defs, instance=instance)
    assert not sched_tick.run_requests and "entity_raw.bigquery" in sched_tick.skip_message
    assert pycat(platform).table_exists("entity_raw.bigquery")
    # the kill switch on the source stops the sensor with a reason
    platform.store.set_enabled("source", "redshift_extract", False)
    tick3 = evaluate_tick(sensor, defs, instance=instance, cursor=tick.cursor)
    assert not tick3.run_requests and "disabled" in tick3.skip_message


def test_cli_rejects_unknown_application(settings, tmp_path, capsys):
    from lakehouse.cli import main as cli_main
    from lakehouse.metadata.store import MetadataStore

    f = tmp_path / "apps.yaml"
    f.write_text(APPS.format(bucket="unused-bucket"))
    MetadataStore(settings.control_db_url).apply(load_metadata(f))
    assert cli_main(["entity-raw", "load", "mysql", "--tenant", "acme", "--file-key", "a.parquet"]) == 2
    err = capsys.readouterr().err
    assert "unknown application 'mysql'" in err and "valid applications: redshift, snowflake" in err
    assert cli_main(["entity-raw", "load", "redshift", "--tenant", "acme"]) == 2
    assert "at least one of file_keys or patterns" in capsys.readouterr().err
