"""JDBC sources against a real PostgreSQL server, through the Dagster job, real Spark and Iceberg."""

from __future__ import annotations

import json
import logging
import pickle
import secrets
from datetime import datetime, timedelta
from decimal import Decimal

import dagster as dg
import pytest
import yaml
from pyiceberg.catalog.sql import SqlCatalog

from lakehouse.control import faults
from lakehouse.ingest import jdbc
from lakehouse.metadata.loader import load_metadata
from lakehouse.stage.runner import StageRunner

T0 = datetime(2024, 1, 1)


# --------------------------------------------------------------------------- helpers


@pytest.fixture
def src_db(postgres_server, monkeypatch):
    """A fresh source database; credentials only in env vars (a distinctive password to hunt for)."""
    name = postgres_server.create_database()
    password = "Pw-" + secrets.token_hex(12)
    role = "reader_" + secrets.token_hex(4)
    conn = postgres_server.connect(name)
    conn.autocommit = True
    with conn.cursor() as cur:
        from psycopg2 import sql

        cur.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD %s").format(sql.Identifier(role)), (password,))
        cur.execute(sql.SQL("GRANT ALL ON SCHEMA public TO {}").format(sql.Identifier(role)))
        cur.execute(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(sql.Identifier(name), sql.Identifier(role)))
    conn.close()
    monkeypatch.setenv("SRC_DB_USER", role)
    monkeypatch.setenv("SRC_DB_PASSWORD", password)

    class Db:
        pass

    db = Db()
    db.name, db.password, db.user = name, password, role
    db.url = postgres_server.jdbc_url(name)

    def execute(statement, params=None):
        c = _connect(postgres_server, name, role, password)
        try:
            with c, c.cursor() as cur:
                cur.execute(statement, params)
                return cur.fetchall() if cur.description else None
        finally:
            c.close()

    db.execute = execute
    return db


def _connect(server, dbname, user, password):
    import psycopg2

    return psycopg2.connect(host=server.host, port=server.port, dbname=dbname, user=user, password=password)


def apply_yaml(platform, tmp_path, doc: dict, name: str = "jdbc.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    platform.store.apply(load_metadata(path))


def run_job(platform, pipeline_id: str, instance=None):
    from lakehouse_assets.definitions import build_definitions, pipeline_job

    defs = build_definitions(platform)
    job = pipeline_job(defs, pipeline_id)
    return job.execute_in_process(instance=instance or dg.DagsterInstance.ephemeral(), raise_on_error=False)


def iceberg_rows(platform, identifier: str, key: str = "id") -> list[dict]:
    s = platform.settings
    cat = SqlCatalog(s.catalog_name, uri=s.catalog_uri, warehouse=s.warehouse)
    return sorted(cat.load_table(identifier).scan().to_arrow().to_pylist(), key=lambda r: (r[key] is None, r[key]))


def source_rows(db, table: str, key: str = "id") -> list[dict]:
    c = _connect_db(db)
    try:
        with c.cursor() as cur:
            from psycopg2 import sql

            cur.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(table)))
            names = [d[0] for d in cur.description]
            rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    finally:
        c.close()
    return sorted(rows, key=lambda r: (r[key] is None, r[key]))


_SERVER = {}


def _connect_db(db):
    return _connect(_SERVER["s"], db.name, db.user, db.password)


@pytest.fixture(autouse=True)
def _remember_server(postgres_server):
    _SERVER["s"] = postgres_server


def pipeline_doc(db, source: dict, target: dict, pipeline_id: str = "db_etl", stage: str = "ingest",
                 extra_stages: list | None = None, extra_targets: list | None = None) -> dict:
    src = {"source_id": source.pop("source_id", "pg_src"), "kind": "jdbc", "jdbc_url": db.url,
           "user_env": "SRC_DB_USER", "password_env": "SRC_DB_PASSWORD", **source}
    tgt = {"target_id": target.pop("target_id", "bronze_t"), "namespace": "bronze", **target}
    return {
        "pipelines": [{"pipeline_id": pipeline_id}],
        "sources": [src],
        "targets": [tgt, *(extra_targets or [])],
        "stages": [{"pipeline_id": pipeline_id, "stage_order": 1, "stage_name": stage, "layer": "bronze",
                    "source_id": src["source_id"], "target_id": tgt["target_id"]}, *(extra_stages or [])],
    }


def snapshot_summaries(platform, identifier: str) -> list[dict]:
    tables = platform.tables()
    rows = tables.spark.sql(f"SELECT snapshot_id, summary FROM {tables.metadata_table(identifier, 'snapshots')}").collect()
    return [dict(r["summary"]) for r in rows]


# --------------------------------------------------------------------------- unit-level


def test_fixture_server_is_real_and_isolated(postgres_server):
    a, b = postgres_server.create_database(), postgres_server.create_database()
    assert a != b
    c = postgres_server.connect(a)
    with c.cursor() as cur:
        cur.execute("SHOW server_version")
        assert cur.fetchone()[0].startswith("15")
        cur.execute("SHOW listen_addresses")
        assert cur.fetchone()[0] == "127.0.0.1"
    c.close()
    assert postgres_server.jdbc_url(a).endswith(f":{postgres_server.port}/{a}")


def test_quoting_and_literals_never_paste_raw_text():
    d = jdbc.dialect_for("jdbc:postgresql://h/db")
    assert d.quote('we"ird') == '"we""ird"'
    assert d.quote_path('public."a.b"') == '"public"."a.b"'
    assert jdbc.dialect_for("jdbc:sqlserver://h;databaseName=x").quote("a]b") == "[a]]b]"
    assert jdbc.dialect_for("jdbc:mysql://h/db").quote("a`b") == "`a``b`"
    assert d.literal(datetime(2024, 5, 6, 7, 8, 9, 10)) == "TIMESTAMP '2024-05-06 07:08:09.000010'"
    with pytest.raises(jdbc.JdbcSourceError, match="unsupported"):
        d.literal("1; DROP TABLE x")
    preds = jdbc.range_predicates(d, "k", [10, 20])
    assert preds == ['"k" < 10 OR "k" IS NULL', '"k" >= 10 AND "k" < 20', '"k" >= 20']
    with pytest.raises(jdbc.JdbcSourceError, match="malformed"):
        d.quote_path('a."b')


def test_credentials_by_reference_and_clear_errors(monkeypatch):
    from lakehouse.metadata.model import Source

    with pytest.raises(ValueError, match="must not carry a password"):
        Source(source_id="s", kind="jdbc", jdbc_url="jdbc:postgresql://h/db?password=x", table="t")
    monkeypatch.delenv("NOPE_PW", raising=False)
    src = Source(source_id="s", kind="jdbc", jdbc_url="jdbc:postgresql://h/db", table="t", password_env="NOPE_PW")
    with pytest.raises(jdbc.JdbcSourceError, match="'NOPE_PW' \\(password_env\\) is not set"):
        jdbc.JdbcConnection.for_source(src)
    monkeypatch.setenv("NOPE_PW", "hunter2")
    conn = jdbc.JdbcConnection.for_source(src)
    assert "hunter2" not in repr(conn) and "hunter2" not in pickle.dumps(conn).decode("latin-1")
    assert conn.properties()["password"] == "hunter2"
    assert conn.scrub("auth failed for hunter2") == "auth failed for ***"


def test_skew_estimate_prefers_quantiles_only_when_skewed():
    # uniform CDF: Spark's stride ranges are balanced
    cdf = [(0.0, 0.0), (25.0, 0.25), (50.0, 0.5), (75.0, 0.75), (100.0, 1.0)]
    assert max(jdbc.estimate_shares(jdbc.uniform_edges(0, 100, 4), cdf)) == pytest.approx(0.25)
    # 75% of rows below 1 of 100: one stride range would hold most of the table
    skew = [(0.0, 0.0), (0.2, 0.25), (0.5, 0.5), (1.0, 0.75), (100.0, 1.0)]
    assert max(jdbc.estimate_shares(jdbc.uniform_edges(0, 100, 4), skew)) > 0.75
    assert max(jdbc.estimate_shares([0.2, 0.5, 1.0], skew)) == pytest.approx(0.25)


# --------------------------------------------------------------------------- full load


def test_full_load_replaces_bronze_atomically_and_never_leaks_the_password(platform, src_db, tmp_path, caplog):
    src_db.execute("CREATE TABLE customers (id int PRIMARY KEY, name text, balance numeric(12,2), seen date)")
    src_db.execute("INSERT INTO customers SELECT g, 'c' || g, g * 1.5, DATE '2024-01-01' + g FROM generate_series(1, 300) g")
    apply_yaml(platform, tmp_path, pipeline_doc(src_db, {"table": "public.customers", "load_type": "full"},
                                                {"table": "customers", "write_mode": "overwrite"}))
    instance = dg.DagsterInstance.ephemeral()
    result = run_job(platform, "db_etl", instance)
    assert result.success, result.all_events
    got = iceberg_rows(platform, "bronze.customers")
    assert got == source_rows(src_db, "customers")
    assert len(got) == 300 and got[0]["balance"] == Decimal("1.50")

    # the source changes: deletes, updates, inserts -> bronze is replaced, not appended to
    src_db.execute("DELETE FROM customers WHERE id <= 100")
    src_db.execute("UPDATE customers SET name = 'changed' WHERE id % 7 = 0")
    src_db.execute("INSERT INTO customers VALUES (1000, 'new', 1, NULL)")
    caplog.set_level(logging.DEBUG)  # py4j logs every JVM command at DEBUG: the password must be scrubbed
    result2 = run_job(platform, "db_etl", instance)
    caplog.set_level(logging.WARNING)
    assert result2.success
    assert iceberg_rows(platform, "bronze.customers") == source_rows(src_db, "customers")
    summaries = snapshot_summaries(platform, "bronze.customers")
    assert any(s.get("lakehouse.jdbc.source") == "pg_src" for s in summaries)

    # the password appears nowhere we keep or show
    pw = src_db.password
    plan = result2.output_for_node("bronze__customers.bronze__customers__extract")
    assert plan.kind == "jdbc"
    assert pw.encode() not in pickle.dumps(plan)
    assert pw not in json.dumps(summaries)
    assert pw not in json.dumps([e.model_dump(mode="json") for e in platform.store.audit_entries()])
    mats = [e.materialization.metadata for e in result2.get_asset_materialization_events()]
    assert mats and pw not in str(mats)
    assert pw not in str([r.message for r in caplog.records])
    assert pw not in str([e.message for e in instance.all_logs(result2.run_id)])
    # nothing staged is left behind after publish
    assert not any((platform.settings.staging_dir / "jdbc" / "pg_src").glob("*/*.parquet"))


def _apply_behind_validation(platform, tmp_path, doc: dict) -> None:
    """`metadata apply` refuses the write mode (tests/test_static_checks.py); an operator's plain-SQL
    edit of the control DB gets past it, and the extract still refuses to run."""
    from lakehouse.metadata.loader import MetadataError
    from lakehouse.metadata.model import Target

    with pytest.raises(MetadataError, match="targets\\[0\\].write_mode"):
        apply_yaml(platform, tmp_path, doc)
    bad = Target(**doc["targets"][0])
    doc["targets"][0] = {**doc["targets"][0], "write_mode": "merge", "merge_keys": doc["sources"][0].get(
        "primary_key") or ["id"]}
    apply_yaml(platform, tmp_path, doc)
    platform.store.upsert([bad])


def test_wrong_write_mode_for_full_load_is_a_clear_error(platform, src_db, tmp_path):
    src_db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    _apply_behind_validation(platform, tmp_path, pipeline_doc(src_db, {"table": "t"},
                                                              {"table": "t", "write_mode": "append"}))
    with pytest.raises(jdbc.JdbcSourceError, match="full load but target 'bronze_t' has write_mode 'append'"):
        StageRunner(platform, "db_etl", "ingest").extract()


# --------------------------------------------------------------------------- incremental


def _events_source(src_db, platform, tmp_path, **extra):
    src_db.execute("CREATE TABLE events (id bigint PRIMARY KEY, val text, n int, updated_at timestamp NOT NULL)")
    apply_yaml(platform, tmp_path, pipeline_doc(
        src_db,
        {"table": "events", "load_type": "incremental", "primary_key": ["id"], "watermark_column": "updated_at",
         "watermark_type": "timestamp", **extra},
        {"table": "events", "write_mode": "merge", "merge_keys": ["id"]},
    ))


def _insert(src_db, ids, at):
    for i in ids:
        src_db.execute("INSERT INTO events VALUES (%s, %s, %s, %s)", (i, f"v{i}", i, at))


def _update(src_db, ids, at, val):
    src_db.execute("UPDATE events SET val = %s, n = n + 1000, updated_at = %s WHERE id = ANY(%s)", (val, at, list(ids)))


def _assert_bronze_equals_source(platform, src_db):
    got = iceberg_rows(platform, "bronze.events")
    assert len({r["id"] for r in got}) == len(got), "duplicate keys in bronze"
    assert got == source_rows(src_db, "events")
    return got


def test_incremental_three_rounds_merge_updates_and_commit_watermark(platform, src_db, tmp_path):
    _events_source(src_db, platform, tmp_path)
    instance = dg.DagsterInstance.ephemeral()
    _insert(src_db, range(1, 51), T0)
    assert run_job(platform, "db_etl", instance).success
    assert len(_assert_bronze_equals_source(platform, src_db)) == 50

    _insert(src_db, range(51, 71), T0 + timedelta(hours=1))
    _update(src_db, range(1, 11), T0 + timedelta(hours=1), "late")
    r2 = run_job(platform, "db_etl", instance)
    assert r2.success
    got = _assert_bronze_equals_source(platform, src_db)
    assert len(got) == 70 and sum(r["val"] == "late" for r in got) == 10
    md = r2.get_asset_materialization_events()[0].materialization.metadata
    assert md["source_rows_read"].value == 30  # only the window was read: 20 new + 10 updated
    assert md["watermark"].value == str(T0 + timedelta(hours=1))

    _insert(src_db, range(71, 76), T0 + timedelta(hours=2))
    _update(src_db, [1, 60, 70], T0 + timedelta(hours=2), "later")
    assert run_job(platform, "db_etl", instance).success
    got = _assert_bronze_equals_source(platform, src_db)
    assert len(got) == 75
    assert {r["id"]: r["n"] for r in got if r["val"] == "later"} == {1: 2001, 60: 1060, 70: 1070}

    # the watermark is a property of main's head snapshot
    tables = platform.tables()
    head = tables.snapshot_summary("bronze.events", tables.snapshot_id("bronze.events"))
    assert jdbc.decode_watermark(head[jdbc.WATERMARK_PROPERTY]) == T0 + timedelta(hours=2)

    # nothing new: skipped, no new snapshot
    before = tables.snapshot_id("bronze.events")
    r4 = run_job(platform, "db_etl", instance)
    assert r4.success and tables.snapshot_id("bronze.events") == before
    # nothing changed: no materialization, an observation saying why (issue 39, item 3)
    assert not r4.get_asset_materialization_events()
    obs = r4.get_asset_observation_events()[0].asset_observation_data.asset_observation
    assert "no new rows" in obs.metadata["skipped_reason"].value


def test_crash_between_read_and_commit_loses_and_doubles_nothing(platform, src_db, tmp_path, monkeypatch):
    _events_source(src_db, platform, tmp_path)
    instance = dg.DagsterInstance.ephemeral()
    _insert(src_db, range(1, 41), T0)
    assert run_job(platform, "db_etl", instance).success
    tables = platform.tables()
    head = tables.snapshot_id("bronze.events")

    _insert(src_db, range(41, 61), T0 + timedelta(minutes=5))
    _update(src_db, range(1, 6), T0 + timedelta(minutes=5), "upd")
    monkeypatch.setenv(faults.AFTER_JDBC_READ_ENV, "pg_src")
    crashed = run_job(platform, "db_etl", instance)
    assert not crashed.success
    assert "injected fault" in str(crashed.all_events)
    assert tables.snapshot_id("bronze.events") == head  # nothing committed to main
    assert len(iceberg_rows(platform, "bronze.events")) == 40

    # more changes arrive while the pipeline is down, then a clean rerun
    _insert(src_db, range(61, 66), T0 + timedelta(minutes=10))
    _update(src_db, [41, 42], T0 + timedelta(minutes=10), "upd2")
    monkeypatch.delenv(faults.AFTER_JDBC_READ_ENV)
    assert run_job(platform, "db_etl", instance).success
    got = _assert_bronze_equals_source(platform, src_db)
    assert len(got) == 65
    assert sum(r["val"] == "upd" for r in got) == 5 and sum(r["val"] == "upd2" for r in got) == 2

    # and a crash after a rerun of the same window still converges (MERGE is idempotent)
    monkeypatch.setenv(faults.AFTER_JDBC_READ_ENV, "*")
    _update(src_db, [2], T0 + timedelta(minutes=20), "x")
    assert not run_job(platform, "db_etl", instance).success
    monkeypatch.delenv(faults.AFTER_JDBC_READ_ENV)
    assert run_job(platform, "db_etl", instance).success
    _assert_bronze_equals_source(platform, src_db)


def test_incremental_needs_merge_target(platform, src_db, tmp_path):
    src_db.execute("CREATE TABLE t (id int PRIMARY KEY, u int)")
    _apply_behind_validation(platform, tmp_path, pipeline_doc(
        src_db, {"table": "t", "load_type": "incremental", "primary_key": ["id"], "watermark_column": "u"},
        {"table": "t", "write_mode": "append"}))
    with pytest.raises(jdbc.JdbcSourceError, match="set write_mode: merge"):
        StageRunner(platform, "db_etl", "ingest").extract()


# --------------------------------------------------------------------------- partitioned


def _make_partition_table(src_db, rows: int):
    """id uniform; k skewed (90% of rows in [0, 50), the rest spread to 10^7, 3% null); d dates."""
    src_db.execute(
        "CREATE TABLE facts AS SELECT g AS id, "
        "CASE WHEN g %% 33 = 0 THEN NULL WHEN g %% 10 <> 0 THEN g %% 50 ELSE g * 1000 END AS k, "
        "DATE '2020-01-01' + (g %% 700) AS d, "
        "TIMESTAMP '2024-01-01' + g * INTERVAL '1 minute' AS ts, md5(g::text) AS payload "
        "FROM generate_series(1, %s) g", (rows,))
    src_db.execute("ALTER TABLE facts ADD PRIMARY KEY (id)")
    src_db.execute("ANALYZE facts")


def _plan_for(platform, pipeline_id):
    return StageRunner(platform, pipeline_id, "ingest").extract()


@pytest.mark.parametrize("column,expected_mode,split", [("id", "bounds", "uniform"), ("k", "predicates", "quantile"),
                                                        ("d", "bounds", "uniform"), ("ts", "predicates", "uniform")])
def test_partitioned_load_equals_single_query_load(platform, src_db, tmp_path, column, expected_mode, split):
    _make_partition_table(src_db, 6000)
    apply_yaml(platform, tmp_path, pipeline_doc(
        src_db, {"source_id": "single", "table": "facts"},
        {"target_id": "t_single", "table": "facts_single", "write_mode": "overwrite"}, pipeline_id="single_etl"),
        "single.yaml")
    apply_yaml(platform, tmp_path, pipeline_doc(
        src_db, {"source_id": "parted", "table": "facts", "partitioned": True, "partition_column": column,
                 "partition_size_rows": 1000, "fetchsize": 500},
        {"target_id": "t_parted", "table": "facts_parted", "write_mode": "overwrite"}, pipeline_id="parted_etl"),
        "parted.yaml")
    plan = _plan_for(platform, "parted_etl")
    ranges = plan.details["ranges"]
    assert (ranges["mode"], ranges["split"]) == (expected_mode, split) and ranges["num_partitions"] >= 4
    assert ranges["rows_estimate"] == 6000

    if expected_mode == "predicates":
        # every range's real size, counted in PostgreSQL: none many times larger than the others
        counts = [src_db.execute(f"SELECT count(*) FROM facts WHERE {p}")[0][0] for p in ranges["predicates"]]
        assert sum(counts) == 6000  # nulls included exactly once, no overlap
        assert max(counts) / 6000 <= 2.0 / len(counts)
    if split == "quantile":
        assert ranges["estimated_max_share_uniform"] > 0.8  # what Spark's stride split would have done

    assert run_job(platform, "single_etl").success
    assert run_job(platform, "parted_etl").success
    spark = platform.spark()
    single = platform.tables().read("bronze.facts_single")
    parted = platform.tables().read("bronze.facts_parted")
    assert single.count() == parted.count() == 6000
    assert single.exceptAll(parted).count() == 0 and parted.exceptAll(single).count() == 0
    assert parted.filter("k IS NULL").count() == 6000 // 33
    del spark


def test_partitioned_incremental_applies_the_watermark_to_every_range(platform, src_db, tmp_path):
    _make_partition_table(src_db, 3000)
    apply_yaml(platform, tmp_path, pipeline_doc(
        src_db, {"table": "facts", "load_type": "incremental", "primary_key": ["id"], "watermark_column": "ts",
                 "partitioned": True, "partition_column": "ts", "partition_size_rows": 500},
        {"table": "facts", "write_mode": "merge", "merge_keys": ["id"]}))
    assert run_job(platform, "db_etl").success
    assert len(iceberg_rows(platform, "bronze.facts")) == 3000

    src_db.execute("INSERT INTO facts SELECT g, g % 50, DATE '2021-01-01', TIMESTAMP '2030-01-01' + g * INTERVAL '1 second', "
                   "'new' FROM generate_series(3001, 4200) g")
    src_db.execute("UPDATE facts SET payload = 'upd', ts = TIMESTAMP '2030-06-01' WHERE id <= 700")
    plan = _plan_for(platform, "db_etl")
    assert plan.details["ranges"]["rows_estimate"] == 1900  # only the window, not the table
    assert plan.details["ranges"]["num_partitions"] == 4
    r = run_job(platform, "db_etl")
    assert r.success
    md = r.get_asset_materialization_events()[0].materialization.metadata
    assert md["source_rows_read"].value == 1900 and md["read_ranges"].value.startswith("predicates")
    got = iceberg_rows(platform, "bronze.facts")
    assert got == source_rows(src_db, "facts")
    assert sum(x["payload"] == "upd" for x in got) == 700


def test_query_source_and_hostile_identifiers(platform, src_db, tmp_path):
    src_db.execute('CREATE TABLE "odd ""name""" ("we""ird" int, "a col;--" int, id int PRIMARY KEY)')
    src_db.execute('INSERT INTO "odd ""name""" SELECT g, g, g FROM generate_series(1, 2500) g')
    apply_yaml(platform, tmp_path, pipeline_doc(
        src_db, {"query": 'SELECT id, "a col;--", "a col;--" * 2 AS doubled FROM "odd ""name"""',
                 "partitioned": True, "partition_column": "a col;--", "partition_size_rows": 1000},
        {"table": "odd", "write_mode": "overwrite"}))
    assert run_job(platform, "db_etl").success
    got = iceberg_rows(platform, "bronze.odd")
    assert len(got) == 2500 and all(r["doubled"] == 2 * r["id"] == 2 * r["a col;--"] for r in got)
    # a double quote inside a column name cannot pass Spark's JDBC projection: a clear error, no data
    apply_yaml(platform, tmp_path, pipeline_doc(
        src_db, {"table": 'public."odd ""name"""'}, {"table": "odd", "write_mode": "overwrite"}), "jdbc.yaml")
    with pytest.raises(jdbc.JdbcSourceError, match="contain '\"'.*alias it|rename them with an alias"):
        StageRunner(platform, "db_etl", "ingest").extract()


def test_watermark_on_a_text_column_is_a_clear_error(platform, src_db, tmp_path):
    src_db.execute("CREATE TABLE t (id int PRIMARY KEY, label text)")
    src_db.execute("INSERT INTO t VALUES (1, 'a')")
    apply_yaml(platform, tmp_path, pipeline_doc(
        src_db, {"table": "t", "load_type": "incremental", "primary_key": ["id"], "watermark_column": "label"},
        {"table": "t", "write_mode": "merge", "merge_keys": ["id"]}))
    with pytest.raises(jdbc.JdbcSourceError, match="'label' holds str values; it must be an int, date or timestamp"):
        StageRunner(platform, "db_etl", "ingest").extract()
