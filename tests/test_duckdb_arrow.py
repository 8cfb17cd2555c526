"""A SQL stage whose SELECT runs on DuckDB and whose target the Arrow engine writes runs without a
JVM (issue 21): DuckDB over the pinned upstream snapshots read through PyIceberg, then the same
write-audit-publish on PyIceberg (audit branch, rules, publish, the upstream snapshots in the
snapshot summary). The fast lane's autouse guard fails any of these tests that starts a JVM."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from lakehouse.engines import choice as engines
from lakehouse.metadata.loader import MetadataError, load_metadata
from lakehouse.metadata.store import MetadataStore
from lakehouse.platform import Platform
from lakehouse.stage.core import AuditFailed
from lakehouse.stage.runner import StageRunner
from tests.test_wap_helpers import pyiceberg, rows_of

META = """
pipelines:
  - {pipeline_id: sales}
sources:
  - {source_id: sales_raw, kind: files, format: jsonl, path: sales, glob: "*.jsonl"}
targets:
  - {target_id: bronze_sales, namespace: bronze, table: sales, engine: arrow}
  - {target_id: gold_by_country, namespace: gold, table: sales_by_country, write_mode: overwrite, engine: GOLD_ENGINE,
     partition_spec: [{column: country}]}
stages:
  - {pipeline_id: sales, stage_order: 1, stage_name: ingest, layer: bronze, source_id: sales_raw,
     target_id: bronze_sales}
  - {pipeline_id: sales, stage_order: 2, stage_name: by_country, layer: gold, target_id: gold_by_country,
     sql_engine: duckdb, validation_set_id: gold_rules,
     transformation: "SELECT country, COUNT(*) AS orders, SUM(amount) AS total, MAX(CAST(ts AS DATE)) AS last_day
                      FROM bronze.sales WHERE amount >= MIN_AMOUNT GROUP BY country"}
validation_rules:
  - rule_set_id: gold_rules
    rules:
      - {name: has_rows, type: row_count, min: 1}
      - {name: country_unique, type: unique, columns: [country]}
      - {name: country_known, type: accepted_values, column: country, values: [de, fr, it]}
"""


def apply(platform, tmp_path, gold_engine="arrow", min_amount=0):
    path = tmp_path / "meta.yaml"
    path.write_text(META.replace("GOLD_ENGINE", gold_engine).replace("MIN_AMOUNT", str(min_amount)))
    platform.store.apply(load_metadata(path))


def land(platform, name: str, rows: list[dict]) -> None:
    out = platform.settings.landing_dir / "sales"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def sale(i: int, country: str) -> dict:
    return {"id": i, "country": country, "amount": float(i), "ts": f"2026-01-{1 + i % 28:02d}T10:00:00Z"}


def expected(rows: list[dict], min_amount: float = 0) -> dict[str, tuple]:
    out: dict[str, list] = defaultdict(lambda: [0, 0.0, ""])
    for r in rows:
        if r["amount"] >= min_amount:
            acc = out[r["country"]]
            acc[0], acc[1], acc[2] = acc[0] + 1, acc[1] + r["amount"], max(acc[2], r["ts"][:10])
    return {c: (n, t, d) for c, (n, t, d) in out.items()}


def got(platform) -> dict[str, tuple]:
    return {r["country"]: (r["orders"], float(r["total"]), str(r["last_day"]))
            for r in rows_of(platform, "gold.sales_by_country")}


@pytest.fixture
def lake(settings):
    """A platform with no SparkSession behind it (the fast lane has none)."""
    return Platform(settings, MetadataStore(settings.control_db_url))


def run_stage(platform, stage: str, run_id: str):
    runner = StageRunner(platform, "sales", stage, run_id)
    return runner.load(runner.extract())


def test_a_duckdb_sql_stage_on_the_arrow_engine_writes_audits_and_replaces_its_table_without_a_jvm(lake, tmp_path):
    apply(lake, tmp_path)
    first = [sale(i, ("de", "fr")[i % 2]) for i in range(1, 41)]
    land(lake, "a", first)
    assert run_stage(lake, "ingest", "r1").published
    out = run_stage(lake, "by_country", "r1")
    assert out.published and out.extra["engine"] == "arrow" and out.extra["sql_engine"] == "duckdb"
    assert got(lake) == expected(first)
    table = pyiceberg(lake).load_table("gold.sales_by_country")
    bronze_head = pyiceberg(lake).load_table("bronze.sales").metadata.current_snapshot_id
    summary = table.metadata.snapshot_by_id(table.metadata.current_snapshot_id).summary
    assert json.loads(summary["lakehouse.upstream"]) == {"bronze.sales": bronze_head}
    assert [f.name for f in table.spec().fields] == ["country"]
    assert not [r for r in table.metadata.refs if r != "main"]  # the audit branch is gone after publish

    # a second run recomputes the whole table: the new rows replace the old ones, none is kept twice
    more = [sale(i, "it") for i in range(41, 51)]
    land(lake, "b", more)
    assert run_stage(lake, "ingest", "r2").published
    out = run_stage(lake, "by_country", "r2")
    assert out.published and out.extra["engine"] == "arrow"
    assert got(lake) == expected(first + more)
    assert len(rows_of(lake, "gold.sales_by_country")) == 3


def test_a_failed_audit_of_a_duckdb_arrow_stage_keeps_its_branch_and_never_touches_main(lake, tmp_path):
    apply(lake, tmp_path)
    land(lake, "a", [sale(i, "de") for i in range(1, 5)])
    run_stage(lake, "ingest", "r1")
    assert run_stage(lake, "by_country", "r1").published
    before = got(lake)
    main_before = pyiceberg(lake).load_table("gold.sales_by_country").metadata.current_snapshot_id
    land(lake, "b", [sale(9, "xx")])  # not an accepted country: the blocking rule fails the audit
    run_stage(lake, "ingest", "r2")
    with pytest.raises(AuditFailed):
        run_stage(lake, "by_country", "r2")
    table = pyiceberg(lake).load_table("gold.sales_by_country")
    assert table.metadata.current_snapshot_id == main_before and got(lake) == before
    assert any(name.startswith("audit_") for name in table.metadata.refs)  # kept for inspection


def test_auto_writes_a_duckdb_stage_with_arrow_by_its_upstream_bytes_and_spark_above(lake, tmp_path):
    apply(lake, tmp_path, gold_engine="auto")
    land(lake, "a", [sale(i, "de") for i in range(1, 9)])
    run_stage(lake, "ingest", "r1")
    runner = StageRunner(lake, "sales", "by_country", "r2")
    plan = runner.extract()
    size = engines.upstream_bytes(runner, plan)
    assert size == sum(t.file.file_size_in_bytes for t in pyiceberg(lake).load_table("bronze.sales").scan().plan_files())
    choice = engines.choose(runner, plan)
    assert (choice.engine, choice.reason.split(" (")[0]) == ("arrow", f"auto: {size} bytes of upstream data files <= 150000000")
    assert not engines.may_need_spark(lake.catalog(), "sales")  # `lakehouse run` warms no JVM up for it

    # the target's threshold below the upstream's bytes: Spark, saying why (checked before Spark starts)
    path = tmp_path / "meta.yaml"
    path.write_text(path.read_text().replace("engine: auto,", f"engine: auto, arrow_max_bytes: {size - 1},"))
    lake.store.apply(load_metadata(path))
    runner = StageRunner(lake, "sales", "by_country", "r3")
    choice = engines.choose(runner, runner.extract())
    assert (choice.engine, choice.reason) == (
        "spark", f"auto: {size} bytes of upstream data files > {size - 1} (target gold_by_country arrow_max_bytes)")


def test_what_keeps_a_sql_stage_on_spark_is_named(tmp_path):
    """Spark SQL, or an expression rule DuckDB cannot evaluate as Spark would: `engine: arrow` is
    refused at apply, naming the field; `auto` falls back to Spark and says why."""
    bad = META.replace("GOLD_ENGINE", "arrow").replace("MIN_AMOUNT", "0").replace("sql_engine: duckdb, ", "")
    (tmp_path / "m.yaml").write_text(bad)
    with pytest.raises(MetadataError, match="sql_engine: duckdb"):
        load_metadata(tmp_path / "m.yaml")
    expr = META.replace("GOLD_ENGINE", "arrow").replace("MIN_AMOUNT", "0").replace(
        "- {name: has_rows, type: row_count, min: 1}", "- {name: sampled, type: expression, expression: \"rand() < total\"}")
    (tmp_path / "m.yaml").write_text(expr)
    with pytest.raises(MetadataError, match="rule 'sampled': expression 'rand.. < total' is evaluated by Spark"):
        load_metadata(tmp_path / "m.yaml")


def test_lakehouse_run_of_a_file_load_and_a_duckdb_roll_up_starts_no_jvm(lake, tmp_path, capsys):
    """`lakehouse run` end to end (the Dagster job, the IO manager handing the SQL stage its
    upstream, the asset checks, the run summary): the guard fails the test if anything starts a
    JVM, the run's warm-up included."""
    import argparse

    from lakehouse_assets.cli import cmd_run

    apply(lake, tmp_path, gold_engine="auto")
    rows = [sale(i, ("de", "it")[i % 2]) for i in range(1, 21)]
    land(lake, "a", rows)
    code = cmd_run(argparse.Namespace(pipeline="sales", ephemeral=True, verbose=False))
    out = capsys.readouterr().out
    assert code == 0, out
    assert got(lake) == expected(rows)
    started = {e.dataset: e.details for e in lake.store.audit_entries(event="stage_started")}
    assert started["gold.sales_by_country"]["engine"] == "arrow", started
    assert "gold/sales_by_country" in out and "published" in out


def test_a_result_column_no_table_can_hold_is_named_and_nothing_is_written(lake, tmp_path):
    """DuckDB's INTERVAL (a timestamp difference) has no Iceberg type: the stage fails naming the
    column, before any table or branch is made."""
    apply(lake, tmp_path)
    path = tmp_path / "meta.yaml"
    path.write_text(path.read_text().replace("MAX(CAST(ts AS DATE)) AS last_day",
                                             "MAX(CAST(ts AS TIMESTAMP)) - MIN(CAST(ts AS TIMESTAMP)) AS span"))
    lake.store.apply(load_metadata(path))
    land(lake, "a", [sale(i, "de") for i in range(1, 5)])
    run_stage(lake, "ingest", "r1")
    with pytest.raises(ValueError, match="column 'span': .*month_day_nano_interval"):
        run_stage(lake, "by_country", "r1")
    assert not pyiceberg(lake).table_exists("gold.sales_by_country")


def test_duckdb_sees_only_the_tables_it_is_given():
    """SQL from metadata runs in a DuckDB without file, network or extension access: whatever gets
    past the static checks can read the registered upstream tables and nothing else."""
    import duckdb
    import pyarrow as pa

    from lakehouse.sources.duckdb_sql import connect

    con = connect()
    try:
        con.register("t", pa.table({"a": [1, 2, 3]}))
        assert con.execute("SELECT sum(a) FROM t").fetchall() == [(6,)]
        for sql in ("SELECT * FROM read_csv('/etc/passwd')", "COPY t TO '/tmp/lh_duck_leak.csv'", "INSTALL httpfs",
                    "SELECT * FROM read_parquet('https://example.com/x.parquet')"):
            with pytest.raises(duckdb.Error):
                con.execute(sql)
        with pytest.raises(duckdb.Error):
            con.execute("SET enable_external_access = true")
    finally:
        con.close()
