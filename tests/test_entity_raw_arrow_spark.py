"""entity_raw loads and the warehouse export on the Arrow engine against Spark (slow: Spark runs one side).

* The same raw parquet records (many types, nested values, hostile names, NULLs, an oversized record)
  loaded once by each engine give the same entity_raw table and quarantine table, read by PyIceberg
  and by DuckDB, which is neither writer: rows (raw_record text included), schema, partition spec,
  snapshot summary keys.
* One table loaded turn and turn about (Spark, Arrow, an Arrow UPSERT over Spark's rows, Spark again)
  holds every record once.
* The same published table exported by each engine gives the same warehouse rows and column types.
"""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lakehouse.metadata.loader import load_metadata
from lakehouse.metadata.model import Target
from lakehouse.stage import entity_raw
from tests.test_pipeline_e2e import duckdb_read
from tests.test_wap_helpers import pyiceberg, rows_of

pytestmark = pytest.mark.slow

META = """
sources:
  - source_id: app_extract
    kind: files
    format: parquet
    path: extractions/app
    glob: "*.parquet"
    options: {tenant_id: acme, connection_qualified_name: "default/postgres/1"}
applications:
  - {application_id: by_spark, source_id: app_extract, engine: spark, max_record_bytes: 700,
     entity_name_fields: {table: table_name, column: pos, view: view_name}}
  - {application_id: by_arrow, source_id: app_extract, engine: arrow, max_record_bytes: 700,
     entity_name_fields: {table: table_name, column: pos, view: view_name}}
  - {application_id: turns, source_id: app_extract, engine: ENGINE}
"""


def apply(platform, tmp_path, turns_engine: str = "spark") -> None:
    path = tmp_path / "apps.yaml"
    path.write_text(META.replace("ENGINE", turns_engine))
    platform.store.apply(load_metadata(path))


def land(platform, key: str, table: pa.Table) -> str:
    path = platform.settings.landing_dir / "extractions" / "app" / key
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return key


def typed_rows() -> pa.Table:
    ts = [dt.datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=dt.UTC), None, dt.datetime(1999, 12, 31, tzinfo=dt.UTC)]
    return pa.table({
        "table_name": ["orders", None, "o'quote\"d"],
        "x'); DROP TABLE t; --": pa.array([1, None, -7], pa.int32()),
        "a`b": [1.5, 1e20, float("nan")], "f32": pa.array([1.1, None, 3.4e38], pa.float32()),
        "dec": pa.array([Decimal("1.50"), Decimal("-0.01"), None], pa.decimal128(10, 2)),
        "ts": pa.array(ts, pa.timestamp("us", tz="UTC")),
        "ntz": pa.array([dt.datetime(2026, 1, 2, 3, 4, 5, 120000), None, None], pa.timestamp("us")),
        "day": pa.array([dt.date(2026, 1, 2), None, dt.date(1970, 1, 1)], pa.date32()),
        "ok": [True, False, None], "bin": pa.array([b"\x00\x01ab", None, b""], pa.binary()),
        "st": pa.array([{"x": 1, "y": None}, None, {"x": None, "y": "é\n\t/€\x01"}],
                       pa.struct([("x", pa.int64()), ("y", pa.string())])),
        "arr": pa.array([[1, None, 3], [], None], pa.list_(pa.int64())),
        "m": pa.array([[("k", 1), ("n", None)], None, []], pa.map_(pa.string(), pa.int64())),
        "big": ["short", "y" * 800, "also short"],  # the second record is over max_record_bytes
    })


def view(cat, ident: str) -> dict:
    t = cat.load_table(ident)
    summary = t.current_snapshot().summary.additional_properties
    return {"schema": str(t.schema()),
            "spec": [(t.schema().find_column_name(f.source_id), str(f.transform), f.name) for f in t.spec().fields],
            "rows": sorted(t.scan().to_arrow().to_pylist(), key=lambda r: (r["typename"], r["raw_record"])),
            "summary_keys": sorted(k for k in summary if k.startswith("lakehouse.")),
            "files": sorted(f["key"] for f in json.loads(summary["lakehouse.files"])),
            "mode": summary["lakehouse.mode"], "tenant": summary["lakehouse.tenant_id"]}


def test_both_engines_load_the_same_entity_raw_table(platform, tmp_path):
    apply(platform, tmp_path)
    keys = [land(platform, "wf1/r1/raw/table/chunk-0.parquet", typed_rows()),
            land(platform, "wf1/r1/raw/column/chunk-0.parquet",
                 pa.table({"column_name": ["id", "name"], "pos": pa.array([1, 2], pa.int16())}))]
    legacy = platform.settings.landing_dir / "extractions" / "app" / "wf1/r1/raw/view/chunk-0.parquet"
    legacy.parent.mkdir(parents=True)  # legacy INT96 timestamps: instants to Spark
    pq.write_table(pa.table({"view_name": ["v"], "at": pa.array([dt.datetime(2026, 1, 2, 3, 4, 5, 6000)],
                                                                pa.timestamp("us"))}),
                   legacy, use_deprecated_int96_timestamps=True)
    keys.append("wf1/r1/raw/view/chunk-0.parquet")
    results = {}
    for app in ("by_spark", "by_arrow"):
        results[app] = entity_raw.load(platform, {"application": app, "tenant_id": "acme", "file_keys": keys,
                                                  "extracted_at": 1_700_000_000_123}, run_id=f"run_{app}")
    assert results["by_spark"].engine == "spark" and results["by_arrow"].engine == "arrow"
    assert results["by_arrow"].records_quarantined == results["by_spark"].records_quarantined == 1
    assert results["by_arrow"].rows_written == results["by_spark"].rows_written == 5
    cat = pyiceberg(platform)
    by_spark, by_arrow = view(cat, "entity_raw.by_spark"), view(cat, "entity_raw.by_arrow")
    assert by_arrow == by_spark
    assert [r["entity_name"] for r in by_arrow["rows"]] == ["1", "2", "o'quote\"d", "orders", "v"]  # CAST(pos AS string) too
    assert by_arrow["rows"][-1]["raw_record"] == '{"view_name":"v","at":"2026-01-02T03:04:05.006Z"}'
    seen = [duckdb_read(cat.load_table(f"entity_raw.{a}").metadata_location.removeprefix("file://"),
                        "SELECT * FROM {table} ORDER BY typename, raw_record") for a in ("by_spark", "by_arrow")]
    assert seen[0] == seen[1] and len(seen[0]) == 5

    def quarantine(app):
        rows = rows_of(platform, f"entity_raw.{app}__quarantine")
        return [{k: v for k, v in r.items() if k not in ("run_id", "quarantined_at")} for r in rows]
    assert quarantine("by_arrow") == quarantine("by_spark") and len(quarantine("by_arrow")) == 1
    assert str(cat.load_table("entity_raw.by_arrow__quarantine").schema()) == \
        str(cat.load_table("entity_raw.by_spark__quarantine").schema())


def test_one_table_loaded_turn_and_turn_about(platform, tmp_path):
    def batch(run: str, n: int) -> pa.Table:
        return pa.table({"table_name": [f"t{i}" for i in range(n)], "run": [run] * n})

    order = [("spark", "APPEND", "r1", 3), ("arrow", "APPEND", "r2", 2), ("arrow", "UPSERT", "r3", 4),
             ("spark", "APPEND", "r4", 1)]
    for engine, mode, run, n in order:
        apply(platform, tmp_path, turns_engine=engine)
        k = land(platform, f"wf/{run}/raw/table/chunk-0.parquet", batch(run, n))
        res = entity_raw.load(platform, {"application": "turns", "tenant_id": "acme", "file_keys": [k], "mode": mode},
                              run_id=f"turn_{run}")
        assert res.engine == engine and res.rows_written == n
    rows = rows_of(platform, "entity_raw.turns")
    # r1 and r2 were replaced by the UPSERT of r3 (same tenant, connection and typename); r4 appended
    assert sorted(json.loads(r["raw_record"])["run"] for r in rows) == ["r3"] * 4 + ["r4"]
    assert set(pyiceberg(platform).load_table("entity_raw.turns").metadata.refs) == {"main"}


def test_both_engines_export_the_same_warehouse_rows(platform, postgres_server, monkeypatch, unique_ns):
    from psycopg2 import sql

    from lakehouse.engines.types import iceberg_to_spark
    from lakehouse.export import warehouse

    dbname = postgres_server.create_database()
    monkeypatch.setenv("WH_USER", postgres_server.user)
    monkeypatch.setenv("WH_PASSWORD", postgres_server.password)
    spark = platform.spark()
    ident = f"{unique_ns}.gold"
    tables = platform.tables()
    tables.ensure_namespace(unique_ns)
    spark.sql(f"CREATE TABLE {tables.qualified(ident)} USING iceberg AS SELECT * FROM VALUES "
              "(1, 'north', CAST(1.25 AS decimal(10,2)), DATE'2024-03-01', TIMESTAMP'2024-03-01 10:00:00.123456', "
              " TIMESTAMP_NTZ'2024-03-01 10:00:00', 1.5D, CAST(2.5 AS float), true, X'0001', "
              " named_struct('a', 1, 'b', CAST(NULL AS string)), array(1, 2), map('k', 1), CAST(1 AS smallint)), "
              "(2, NULL, NULL, NULL, NULL, NULL, CAST('NaN' AS double), NULL, NULL, NULL, NULL, NULL, NULL, NULL) "
              "AS t(id, region, amount, sold, at, at_ntz, d, f, ok, bin, st, arr, m, small)")
    snap = pyiceberg(platform).load_table(ident).current_snapshot().snapshot_id
    df = spark.read.format("iceberg").option("snapshot-id", str(snap)).load(tables.qualified(ident))
    table = pyiceberg(platform).load_table(ident)
    data = table.scan(snapshot_id=snap).to_arrow()
    targets = {e: Target(target_id=f"wh_{e}", kind="warehouse", jdbc_url=postgres_server.jdbc_url(dbname),
                         user_env="WH_USER", password_env="WH_PASSWORD", warehouse_table=f"by_{e}")
               for e in ("spark", "arrow")}
    by_spark = warehouse.export_frame(spark, df, targets["spark"], "r1", expected_rows=2)
    by_arrow = warehouse.export_arrow(data, iceberg_to_spark(table.schema()), targets["arrow"], "r2", expected_rows=2)
    assert by_arrow.columns == by_spark.columns and by_arrow.rows == by_spark.rows == 2

    c = postgres_server.connect(dbname)
    try:
        got = {}
        with c.cursor() as cur:
            for e in ("spark", "arrow"):
                cur.execute(sql.SQL("SELECT * FROM {} ORDER BY id").format(sql.Identifier("public", f"by_{e}")))
                got[e] = [tuple(bytes(v) if isinstance(v, memoryview) else "NaN" if v != v else v for v in r)
                          for r in cur.fetchall()]  # NaN == NaN for the comparison
                cur.execute("SELECT column_name, data_type FROM information_schema.columns WHERE table_name = %s "
                            "ORDER BY ordinal_position", (f"by_{e}",))
                got[e + "_types"] = cur.fetchall()
    finally:
        c.close()
    assert got["arrow"] == got["spark"], (got["arrow"], got["spark"])
    assert got["arrow_types"] == got["spark_types"]
    assert got["arrow"][0][10] == '{"a":1}' and got["arrow"][0][9] == b"\x00\x01" and got["arrow"][1][6] == "NaN"
