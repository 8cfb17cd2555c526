"""entity_raw loads and the warehouse export's reads on the Arrow engine (issue 21), fast lane: the
autouse guard in conftest fails any of these tests that starts a JVM, so "no JVM" is checked.
The comparison with Spark is in tests/test_entity_raw_arrow_spark.py (slow)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lakehouse.engines import choice as engines
from lakehouse.engines.arrow.to_json import java_double, to_json_rows
from lakehouse.metadata.loader import load_metadata
from lakehouse.metadata.model import Application, Rule
from lakehouse.metadata.store import MetadataStore
from lakehouse.platform import Platform
from lakehouse.stage import entity_raw
from lakehouse.stage.core import AuditFailed
from lakehouse.stage.runner import StageRunner
from tests.test_wap_helpers import pyiceberg, rows_of

#: column names a load must neither break on nor paste anywhere
HOSTILE = ["table_name", "x'); DROP TABLE entity_raw.app; --", "a`b", 'quo"te', "dotted.name", "sp ace"]

META = """
sources:
  - source_id: app_extract
    kind: files
    format: parquet
    path: extractions/app
    glob: "*.parquet"
    options: {tenant_id: acme, connection_qualified_name: "default/postgres/1"}
applications:
  - {application_id: app, source_id: app_extract, engine: ENGINE, max_record_bytes: 400, validation_set_id: raw_rules}
validation_rules:
  - rule_set_id: raw_rules
    rules:
      - {name: has_rows, type: row_count, min: MIN_ROWS}
      - {name: named, type: not_null, columns: [entity_name], severity: warn}
"""


@pytest.fixture
def lake(settings):
    """A platform with no SparkSession behind it (the fast lane has none)."""
    return Platform(settings, MetadataStore(settings.control_db_url))


def apply(platform, tmp_path, engine="arrow", min_rows=1):
    path = tmp_path / "apps.yaml"
    path.write_text(META.replace("ENGINE", engine).replace("MIN_ROWS", str(min_rows)))
    platform.store.apply(load_metadata(path))


def raw_rows(run: str, n: int) -> list[dict]:
    return [{"table_name": f"orders_{i}", HOSTILE[1]: f"v{i}", "a`b": i, 'quo"te': f"q{run}",
             "dotted.name": float(i) / 2, "sp ace": None if i % 2 else "s"} for i in range(n)]


def land(platform, key: str, rows: list[dict]) -> str:
    path = platform.settings.landing_dir / "extractions" / "app" / key
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return key


def test_arrow_entity_raw_load_append_cap_upsert_and_rerun(lake, tmp_path):
    apply(lake, tmp_path)
    k1 = land(lake, "wf1/r1/raw/table/chunk-0.parquet", raw_rows("r1", 4))
    k2 = land(lake, "wf1/r1/raw/column/chunk-0.parquet",
              [{"column_name": "id", "table_name": "orders_0", "pos": 1, "ddl": "x" * 500}])
    res = entity_raw.load(lake, {"application": "app", "tenant_id": "acme", "file_keys": [k1, k2],
                                 "extracted_at": 1_700_000_000_123}, run_id="load1")
    assert (res.engine, res.engine_reason) == ("arrow", "application app engine is arrow")
    md = res.metadata()
    assert md["engine"] == "arrow" and md["engine_reason"] == "application app engine is arrow"
    assert res.files_loaded == 2 and res.rows_written == 4 and res.records_quarantined == 1
    logged = lake.store.audit_entries(run_id="load1", event="entity_raw_load")
    assert logged[0].details["engine"] == "arrow"  # the run's record says which engine ran and why

    rows = sorted(rows_of(lake, "entity_raw.app"), key=lambda r: r["entity_name"])
    assert [r["entity_name"] for r in rows] == ["orders_0", "orders_1", "orders_2", "orders_3"]
    first = rows[0]
    assert {k: first[k] for k in ("typename", "workflow_id", "workflow_run_id", "extracted_at", "tenant_id",
                                   "connection_qualified_name")} == {
        "typename": "table", "workflow_id": "wf1", "workflow_run_id": "r1", "extracted_at": 1_700_000_000_123,
        "tenant_id": "acme", "connection_qualified_name": "default/postgres/1"}
    # Spark's to_json spelling: hostile names kept verbatim, NULL fields left out, doubles as Java prints them
    assert first["raw_record"] == ('{"table_name":"orders_0","x\'); DROP TABLE entity_raw.app; --":"v0","a`b":0,'
                                   '"quo\\"te":"qr1","dotted.name":0.0,"sp ace":"s"}')
    assert json.loads(rows[1]["raw_record"]) == {k: v for k, v in raw_rows("r1", 4)[1].items() if v is not None}

    q = rows_of(lake, "entity_raw.app__quarantine")  # the oversized column record, whole, with its key
    assert [(r["file_key"], r["row_index"], r["typename"], r["max_record_bytes"]) for r in q] == [(k2, 0, "column", 400)]
    assert json.loads(q[0]["raw_record"])["ddl"] == "x" * 500

    table = pyiceberg(lake).load_table("entity_raw.app")
    assert set(table.metadata.refs) == {"main"}  # published, the audit branch dropped
    props = table.current_snapshot().summary.additional_properties
    assert props["lakehouse.run_id"] == "load1" and props["lakehouse.mode"] == "APPEND"
    keys = sorted(f["key"] for f in json.loads(props["lakehouse.files"]))  # tenant|location+key, as on Spark
    assert len(keys) == 2 and all(k.startswith("acme|") for k in keys) and keys[0].endswith(k2) and keys[1].endswith(k1)

    # the same files again: skipped by their checkpoints, nothing written
    again = entity_raw.load(lake, {"application": "app", "tenant_id": "acme", "file_keys": [k1, k2]}, run_id="load2")
    assert again.files_skipped == 2 and again.rows_written == 0
    assert len(rows_of(lake, "entity_raw.app")) == 4

    # UPSERT of a new extraction of the table typename: replaces acme's table rows, keeps the rest
    k3 = land(lake, "wf1/r2/raw/table/chunk-0.parquet", raw_rows("r2", 2))
    up = entity_raw.load(lake, {"application": "app", "tenant_id": "acme", "file_keys": [k3], "mode": "upsert"},
                         run_id="load3")
    assert up.engine == "arrow" and up.rows_written == 2
    after = rows_of(lake, "entity_raw.app")
    assert sorted((r["workflow_run_id"], r["entity_name"]) for r in after) == [("r2", "orders_0"), ("r2", "orders_1")]
    assert set(pyiceberg(lake).load_table("entity_raw.app").metadata.refs) == {"main"}


def test_arrow_entity_raw_failed_audit_keeps_branch_and_never_touches_main(lake, tmp_path):
    apply(lake, tmp_path, min_rows=100)
    k1 = land(lake, "wf1/r1/raw/table/chunk-0.parquet", raw_rows("r1", 3))
    with pytest.raises(AuditFailed) as err:
        entity_raw.load(lake, {"application": "app", "tenant_id": "acme", "file_keys": [k1]}, run_id="bad")
    table = pyiceberg(lake).load_table("entity_raw.app")
    assert err.value.branch in table.metadata.refs
    assert rows_of(lake, "entity_raw.app") == []
    assert len(rows_of(lake, "entity_raw.app", err.value.branch)) == 3


def test_arrow_entity_raw_switched_off_during_the_load_publishes_nothing(lake, tmp_path, monkeypatch):
    """The kill switch read again before the publish: the target flipped off while the rows were on
    the branch drops the branch (PyIceberg: no JVM) and reports the load skipped."""
    from lakehouse.engines.arrow.write import ArrowAuditedWrite

    apply(lake, tmp_path)
    k1 = land(lake, "wf1/r1/raw/table/chunk-0.parquet", raw_rows("r1", 2))
    audit = ArrowAuditedWrite.audit

    def audit_then_switch_off(self):
        out = audit(self)
        lake.store.set_enabled("target", "entity_raw.app", False)
        return out
    monkeypatch.setattr(ArrowAuditedWrite, "audit", audit_then_switch_off)
    res = entity_raw.load(lake, {"application": "app", "tenant_id": "acme", "file_keys": [k1]}, run_id="off")
    assert res.engine == "arrow" and res.skipped_reason and "entity_raw.app" in res.skipped_reason
    assert res.files_loaded == 0
    assert rows_of(lake, "entity_raw.app") == []
    assert set(pyiceberg(lake).load_table("entity_raw.app").metadata.refs) == {"main"}


def test_platform_default_auto_loads_a_small_extraction_on_arrow(lake, tmp_path):
    path = tmp_path / "apps.yaml"
    path.write_text(META.replace("ENGINE", "null").replace("MIN_ROWS", "1") + """
platform_settings:
  - {setting_key: engine.default, setting_value: auto}
""")
    lake.store.apply(load_metadata(path))
    k1 = land(lake, "wf1/r1/raw/table/chunk-0.parquet", raw_rows("r1", 3))
    size = (lake.settings.landing_dir / "extractions" / "app" / k1).stat().st_size
    res = entity_raw.load(lake, {"application": "app", "tenant_id": "acme", "file_keys": [k1]}, run_id="auto1")
    assert res.engine == "arrow" and res.rows_written == 3
    assert res.engine_reason == f"auto: {size} bytes of files <= 150000000 (platform default)"


def test_engine_choice_for_applications(lake, tmp_path):
    apply(lake, tmp_path, engine="auto")
    cat = lake.store.load()
    app = cat.application("app")
    rules = cat.rule_set("raw_rules").rules
    small = engines.choose_for_application(cat, app, rules, 1000)
    assert small.engine == "arrow" and small.reason.startswith("auto: 1000 bytes of files <= 150000000")
    tight = app.model_copy(update={"arrow_max_bytes": 10})
    assert engines.choose_for_application(cat, tight, rules, 1000).reason == \
        "auto: 1000 bytes of files > 10 (application app arrow_max_bytes)"
    spark_rule = [Rule(name="custom", type="schema_contract", expected_columns=[{"name": "ts", "type": "timestamp"}])]
    fallback = engines.choose_for_application(cat, app, spark_rule, 10)
    assert fallback.engine == "spark" and "rule type(s) schema_contract are evaluated by Spark" in fallback.reason
    with pytest.raises(ValueError, match="application app asks for engine arrow.*rule type"):
        engines.choose_for_application(cat, app.model_copy(update={"engine": "arrow"}), spark_rule, 10)
    daily = engines.choose_for_application(cat, app.model_copy(update={"partition_by_day": True}), rules, 10)
    assert daily.engine == "spark" and "partition_by_day (PyIceberg writes a truncate partition only with " \
        "pyiceberg-core" in daily.reason
    plain = Application(application_id="plain")
    assert engines.choose_for_application(cat, plain, [], 10).reason == "built-in default is spark"


def test_engine_arrow_on_an_application_it_cannot_load_is_refused_on_validation(lake, tmp_path):
    from lakehouse.metadata.loader import MetadataError

    path = tmp_path / "apps.yaml"
    path.write_text(META.replace("ENGINE", "arrow").replace("MIN_ROWS", "1").replace(
        "- {name: named, type: not_null, columns: [entity_name], severity: warn}",
        "- {name: custom, type: expression, expression: \"my_udf(raw_record) > 2\"}"))
    with pytest.raises(MetadataError, match=r"apps.yaml: applications\[0\].engine: application 'app' asks for engine "
                                            r"arrow, which cannot load its entity_raw table: rule 'custom': expression "
                                            r"'my_udf\(raw_record\) > 2' is evaluated by Spark \(function\(s\) my_udf"):
        load_metadata(path)
    path.write_text(path.read_text().replace("engine: arrow", "engine: auto"))
    assert load_metadata(path).catalog.application("app").engine == "auto"


def test_java_number_spelling():
    assert [java_double(x) for x in (1.5, 1e20, 1e-4, 1e7, 123456.789, 0.001, 9999999.0, -2.5e-300, 100.0)] == \
        ["1.5", "1.0E20", "1.0E-4", "1.0E7", "123456.789", "0.001", "9999999.0", "-2.5E-300", "100.0"]
    t = pa.table({"f": pa.array([1.1], pa.float32()), "n": [float("nan")], "m": pa.array([[("k", None)]],
                 pa.map_(pa.string(), pa.int64()))})
    assert to_json_rows(t, t.column_names).to_pylist() == ['{"f":1.1,"n":"NaN","m":{"k":null}}']


EXPORT_META = """
pipelines:
  - {pipeline_id: sales}
sources:
  - {source_id: sales_files, kind: files, format: jsonl, path: sales, glob: "*.jsonl"}
targets:
  - {target_id: gold_sales, namespace: gold, table: sales, engine: ENGINE, export_target_id: wh_sales,
     partition_spec: [{column: region}]}
  - {target_id: wh_sales, kind: warehouse, jdbc_url: "JDBC", user_env: WH_USER, password_env: WH_PASSWORD,
     warehouse_schema: "Report%ing", warehouse_table: "sales by region"}
stages:
  - {pipeline_id: sales, stage_order: 1, stage_name: load, layer: gold, source_id: sales_files, target_id: gold_sales}
"""


def sales_rows() -> list[dict]:
    return [{"id": i, "region": ["north", "south"][i % 2], "amount": i * 1.25, "sold": f"2024-03-0{1 + i % 5}",
             "tags": {"ch": "web" if i % 3 else None, "n": i}, "note": None if i % 4 else "it's \"quoted\""}
            for i in range(1, 8)]


def apply_export(platform, tmp_path, jdbc: str, engine: str = "arrow") -> None:
    path = tmp_path / "export.yaml"
    path.write_text(EXPORT_META.replace("ENGINE", engine).replace("JDBC", jdbc))
    platform.store.apply(load_metadata(path))
    out = platform.settings.landing_dir / "sales"
    out.mkdir(parents=True, exist_ok=True)
    (out / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sales_rows()))


def wh_rows(postgres_server, dbname: str, schema: str, table: str) -> tuple[list[tuple], dict]:
    from psycopg2 import sql

    c = postgres_server.connect(dbname)
    try:
        with c.cursor() as cur:
            cur.execute(sql.SQL("SELECT * FROM {} ORDER BY 1").format(sql.Identifier(schema, table)))
            rows = cur.fetchall()
            cur.execute("SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = %s "
                        "AND table_name = %s ORDER BY ordinal_position", (schema, table))
            return rows, dict(cur.fetchall())
    finally:
        c.close()


def test_arrow_stage_exports_to_the_warehouse_without_a_jvm(lake, tmp_path, postgres_server, monkeypatch):
    dbname = postgres_server.create_database()
    monkeypatch.setenv("WH_USER", postgres_server.user)
    monkeypatch.setenv("WH_PASSWORD", postgres_server.password)
    apply_export(lake, tmp_path, postgres_server.jdbc_url(dbname))
    runner = StageRunner(lake, "sales", "load", "exp1")
    out = runner.load(runner.extract())
    assert out.published and out.extra["engine"] == "arrow"
    assert out.extra["export_engine"] == "arrow" and out.extra["export_rows"] == 7
    assert out.extra["export_engine_reason"] == "target gold_sales engine is arrow"
    rows, types = wh_rows(postgres_server, dbname, "Report%ing", "sales by region")
    gold = sorted(rows_of(lake, "gold.sales"), key=lambda r: r["id"])
    names = list(types)
    assert [dict(zip(names, r, strict=True))["id"] for r in rows] == [g["id"] for g in gold]
    by_id = {r[names.index("id")]: dict(zip(names, r, strict=True)) for r in rows}
    assert by_id[4]["note"] == "it's \"quoted\"" and by_id[1]["amount"] == 1.25
    assert json.loads(by_id[3]["tags"]) == {"n": 3}  # nested as Spark's to_json: NULL fields left out
    assert by_id[1]["_ingested_at"] == gold[0]["_ingested_at"]
    assert types["id"] == "bigint" and types["tags"] == "text" and types["_ingested_at"] == "timestamp with time zone"
    logged = lake.store.audit_entries(run_id="exp1", event="exported")
    assert logged[0].details["export_engine"] == "arrow" and logged[0].details["export_rows"] == 7

    # streamed in batches (3 rows here) into the same staging-and-swap path: the same rows
    from lakehouse.engines.types import iceberg_to_spark
    from lakehouse.export import warehouse

    gold_table = pyiceberg(lake).load_table("gold.sales")
    wh = lake.catalog().target("wh_sales")
    schema = iceberg_to_spark(gold_table.schema())
    again = warehouse.export_arrow(gold_table.scan().to_arrow_batch_reader(), schema, wh, "exp2", batch_rows=3)
    assert again.rows == 7 and again.replaced
    assert wh_rows(postgres_server, dbname, "Report%ing", "sales by region") == (rows, types)
    # a count that does not match the snapshot's: the live table stays as it was, no staging table left
    with pytest.raises(warehouse.WarehouseExportError, match="staging table has 7 rows but the Iceberg snapshot has 8"):
        warehouse.export_arrow(gold_table.scan().to_arrow(), schema, wh, "exp3", expected_rows=8)
    assert wh_rows(postgres_server, dbname, "Report%ing", "sales by region") == (rows, types)
