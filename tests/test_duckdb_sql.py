"""SQL stages on DuckDB (`sql_engine: duckdb`, lakehouse.sources.duckdb_sql): the demo's silver and gold SQL
give the same tables on DuckDB as on Spark, read by an independent reader (PyIceberg) and checked
against plain Python over the landed files; SQL that does not carry over to DuckDB, or an
incremental DuckDB stage, is refused when the metadata is validated, naming the file and field."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from lakehouse.cli.demo import expected_daily, generate_user_events
from lakehouse.metadata.loader import MetadataError, load_metadata
from lakehouse.sources.duckdb_sql import query_arrow
from lakehouse.sql.parse import duckdb_problem

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "metadata" / "demo"
PIPE = "user_events_etl"

#: the demo's silver and gold SQL once more, on DuckDB, into tables of their own
DUCK = """
targets:
  - {target_id: silver_duck, namespace: silver, table: user_events_duck, write_mode: overwrite,
     partition_spec: [{column: event_ts, transform: day}]}
  - {target_id: gold_duck, namespace: gold, table: daily_user_events_duck, write_mode: overwrite,
     partition_spec: [{column: event_date, transform: identity}]}
stages:
  - {pipeline_id: user_events_etl, stage_order: 4, stage_name: silver_duck, layer: silver, target_id: silver_duck,
     transformation_file: sql/silver_user_events.sql, validation_set_id: silver_events_rules, sql_engine: duckdb}
  - {pipeline_id: user_events_etl, stage_order: 5, stage_name: gold_duck, layer: gold, target_id: gold_duck,
     transformation_file: sql/gold_daily_user_events.sql, validation_set_id: gold_daily_rules, sql_engine: duckdb}
"""


def _demo_with(tmp_path: Path, extra: str, sql: dict[str, str] | None = None) -> Path:
    d = tmp_path / "meta"
    for p in DEMO.rglob("*"):
        if p.is_file():
            (d / p.relative_to(DEMO)).parent.mkdir(parents=True, exist_ok=True)
            (d / p.relative_to(DEMO)).write_text(p.read_text())
    for name, text in (sql or {}).items():
        (d / "sql" / name).write_text(text)
    (d / "duck.yaml").write_text(extra)
    return d


# --------------------------------------------------------------------------- fast lane


def test_demo_sql_on_duckdb_equals_plain_python_over_the_landed_files(tmp_path):
    """The demo's silver then gold SQL on DuckDB over Arrow tables of the landed records (bronze as
    Spark would write it: rows with an id, `_source_file` / `_ingested_at`) give the gold an
    independent computation gives, and keep the latest record per event_id."""
    landed = tmp_path / "landing"
    generate_user_events(landed, rows=3000, files=3)
    rows = []
    for i, p in enumerate(sorted(landed.glob("*.jsonl"))):
        for line in p.read_text().splitlines():
            r = json.loads(line)
            rows.append({**{k: r[k] for k in ("event_id", "user_id", "event_type", "event_ts", "country")},
                         "device": r["context"]["device"], "_source_file": str(p), "_ingested_at": i})
    bronze = pa.Table.from_pylist([r for r in rows if r["event_id"] is not None])
    silver = query_arrow((DEMO / "sql" / "silver_user_events.sql").read_text().replace(
        "bronze.user_events", "bronze_t"), {"bronze_t": bronze})
    ids = silver.column("event_id").to_pylist()
    assert len(ids) == len(set(ids)) == len({r["event_id"] for r in rows if r["event_id"]})
    assert set(silver.column("event_type").to_pylist()) <= {"view", "click", "purchase", "signup"}
    gold = query_arrow((DEMO / "sql" / "gold_daily_user_events.sql").read_text().replace(
        "silver.user_events", "silver_t"), {"silver_t": silver})
    got = {str(r["event_date"]): (r["total_events"], r["unique_users"]) for r in gold.to_pylist()}
    assert got == expected_daily(landed)


def test_sql_that_does_not_transpile_is_refused_at_validation_naming_file_and_field(tmp_path):
    hinted = "SELECT /*+ BROADCAST(s) */ CAST(event_ts AS DATE) AS event_date, COUNT(*) AS total_events, " \
             "COUNT(DISTINCT user_id) AS unique_users FROM silver.user_events AS s GROUP BY 1"
    meta = _demo_with(tmp_path, DUCK.replace("sql/gold_daily_user_events.sql", "sql/hinted.sql"),
                      {"hinted.sql": hinted})
    with pytest.raises(MetadataError) as exc:
        load_metadata(meta)
    probs = [p for p in exc.value.problems if "sql_engine" in p]
    assert len(probs) == 1, exc.value.problems
    assert "duck.yaml: stages[1].sql_engine" in probs[0] and "hinted.sql" in probs[0], probs
    assert "Hints are not supported" in probs[0] and "sql_engine: spark" in probs[0], probs
    # a function sqlglot cannot translate is refused too, by name
    assert "my_udf" in duckdb_problem("SELECT my_udf(a) FROM t")
    assert duckdb_problem((DEMO / "sql" / "silver_user_events.sql").read_text()) is None


def test_an_incremental_duckdb_stage_is_refused(tmp_path):
    meta = _demo_with(tmp_path, DUCK.replace(
        "sql_engine: duckdb}", "sql_engine: duckdb, incremental: {mode: merge, merge_keys: [event_id]}}", 1))
    with pytest.raises(MetadataError) as exc:
        load_metadata(meta)
    assert any("duck.yaml" in p and "does not read incremental change sets" in p for p in exc.value.problems), \
        exc.value.problems


# --------------------------------------------------------------------------- Spark: through the WAP service


def test_demo_silver_and_gold_on_duckdb_write_the_tables_spark_writes(platform, tmp_path):
    """The whole demo on Spark, then its silver and gold SQL as DuckDB stages through the same
    write-audit-publish: the same rows and the same schema in both pairs of tables (PyIceberg),
    the gold as plain Python computes it, the rules evaluated, and the run says which engine ran."""
    from lakehouse.stage.runner import StageRunner

    generate_user_events(platform.settings.landing_dir / "user_events", rows=2000, files=2)
    platform.store.apply(load_metadata(_demo_with(tmp_path, DUCK)))
    outcomes = {}
    for name in ("bronze_ingest", "silver_clean", "gold_aggregate", "silver_duck", "gold_duck"):
        r = StageRunner(platform, PIPE, name)
        outcomes[name] = r.load(r.extract())
        assert outcomes[name].published, (name, outcomes[name])
    assert outcomes["silver_duck"].extra.get("sql_engine") == "duckdb"
    assert outcomes["gold_duck"].extra.get("sql_engine") == "duckdb"
    assert "sql_engine" not in outcomes["silver_clean"].extra
    assert [c.rule.name for c in outcomes["silver_duck"].checks] == [
        "event_id_unique", "known_event_type", "user_id_positive"]
    assert all(c.passed for c in outcomes["silver_duck"].checks + outcomes["gold_duck"].checks)

    cat = platform.pyiceberg_catalog()

    def table(ident):
        t = cat.load_table(ident)
        return t.schema().as_struct(), sorted(map(tuple, (r.values() for r in t.scan().to_arrow().to_pylist())))

    for spark_ident, duck_ident in (("silver.user_events", "silver.user_events_duck"),
                                    ("gold.daily_user_events", "gold.daily_user_events_duck")):
        (s_schema, s_rows), (d_schema, d_rows) = table(spark_ident), table(duck_ident)
        assert [(f.name, str(f.field_type)) for f in s_schema.fields] == \
               [(f.name, str(f.field_type)) for f in d_schema.fields], (spark_ident, s_schema, d_schema)
        assert s_rows and s_rows == d_rows, spark_ident
    gold = {str(r["event_date"]): (r["total_events"], r["unique_users"])
            for r in cat.load_table("gold.daily_user_events_duck").scan().to_arrow().to_pylist()}
    assert gold == expected_daily(platform.settings.landing_dir / "user_events")


def test_a_result_column_without_a_name_is_refused_with_the_fix():
    """Spark names `count(*)` count(1), DuckDB count_star(): the stage's table would differ."""
    problem = duckdb_problem("SELECT country, count(*) FROM t GROUP BY country")
    assert problem.startswith("result column 'COUNT(*)' has no name: give it one (`... AS name`)"), problem
    assert duckdb_problem("SELECT country, count(*) AS n FROM t GROUP BY country") is None
    assert duckdb_problem("SELECT * FROM t UNION ALL SELECT * FROM u") is None
    assert "has no name" in duckdb_problem("SELECT a + 1 FROM t UNION ALL SELECT b AS c FROM u")


STAGE_PARITY_SQL = """
SELECT id,
       dayofweek(d) AS dow, substr(s, -2) AS tail, substr(s, 0, 2) AS head, left(s, -1) AS none,
       CAST(ts_text AS DATE) AS day, CAST(ts_text AS TIMESTAMP) AS ts, size(arr) AS n, amount % 0 AS m,
       ceil(amount) AS c, lower(s) AS low, coalesce(s, 'none') AS filled
FROM t
"""


@pytest.mark.slow
def test_a_duckdb_stages_sql_answers_as_spark_sql_does(spark):
    """The same stage SQL over the same rows, on Spark SQL and on DuckDB (the rewrites of
    `expression_to_duckdb` apply to a stage's SQL too): the same rows, the same column names.
    Before them DuckDB counted dayofweek from 0, read substr's negative and zero positions its own
    way, failed a cast instead of giving NULL and gave NaN for x % 0."""
    import datetime as dt

    rows = [{"id": 1, "d": dt.date(2026, 1, 4), "s": "abcdef", "ts_text": "2026-01-04 23:30:00", "arr": [1, 2],
             "amount": 2.5},
            {"id": 2, "d": dt.date(2026, 1, 10), "s": "x", "ts_text": "not a time", "arr": None, "amount": -1.5},
            {"id": 3, "d": None, "s": None, "ts_text": None, "arr": [], "amount": None}]
    table = pa.Table.from_pylist(rows, schema=pa.schema([
        ("id", pa.int64()), ("d", pa.date32()), ("s", pa.string()), ("ts_text", pa.string()),
        ("arr", pa.list_(pa.int64())), ("amount", pa.float64())]))
    spark.createDataFrame(rows, schema="id bigint, d date, s string, ts_text string, arr array<bigint>, amount double"
                          ).createOrReplaceTempView("t")
    on_spark = [r.asDict() for r in spark.sql(STAGE_PARITY_SQL).orderBy("id").collect()]
    on_duckdb = query_arrow(STAGE_PARITY_SQL, {"t": table}, spark.conf.get("spark.sql.session.timeZone"))
    on_duckdb = sorted(on_duckdb.to_pylist(), key=lambda r: r["id"])

    def same(a, b):
        if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
            return True  # NaN
        if isinstance(a, dt.datetime) and isinstance(b, dt.datetime):  # Spark: local naive, DuckDB: aware UTC
            return a.replace(tzinfo=None) == b.astimezone(dt.UTC).replace(tzinfo=None) if b.tzinfo else a == b
        return a == b

    assert [list(r) for r in on_duckdb] == [list(r) for r in on_spark]  # the same column names, in order
    for got, want in zip(on_duckdb, on_spark, strict=True):
        diff = {k: (got[k], want[k]) for k in want if not same(want[k], got[k])}
        assert not diff, (got["id"], diff)
