"""`lakehouse sql import` of Redshift COPY statements (seed 002): a COPY becomes an S3 source and a
bronze stage; credentials in the statement never reach the metadata; options the platform cannot
honour are errors naming them, the others are notes. End to end: the imported COPY + INSERT run
against a real S3 endpoint (moto_server) and the rows are read back with PyIceberg."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
import yaml

from lakehouse.lineage.sql_import import SqlImportError, import_sql
from lakehouse.metadata.model import MetadataCatalog

SCRIPT = """
CREATE TABLE bronze_user_events (event_id VARCHAR(64), user_id BIGINT, event_type VARCHAR(32),
                                 event_ts TIMESTAMP, amount DECIMAL(10,2));
COPY bronze_user_events FROM 's3://{bucket}/raw/user_events/*.jsonl'
  IAM_ROLE 'arn:aws:iam::123456789012:role/loader' FORMAT AS JSON 'auto' GZIP TIMEFORMAT 'auto';
INSERT INTO silver_user_events
SELECT event_id, user_id, upper(event_type) AS event_type, event_ts, amount
FROM bronze_user_events WHERE event_id IS NOT NULL;
"""


def test_copy_becomes_source_and_bronze_stage_without_credentials():
    sql = SCRIPT.format(bucket="company") + (
        "COPY analytics.orders (id, amount) FROM 's3://company/raw/orders/part' "
        "ACCESS_KEY_ID 'AKIAEXAMPLEKEY' SECRET_ACCESS_KEY 'wJalrXUtnFEMIexamplesecret' CSV IGNOREHEADER 1 MAXERROR 5;")
    res = import_sql(sql, MetadataCatalog(), file_name="seed.sql", dialect="redshift")
    out = res.to_yaml()
    for secret in ("AKIAEXAMPLEKEY", "wJalrXUtnFEMIexamplesecret", "arn:aws:iam"):
        assert secret not in out and all(secret not in n for n in res.notes)
    doc = yaml.safe_load(out)
    src = {s["source_id"]: s for s in doc["sources"]}
    events = src["user_events_s3"]
    assert (events["kind"], events["bucket"], events["prefix"], events["glob"], events["format"]) == (
        "s3", "company", "raw/user_events/", "*.jsonl", "jsonl")
    assert [(c["name"], c["type"]) for c in events["columns"]] == [
        ("event_id", "string"), ("user_id", "bigint"), ("event_type", "string"), ("event_ts", "timestamp"),
        ("amount", "decimal(10,2)")]
    orders = src["orders_s3"]  # Redshift loads every key starting with the prefix
    assert (orders["prefix"], orders["glob"], orders["format"]) == ("raw/orders/", "part*", "csv")
    assert orders.get("csv_header", True) is True  # IGNOREHEADER 1
    stages = {s["stage_name"]: s for s in doc["stages"]}
    assert (stages["user_events"]["layer"], stages["user_events"]["source_id"],
            stages["user_events"]["target_id"]) == ("bronze", "user_events_s3", "bronze_user_events")
    assert stages["orders"]["layer"] == "bronze" and stages["orders"]["target_id"] == "analytics_orders"
    targets = {t["target_id"]: t for t in doc["targets"]}
    assert (targets["bronze_user_events"]["namespace"], targets["bronze_user_events"]["table"]) == (
        "bronze", "user_events")
    assert stages["silver_user_events"]["layer"] == "silver"
    assert "FROM bronze.user_events" in stages["silver_user_events"]["transformation"]
    edges = {(e["from_dataset_id"], e["to_dataset_id"]) for e in doc["dataset_lineage"]}
    assert ("user_events_s3", "bronze_user_events") in edges and ("bronze_user_events", "silver_user_events") in edges
    text = "\n".join(res.notes)
    assert "credentials in the COPY (IAM_ROLE) were not imported" in text
    assert "ACCESS_KEY_ID, SECRET_ACCESS_KEY" in text and "MAXERROR" in text and "TIMEFORMAT" in text


@pytest.mark.parametrize("copy, message", [
    ("COPY t FROM 's3://b/p/x.manifest' MANIFEST JSON 'auto'", "COPY option MANIFEST"),
    ("COPY t FROM 's3://b/p/' CSV DELIMITER '|'", "DELIMITER '|' cannot be imported"),
    ("COPY t FROM 's3://b/p/'", "pipe-delimited text"),
    ("COPY t FROM 's3://b/p/' FORMAT AS JSON 's3://b/jsonpaths.json'", "jsonpaths file"),
    ("COPY t FROM '/local/path' CSV", "only COPY ... FROM 's3://bucket/prefix'"),
    ("COPY t FROM 's3://b/p/' FORMAT AS ORC", "COPY option ORC"),
])
def test_copy_that_cannot_be_honoured_is_an_error_naming_it(copy, message):
    with pytest.raises(SqlImportError) as err:
        import_sql(copy, MetadataCatalog(), file_name="f.sql", dialect="redshift")
    assert "f.sql: statement 1" in str(err.value) and message in str(err.value)


def test_plain_create_table_without_a_copy_is_still_rejected():
    with pytest.raises(SqlImportError, match="statement 1: the statement has no SELECT"):
        import_sql("CREATE TABLE x (a INT)", MetadataCatalog(), file_name="f.sql")


@pytest.mark.slow
def test_imported_copy_runs_end_to_end_on_s3(platform, s3_server, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LAKEHOUSE_S3_ENDPOINT_URL", s3_server.endpoint_url)
    monkeypatch.setenv("LAKEHOUSE_DATAHUB", "off")
    from pyiceberg.catalog.sql import SqlCatalog

    from lakehouse.cli import main as cli
    from lakehouse_assets.definitions import build_definitions, pipeline_job

    bucket = s3_server.new_bucket("company")
    client = s3_server.client()
    rows = [{"event_id": f"e{i}" if i % 10 else None, "user_id": i, "event_type": ["view", "click"][i % 2],
             "event_ts": f"2026-11-0{1 + i % 3} 10:00:00", "amount": f"{i}.25"} for i in range(60)]  # quoted, as exports write decimals
    for part in range(3):
        body = "".join(json.dumps(r) + "\n" for r in rows[part * 20:(part + 1) * 20])
        client.put_object(Bucket=bucket, Key=f"raw/user_events/2026-11-0{part + 1}.jsonl", Body=body.encode())
    client.put_object(Bucket=bucket, Key="raw/user_events/_SUCCESS", Body=b"")
    client.put_object(Bucket=bucket, Key="raw/other/ignored.jsonl", Body=b'{"event_id": "x"}\n')

    sql = tmp_path / "seed.sql"
    sql.write_text(SCRIPT.format(bucket=bucket))
    out = tmp_path / "imported.yaml"
    assert cli(["sql", "import", str(sql), "--dialect", "redshift", "--pipeline", "events_etl", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "note:" in err and "IAM_ROLE" in err and "arn:aws:iam" not in err
    assert cli(["metadata", "apply", str(out)]) == 0
    result = pipeline_job(build_definitions(platform), "events_etl").execute_in_process(
        raise_on_error=False)
    assert result.success

    s = platform.settings
    cat = SqlCatalog(s.catalog_name, uri=s.catalog_uri, warehouse=s.warehouse)
    bronze = cat.load_table("bronze.user_events").scan().to_arrow().to_pylist()
    assert sorted(r["user_id"] for r in bronze) == list(range(60))  # every S3 row once, nothing else
    assert {r["user_id"]: r["amount"] for r in bronze} == {i: Decimal(f"{i}.25") for i in range(60)}
    assert {type(r["event_ts"]).__name__ for r in bronze} == {"datetime"}
    silver = cat.load_table("silver.user_events").scan().to_arrow().to_pylist()
    assert sorted(r["user_id"] for r in silver) == [i for i in range(60) if i % 10]
    assert {r["event_type"] for r in silver} == {"VIEW", "CLICK"}
