"""entity_raw options from seed 000's open questions: partitioning by the day of extracted_at besides
typename, and a size cap on raw_record — a record over it is quarantined whole with its key, never
loaded truncated, and a load retried after a failure quarantines nothing twice."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from lakehouse.metadata.loader import load_metadata
from lakehouse.metadata.model import Application
from lakehouse.stage import entity_raw, entity_raw_cap

META = """
sources:
  - source_id: app_extract
    kind: files
    format: parquet
    path: extractions/app
    glob: "*.parquet"
    options: {tenant_id: acme, connection_qualified_name: "default/postgres/1"}
applications:
  - {application_id: capped, source_id: app_extract, partition_by_day: true, max_record_bytes: 300}
  - {application_id: plain, source_id: app_extract}
"""
EXTRACTED_AT = 1_700_000_000_123  # 2023-11-14T22:13:20.123Z
DAY_START = 1_699_920_000_000  # 2023-11-14T00:00:00Z


@pytest.fixture
def apps(platform, tmp_path):
    f = tmp_path / "apps.yaml"
    f.write_text(META)
    platform.store.apply(load_metadata(f))
    return platform


def pycat(platform) -> SqlCatalog:
    s = platform.settings
    return SqlCatalog(s.catalog_name, uri=s.catalog_uri, warehouse=s.warehouse)


@pytest.mark.slow
def test_day_partitioning_and_the_record_cap(apps, monkeypatch):
    platform = apps
    root = platform.settings.landing_dir / "extractions" / "app"
    key = "wf1/run1/raw/table/chunk-0.parquet"
    (root / key).parent.mkdir(parents=True)
    rows = [{"table_name": f"t{i}", "ddl": ("x" * 1000 if i in (1, 3) else "short"), "pos": i} for i in range(5)]
    pq.write_table(pa.Table.from_pylist(rows), root / key)
    request = {"application": "capped", "tenant_id": "acme", "file_keys": [key], "extracted_at": EXTRACTED_AT}

    # a load that fails after quarantining (as a crash between the two would): nothing is lost
    real_commit = entity_raw._commit

    def fail_commit(*args, **kwargs):
        raise RuntimeError("catalog went away")

    monkeypatch.setattr(entity_raw, "_commit", fail_commit)
    with pytest.raises(RuntimeError, match="catalog went away"):
        entity_raw.load(platform, request)
    monkeypatch.setattr(entity_raw, "_commit", real_commit)
    res = entity_raw.load(platform, request)  # the retry
    assert (res.rows_written, res.records_quarantined, res.files_loaded) == (3, 2, 1)
    assert res.metadata()["records_quarantined_in"] == "entity_raw.capped__quarantine"

    cat = pycat(platform)
    table = cat.load_table("entity_raw.capped")
    assert [(f.name, str(f.transform)) for f in table.spec().fields] == [
        ("typename", "identity"), ("extracted_day", "truncate[86400000]")]
    loaded = table.scan().to_arrow().to_pylist()
    assert sorted(json.loads(r["raw_record"])["pos"] for r in loaded) == [0, 2, 4]  # none truncated in
    parts = {(p["partition"]["typename"], p["partition"]["extracted_day"])
             for p in table.inspect.partitions().to_pylist()}
    assert parts == {("table", DAY_START)}

    q = cat.load_table("entity_raw.capped__quarantine").scan().to_arrow().to_pylist()
    assert len(q) == 2  # quarantined once, although the first attempt had already written them
    by_row = {r["row_index"]: r for r in q}
    assert sorted(by_row) == [1, 3]  # the key: file, etag and row of each record
    for i, r in by_row.items():
        assert (r["file_key"], r["tenant_id"], r["typename"], r["entity_name"]) == (key, "acme", "table", f"t{i}")
        assert r["file_etag"] and r["record_bytes"] > 300 and r["max_record_bytes"] == 300
        assert json.loads(r["raw_record"]) == rows[i]  # whole, not truncated
        assert len(r["raw_record"].encode()) == r["record_bytes"]
    quarantined = [e for e in platform.store.audit_entries(event="entity_raw_load")]
    assert quarantined[-1].details["records_quarantined"] == 2

    # an existing table gets the day partition when its application turns the option on
    entity_raw.ensure_table(platform, "plain")
    assert [f.name for f in cat.load_table("entity_raw.plain").spec().fields] == ["typename"]
    platform.store.upsert([Application(application_id="plain", source_id="app_extract", partition_by_day=True)])
    entity_raw.ensure_table(platform, "plain")
    assert [f.name for f in cat.load_table("entity_raw.plain").spec().fields] == ["typename", "extracted_day"]
    assert entity_raw_cap.quarantine_identifier("entity_raw.plain") == "entity_raw.plain__quarantine"


def test_day_partition_without_spark(settings, tmp_path, monkeypatch):
    """The start-up path (no JVM in the process): PyIceberg creates and evolves the spec."""
    from lakehouse.metadata.store import MetadataStore
    from lakehouse.runtime import spark as spark_mod
    from lakehouse.stage.runner import Platform

    monkeypatch.setattr(spark_mod, "_SESSION", None)
    f = tmp_path / "apps.yaml"
    f.write_text(META)
    platform = Platform(settings, MetadataStore(settings.control_db_url))
    platform.store.apply(load_metadata(f))
    assert entity_raw.ensure_all_tables(platform) == ["entity_raw.capped", "entity_raw.plain"]
    cat = pycat(platform)
    spec = cat.load_table("entity_raw.capped").spec()
    assert [(f.name, str(f.transform)) for f in spec.fields] == [
        ("typename", "identity"), ("extracted_day", "truncate[86400000]")]
    platform.store.upsert([Application(application_id="plain", source_id="app_extract", partition_by_day=True)])
    entity_raw.ensure_table(platform, "plain")
    entity_raw.ensure_table(platform, "plain")  # once added, it is not added again
    assert [f.name for f in cat.load_table("entity_raw.plain").spec().fields] == ["typename", "extracted_day"]


RULED = META + """  - {application_id: ruled, source_id: app_extract, validation_set_id: raw_rules}
validation_rules:
  - rule_set_id: raw_rules
    rules:
      - {name: entity_named, type: not_null, columns: [entity_name], severity: error}
"""


@pytest.mark.slow
def test_entity_raw_load_goes_through_write_audit_publish(platform, tmp_path, monkeypatch):
    """An entity_raw load is audited with its application's rules and re-reads the kill switch
    right before publishing (lakehouse.stage.wap_service), like every stage load."""
    from lakehouse.stage.core import AuditFailed
    from lakehouse.stage.wap_service import WriteAuditPublish

    f = tmp_path / "apps.yaml"
    f.write_text(RULED)
    platform.store.apply(load_metadata(f))
    root = platform.settings.landing_dir / "extractions" / "app"
    good, bad = "wf1/run1/raw/table/good.parquet", "wf1/run1/raw/table/bad.parquet"
    (root / good).parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([{"table_name": "t1"}, {"table_name": "t2"}]), root / good)
    pq.write_table(pa.Table.from_pylist([{"table_name": "t3"}, {"table_name": None}]), root / bad)

    def request(key):
        return {"application": "ruled", "tenant_id": "acme", "file_keys": [key], "extracted_at": EXTRACTED_AT}

    # the source is switched off after the audit passed, before the publish: nothing reaches main
    record = WriteAuditPublish.record_checks

    def flip_after_audit(self, checks):
        record(self, checks)
        platform.store.set_enabled("source", "app_extract", False, by="test")

    monkeypatch.setattr(WriteAuditPublish, "record_checks", flip_after_audit)
    res = entity_raw.load(platform, request(good))
    assert res.skipped_reason and "app_extract" in res.skipped_reason and res.files_loaded == 0
    table = pycat(platform).load_table("entity_raw.ruled")
    # main holds only the empty snapshot a new table branches from; the audit branch is dropped too
    assert len(table.scan().to_arrow()) == 0 and list(table.metadata.refs) == ["main"]

    monkeypatch.setattr(WriteAuditPublish, "record_checks", record)
    platform.store.set_enabled("source", "app_extract", True, by="test")
    res = entity_raw.load(platform, request(good))  # the files were not checkpointed: loaded now
    assert res.files_loaded == 1 and res.rows_written == 2
    assert [(c.rule.name, c.passed) for c in res.checks] == [("entity_named", True)]
    published = pycat(platform).load_table("entity_raw.ruled").current_snapshot().snapshot_id

    with pytest.raises(AuditFailed, match="entity_named"):  # a row without an entity name fails the rule
        entity_raw.load(platform, request(bad))
    table = pycat(platform).load_table("entity_raw.ruled")
    assert table.current_snapshot().snapshot_id == published and len(table.scan().to_arrow()) == 2
