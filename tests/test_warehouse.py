"""Gold export to the warehouse (PostgreSQL standing in for Redshift): staging table + atomic swap."""

from __future__ import annotations

import threading
import time
from decimal import Decimal

import pytest
from psycopg2 import sql

from lakehouse.export import warehouse
from lakehouse.metadata.model import Target
from tests.test_jdbc import apply_yaml, iceberg_rows, pipeline_doc, run_job, src_db  # noqa: F401 - fixture


def _wh_rows(db, schema: str, table: str, order: str) -> list[dict]:
    c = db.connect()
    try:
        with c.cursor() as cur:
            cur.execute(sql.SQL("SELECT * FROM {} ORDER BY {}").format(sql.Identifier(schema, table), sql.Identifier(order)))
            names = [d[0] for d in cur.description]
            return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    finally:
        c.close()


class _Db:
    def __init__(self, server, name, user, password):
        self.server, self.name, self.user, self.password = server, name, user, password

    def connect(self):
        import psycopg2

        return psycopg2.connect(host=self.server.host, port=self.server.port, dbname=self.name,
                                user=self.user, password=self.password)


def test_gold_export_after_publish_through_the_job(platform, src_db, tmp_path, postgres_server):  # noqa: F811
    src_db.execute("CREATE TABLE sales (id int PRIMARY KEY, region text, amount numeric(10,2), sold date)")
    src_db.execute("INSERT INTO sales SELECT g, (ARRAY['north','south','east'])[1 + g % 3], g * 0.25, "
                   "DATE '2024-03-01' + g % 5 FROM generate_series(1, 900) g")
    doc = pipeline_doc(
        src_db, {"table": "sales"}, {"table": "sales", "write_mode": "overwrite"},
        extra_targets=[
            {"target_id": "gold_region", "namespace": "gold", "table": "region_sales", "write_mode": "overwrite",
             "export_target_id": "wh_region"},
            {"target_id": "wh_region", "kind": "warehouse", "jdbc_url": src_db.url, "user_env": "SRC_DB_USER",
             "password_env": "SRC_DB_PASSWORD", "warehouse_schema": "Reporting", "warehouse_table": "region sales"},
        ],
        extra_stages=[{"pipeline_id": "db_etl", "stage_order": 2, "stage_name": "gold", "layer": "gold",
                       "target_id": "gold_region",
                       "transformation": "SELECT region, count(*) AS orders, sum(amount) AS revenue, "
                                         "max(sold) AS last_sold, collect_set(id % 2) AS parities "
                                         "FROM bronze.sales GROUP BY region"}],
    )
    apply_yaml(platform, tmp_path, doc)
    result = run_job(platform, "db_etl")
    assert result.success, [str(e) for e in result.all_events if e.is_failure]

    db = _Db(postgres_server, src_db.name, src_db.user, src_db.password)
    got = _wh_rows(db, "Reporting", "region sales", "region")
    gold = iceberg_rows(platform, "gold.region_sales", key="region")
    assert [(r["region"], r["orders"], r["revenue"]) for r in got] == \
        [(r["region"], r["orders"], r["revenue"]) for r in gold]
    assert sum(r["orders"] for r in got) == 900 and got[0]["region"] == "east"
    assert got[0]["revenue"] == sum(Decimal(g) * Decimal("0.25") for g in range(1, 901) if g % 3 == 2)
    # columns typed from the Iceberg schema
    c = db.connect()
    with c.cursor() as cur:
        cur.execute("SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = %s "
                    "AND table_name = %s ORDER BY ordinal_position", ("Reporting", "region sales"))
        types = dict(cur.fetchall())
        cur.execute("SELECT count(*) FROM information_schema.tables WHERE table_name LIKE %s", ("%\\_\\_lh\\_%",))
        leftovers = cur.fetchone()[0]
    c.close()
    assert types == {"region": "text", "orders": "bigint", "revenue": "numeric", "last_sold": "date", "parities": "text"}
    assert leftovers == 0  # staging / old tables are gone

    mats = {e.asset_key.to_user_string(): e.materialization.metadata for e in result.get_asset_materialization_events()}
    md = mats["gold/region_sales"]
    assert md["export_rows"].value == 3
    assert md["export_table"].value == "Reporting.region sales"
    assert md["export_duration_s"].value > 0
    assert src_db.password not in str(mats)
    events = platform.store.audit_entries(event="exported")
    assert events and events[-1].details["export_rows"] == 3

    # a second run replaces the table (new data), still one table with the new rows
    src_db.execute("INSERT INTO sales VALUES (5000, 'west', 10, DATE '2024-04-01')")
    assert run_job(platform, "db_etl").success
    assert [r["region"] for r in _wh_rows(db, "Reporting", "region sales", "region")] == ["east", "north", "south", "west"]


def test_swap_is_atomic_for_a_concurrent_reader(platform, postgres_server, monkeypatch):
    """A reader polling the table during repeated exports only ever sees a complete old or new table."""
    dbname = postgres_server.create_database()
    monkeypatch.setenv("WH_USER", postgres_server.user)
    monkeypatch.setenv("WH_PASSWORD", postgres_server.password)
    target = Target(target_id="wh", kind="warehouse", jdbc_url=postgres_server.jdbc_url(dbname), user_env="WH_USER",
                    password_env="WH_PASSWORD", warehouse_schema="public", warehouse_table="facts")
    spark = platform.spark()
    small = spark.range(0, 20_000).selectExpr("id", "id * 2 AS v", "'old' AS tag").repartition(2)
    big = spark.range(0, 60_000).selectExpr("id", "id * 3 AS v", "'new' AS tag").repartition(2)
    states = {(20_000, sum(i * 2 for i in range(20_000)), "old"), (60_000, sum(i * 3 for i in range(60_000)), "new")}

    warehouse.export_frame(spark, small, target, "run0")
    seen: list = []
    errors: list = []
    stop = threading.Event()

    def reader():
        c = postgres_server.connect(dbname)
        c.autocommit = True
        try:
            while not stop.is_set():
                try:
                    with c.cursor() as cur:
                        cur.execute("SELECT count(*), sum(v), min(tag) FROM public.facts")
                        n, s, tag = cur.fetchone()
                        seen.append((n, int(s), tag))
                except Exception as exc:  # noqa: BLE001 - any error is a failure of atomicity
                    errors.append(repr(exc))
                time.sleep(0.002)
        finally:
            c.close()

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(4):
            warehouse.export_frame(spark, big if i % 2 == 0 else small, target, f"run{i + 1}")
    finally:
        stop.set()
        t.join()
    assert not errors, errors[:3]
    assert len(seen) > 20
    assert set(seen) <= states, set(seen) - states
    assert {tag for _, _, tag in seen} == {"old", "new"}  # the reader really saw both sides of a swap


def test_failed_export_leaves_the_live_table_untouched(platform, postgres_server, monkeypatch):
    dbname = postgres_server.create_database()
    monkeypatch.setenv("WH_USER", postgres_server.user)
    monkeypatch.setenv("WH_PASSWORD", postgres_server.password)
    target = Target(target_id="wh", kind="warehouse", jdbc_url=postgres_server.jdbc_url(dbname), user_env="WH_USER",
                    password_env="WH_PASSWORD", warehouse_table="t")
    spark = platform.spark()
    warehouse.export_frame(spark, spark.range(0, 10).selectExpr("id"), target, "a")
    with pytest.raises(warehouse.WarehouseExportError, match="staging table has 5 rows but the Iceberg snapshot has 6"):
        warehouse.export_frame(spark, spark.range(0, 5).selectExpr("id"), target, "b", expected_rows=6)
    c = postgres_server.connect(dbname)
    with c.cursor() as cur:
        cur.execute("SELECT count(*) FROM public.t")
        assert cur.fetchone()[0] == 10
        cur.execute("SELECT count(*) FROM information_schema.tables WHERE table_name LIKE 't\\_\\_lh%'")
        assert cur.fetchone()[0] == 0
    c.close()
    monkeypatch.setenv("WH_PASSWORD", "wrong-" + postgres_server.password[:4])
    with pytest.raises(warehouse.WarehouseExportError, match="cannot connect") as err:
        warehouse.export_frame(spark, spark.range(0, 5).selectExpr("id"), target, "c")
    assert "wrong-" not in str(err.value)


def test_type_mapping_for_redshift_and_postgres():
    from pyspark.sql import types as T

    assert warehouse.column_type(T.StringType(), "redshift") == "varchar(65535)"
    assert warehouse.column_type(T.StringType(), "postgresql") == "text"
    assert warehouse.column_type(T.DecimalType(12, 3), "redshift") == "numeric(12,3)"
    assert warehouse.column_type(T.TimestampType(), "postgresql") == "timestamptz"
    assert warehouse.column_type(T.TimestampNTZType(), "redshift") == "timestamp"
    assert warehouse.column_type(T.LongType(), "redshift") == "bigint"
