"""Attacks on the JVM-free paths (no Spark: the fast lane's guard fails a test that starts a JVM):
* expression rules in DuckDB answer as Spark (ANSI off) where sqlglot's translation alone does not,
  and what DuckDB would answer otherwise is refused when the metadata is validated, naming the rule
  (the slow tests/test_expression_parity.py runs the same corpus on both engines);
* hostile rule expressions and stage SQL (an escape from the expression, a second statement, a
  subquery, a file read, quoted and unicode identifiers): a clear error naming the rule or stage,
  nothing written to main.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from pathlib import Path

import pyarrow as pa
import pytest

from lakehouse.engines.arrow import rules as arrow_engine
from lakehouse.metadata.engine_support import rule_blockers
from lakehouse.metadata.loader import MetadataError, load_metadata
from lakehouse.metadata.model import Rule
from lakehouse.sql.parse import expression_problem
from lakehouse.validation.rules import RuleError
from tests.test_duckdb_arrow import META, apply, lake, land, run_stage, sale  # noqa: F401 - lake is a fixture
from tests.test_wap_helpers import pyiceberg


def passes(expression: str, table: pa.Table, name: str = "r") -> list:
    return arrow_engine.passes(Rule(name=name, type="expression", expression=expression), table).to_pylist()


def one(column: str, *values, type_=None) -> pa.Table:
    return pa.table({column: pa.array(list(values), type_)})


# Spark 3.5's answers (ANSI off), each checked against Spark by the slow parity test; sqlglot's
# translation alone answers otherwise (noted per case)
SPARK_ANSWERS = [
    ("substr(s, -5, 3) = 'A'", one("s", "ABC"), [True]),
    ("substr(s, 0, 2) = 'AB'", one("s", "ABC"), [True]),  # DuckDB: 'A'
    ("substr(s, 2, -1) = ''", one("s", "ABC"), [True]),  # DuckDB: 'A'
    ("substr(s, 2, -1) IS NULL", one("s", None, type_=pa.string()), [True]),
    ("left(s, -1) = '' AND right(s, i) = ''", pa.table({"s": ["ABC"], "i": [-2]}), [True]),  # DuckDB: 'AB', 'C'
    ("dayofweek(day) = 1", one("day", dt.date(2024, 1, 7)), [True]),  # a Sunday; DuckDB: 0
    ("d % 0.0 IS NULL", one("d", 2.5), [True]),  # DuckDB: NaN
    ("floor(d) = 0 AND ceil(e) = 9223372036854775807", pa.table({"d": [float("nan")], "e": [1e300]}), [True]),
    ("size(arr) = -1", one("arr", None, type_=pa.list_(pa.int32())), [True]),  # DuckDB: NULL
    ("isnan(sqrt(d))", one("d", -1.0), [True]),  # DuckDB raises
    ("ln(d) IS NULL AND log10(d) IS NULL", one("d", 0.0), [True]),  # DuckDB raises
    ("CAST(s AS DATE) IS NULL AND to_date(s) IS NULL", one("s", "-infinity"), [True]),  # DuckDB: -infinity
    ("to_timestamp(s) IS NULL", one("s", "not a time"), [True]),  # DuckDB raises
    ("trunc(day, 'MM') = '2024-01-01'", one("day", dt.date(2024, 1, 17)), [True]),  # DuckDB raises on 'MM'
    ("lower(s) = 'straße'", one("s", "STRAßE"), [True]),  # not refused: ß lower-cases alike
]


@pytest.mark.parametrize("expression,table,expected", SPARK_ANSWERS, ids=[c[0] for c in SPARK_ANSWERS])
def test_expression_rules_answer_as_spark_where_the_plain_translation_does_not(expression, table, expected):
    assert expression_problem(expression) is None
    assert passes(expression, table) == expected


@pytest.mark.parametrize("expression", [
    "CAST(s AS INT) > 0", "int(s) > 0", "CAST(d AS BIGINT) >= 0", "TRY_CAST(s AS SMALLINT) IS NULL",
    "CAST(day AS STRING) = '2024-01-01'", "string(d) = 'NaN'", "sign(d) > 0", "unix_timestamp(ts) > 0",
    "initcap(s) = 'Abc'", "nanvl(d, 0) > 0", "d div 2 = 1"])
def test_what_duckdb_answers_otherwise_keeps_the_stage_on_spark_named_at_validation(expression, tmp_path):
    assert expression_problem(expression)
    rule = Rule(name="odd", type="expression", expression=expression)
    assert rule_blockers([rule]) == [f"rule 'odd': expression {expression!r} is evaluated by Spark "
                                     f"({expression_problem(expression)})"]
    path = tmp_path / "meta.yaml"
    path.write_text(META.replace("GOLD_ENGINE", "arrow").replace("MIN_AMOUNT", "0").replace(
        "- {name: has_rows, type: row_count, min: 1}", "- {name: odd, type: expression, expression: " +
        '"' + expression.replace('"', '\\"') + '"}'))
    with pytest.raises(MetadataError, match="rule 'odd': expression .* is evaluated by Spark"):
        load_metadata(path)


def test_a_cast_to_an_integer_is_refused_because_spark_truncates_where_duckdb_rounds():
    assert "Spark truncates '1.5' and 1.5 to 1" in expression_problem("CAST(dec AS INT) = 1")
    with pytest.raises(RuleError, match="rule 'r': expression 'CAST.dec AS INT. = 1' cannot be evaluated without Spark"):
        passes("CAST(dec AS INT) = 1", one("dec", 1.5))  # Spark: 1 (passes); DuckDB: 2


def test_case_mapping_spark_does_otherwise_is_a_named_error_not_a_different_count():
    assert passes("upper(s) = 'ABC'", one("s", "abc", "é", None)) == [True, False, False]
    with pytest.raises(RuleError, match="rule 'r': .*upper.. of a character Spark maps by Unicode's special casing"):
        passes("upper(s) = 'STRASSE'", one("s", "abc", "Straße"))  # Spark: 'STRASSE'; DuckDB: 'STRAßE'
    with pytest.raises(RuleError, match="lower.. of a character"):
        passes("lower(s) LIKE '%ς'", one("s", "ΟΔΟΣ"))  # Spark: final sigma 'οδος'; DuckDB 'οδοσ'


ODD_NAMES = pa.table({"we ird": [1, -1, None], "naïve": ["x", "y", None], "a`b": [1, 2, 3], 'q"t': [1, 0, 1],
                      "select": [1, 1, 0]})


@pytest.mark.parametrize("expression,expected", [
    ("`we ird` > 0", [True, False, False]), ("`naïve` = 'x'", [True, False, False]), ("`a``b` > 1", [False, True, True]),
    ('`q"t` = 1', [True, False, True]), ("`select` = 1", [True, True, False]), ("length(`naïve`) = 1", [True, True, False]),
    ("`we ird` > 0 -- OR true", [True, False, False]), ("'a' = 'a'' OR ''1''=''1'", [False, False, False]),
])
def test_quoted_unicode_and_keyword_identifiers_are_read_as_columns(expression, expected):
    assert passes(expression, ODD_NAMES) == expected


@pytest.mark.parametrize("expression,error", [
    ("1=1) OR (true", "does not parse as Spark SQL"),
    ("true) UNION SELECT 1 --", "does not parse as Spark SQL"),
    ("true; DROP TABLE gold.sales_by_country", "must be one expression, found 2 statements"),
    ("(SELECT 1) = 1", "not a statement or subquery"),
    ("EXISTS (SELECT * FROM bronze.sales)", "not a statement or subquery"),
    ("count(*) > 0", "row-level expression"),
    ("read_csv('/etc/passwd') IS NOT NULL", "cannot be evaluated without Spark: calls read_csv"),
    ("getvariable('x') IS NULL", "cannot be evaluated without Spark"),
    ("current_setting('TimeZone') = 'UTC'", "cannot be evaluated without Spark"),
    ("`no such` > 0", "is not valid here"),
])
def test_hostile_expressions_fail_naming_the_rule(expression, error):
    with pytest.raises(RuleError, match=f"rule 'evil': expression .*{error}"):
        passes(expression, ODD_NAMES, "evil")


@pytest.mark.parametrize("expression", ["1=1) OR (true", "true; DROP TABLE gold.sales_by_country", "(SELECT 1) = 1"])
def test_a_hostile_rule_expression_is_refused_when_the_metadata_is_loaded(expression, tmp_path):
    path = tmp_path / "meta.yaml"
    path.write_text(META.replace("GOLD_ENGINE", "arrow").replace("MIN_AMOUNT", "0").replace(
        "- {name: has_rows, type: row_count, min: 1}", '- {name: evil, type: expression, expression: "' + expression + '"}'))
    with pytest.raises(MetadataError, match="rule 'evil'"):
        load_metadata(path)


def test_a_stage_reading_a_file_fails_naming_it_and_writes_nothing(lake, tmp_path):  # noqa: F811
    """SQL that reads a file is refused when the metadata is validated (issue 40), naming the stage's
    field and the function; stored anyway (a row written past the checks), the run refuses it with the
    same check before DuckDB (no external access either) would: the stage fails, no table is made."""
    apply(lake, tmp_path)
    path = tmp_path / "meta.yaml"
    path.write_text(path.read_text().replace("FROM bronze.sales WHERE", "FROM bronze.sales, read_csv('/etc/passwd') AS p WHERE"))
    with pytest.raises(MetadataError, match=r"meta.yaml: stages\[1\].sql_engine: .*calls read_csv\(\)"):
        load_metadata(path)
    stage = lake.store.load().stage("sales", "by_country")
    lake.store.upsert([stage.model_copy(update={"transformation": stage.transformation.replace(
        "FROM bronze.sales WHERE", "FROM bronze.sales, read_csv('/etc/passwd') AS p WHERE")})])
    land(lake, "a", [sale(i, "de") for i in range(1, 5)])
    assert run_stage(lake, "ingest", "r1").published
    with pytest.raises(Exception, match="(?i)external access|read_csv|permission"):
        run_stage(lake, "by_country", "r1")
    assert not pyiceberg(lake).table_exists("gold.sales_by_country")


def test_quoted_and_unicode_result_columns_are_written_as_named(lake, tmp_path):  # noqa: F811
    apply(lake, tmp_path)
    path = tmp_path / "meta.yaml"
    path.write_text(path.read_text().replace(
        "SELECT country, COUNT(*) AS orders, SUM(amount) AS total, MAX(CAST(ts AS DATE)) AS last_day",
        "SELECT country, COUNT(*) AS `n° of \\\"orders\\\"`, SUM(amount) AS `to``tal`, MAX(CAST(ts AS DATE)) AS `last day`"))
    lake.store.apply(load_metadata(path))
    land(lake, "a", [sale(i, ("de", "fr")[i % 2]) for i in range(1, 7)])
    assert run_stage(lake, "ingest", "r1").published
    assert run_stage(lake, "by_country", "r1").published
    rows = {r["country"]: r for r in pyiceberg(lake).load_table("gold.sales_by_country").scan().to_arrow().to_pylist()}
    assert rows["de"]['n° of "orders"'] == 3 and math.isclose(rows["de"]["to`tal"], 2 + 4 + 6)
    assert str(rows["de"]["last day"]) == "2026-01-07" and str(rows["fr"]["last day"]) == "2026-01-06"


# --------------------------------------------------------------------------- processes at once, a kill

CHILD = """
import sys
from lakehouse.platform import Platform
from lakehouse.stage.runner import StageRunner

runner = StageRunner(Platform.from_env(), "sales", sys.argv[1], sys.argv[2])
out = runner.load(runner.extract())
print("OUTCOME", out.published, out.rows_written, out.skipped_reason, out.extra.get("engine"))
"""


def _home(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {"LAKEHOUSE_HOME": str(home), "LAKEHOUSE_CATALOG_NAME": "lake", "LAKEHOUSE_WAREHOUSE": f"file://{home / 'wh'}",
           "LAKEHOUSE_CATALOG_URI": f"sqlite:///{home / 'catalog.db'}",
           "LAKEHOUSE_CONTROL_DB_URL": f"sqlite:///{home / 'control.db'}"}
    (tmp_path / "m.yaml").write_text(META.replace("GOLD_ENGINE", "arrow").replace("MIN_AMOUNT", "0"))
    from lakehouse.metadata.store import MetadataStore

    MetadataStore(env["LAKEHOUSE_CONTROL_DB_URL"]).apply(load_metadata(tmp_path / "m.yaml"))
    return home, env


def _start(env, log, *args):
    import subprocess
    import sys

    with log.open("w") as fh:
        return subprocess.Popen([sys.executable, "-c", CHILD, *args], env=env, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True), log


def _gold(env) -> tuple[dict, set]:
    from pyiceberg.catalog.sql import SqlCatalog

    cat = SqlCatalog("lake", uri=env["LAKEHOUSE_CATALOG_URI"], warehouse=env["LAKEHOUSE_WAREHOUSE"])
    table = cat.load_table("gold.sales_by_country")
    rows = table.scan().to_arrow().to_pylist()
    return ({r["country"]: (r["orders"], float(r["total"]), str(r["last_day"])) for r in rows} | {"__rows": len(rows)},
            set(table.metadata.refs))


def _ingest(env, tmp_path, tag, rows):
    from tests import concurrency_kit as kit

    root = Path(env["LAKEHOUSE_HOME"]) / "landing" / "sales"
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{tag}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    [(rc, out)] = kit.wait_runs([_start(kit.run_env(env), tmp_path / f"ingest-{tag}.log", "ingest", f"i_{tag}")], 120)
    assert rc == 0 and "OUTCOME True" in out, out[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_processes_replacing_a_duckdb_arrow_table_at_once_leave_one_full_result(tmp_path):
    """Two processes run the same DuckDB → Arrow overwrite stage, lined up at their publish: the table
    ends with exactly one full result (no doubled or mixed rows) and no audit branch is left."""
    from tests import concurrency_kit as kit
    from tests.test_duckdb_arrow import expected

    home, env = _home(tmp_path)
    first = [sale(i, ("de", "fr")[i % 2]) for i in range(1, 21)]
    _ingest(env, tmp_path, "a", first)
    pause = tmp_path / "pause"
    pause.mkdir()
    run_env = kit.run_env(env, LAKEHOUSE_PAUSE_AT="before_publish", LAKEHOUSE_PAUSE_DIR=str(pause))
    procs = [_start(run_env, tmp_path / f"gold-{i}.log", "by_country", f"g{i}") for i in range(2)]
    try:
        kit.release_when_paused(pause, procs, timeout=300)
        results = kit.wait_runs(procs, timeout=300)
    finally:
        kit.kill_all(procs)
    outs = [out for _, out in results]
    assert all(rc == 0 for rc, _ in results), [o[-3000:] for o in outs]
    assert any("OUTCOME True" in o for o in outs), outs
    got, refs = _gold(env)
    assert got == {**expected(first), "__rows": 2}
    assert refs == {"main"}, refs


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_duckdb_arrow_run_killed_before_publish_leaves_main_alone_and_its_rerun_tidies_the_branch(tmp_path):
    """kill -9 of a run paused after its audit branch was written, before publish: main keeps the
    previous result; the next run writes the new result and leaves no branch behind."""
    import os
    import signal
    import time

    from tests import concurrency_kit as kit
    from tests.test_duckdb_arrow import expected

    home, env = _home(tmp_path)
    first = [sale(i, "de") for i in range(1, 6)]
    _ingest(env, tmp_path, "a", first)
    [(rc, out)] = kit.wait_runs([_start(kit.run_env(env), tmp_path / "g0.log", "by_country", "g0")], 120)
    assert rc == 0 and "OUTCOME True" in out, out[-3000:]
    assert _gold(env) == ({**expected(first), "__rows": 1}, {"main"})

    more = [sale(i, "it") for i in range(6, 10)]
    _ingest(env, tmp_path, "b", more)
    pause = tmp_path / "pause"
    pause.mkdir()
    run_env = kit.run_env(env, LAKEHOUSE_PAUSE_AT="before_publish", LAKEHOUSE_PAUSE_DIR=str(pause))
    proc, log = _start(run_env, tmp_path / "g1.log", "by_country", "g1")
    try:
        deadline = time.monotonic() + 120
        while not list(pause.glob("before_publish.*")):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        kit.kill_all([(proc, log)])
    got, refs = _gold(env)
    assert got == {**expected(first), "__rows": 1}  # main untouched
    dead = refs - {"main"}
    assert dead, refs  # the killed run's audit branch, written before the kill

    [(rc, out)] = kit.wait_runs([_start(kit.run_env(env), tmp_path / "g2.log", "by_country", "g2")], 120)
    assert rc == 0 and "OUTCOME True" in out, out[-3000:]
    got, refs = _gold(env)
    assert got == {**expected(first + more), "__rows": 2}
    assert refs == {"main"}, refs
