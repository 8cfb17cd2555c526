"""SQL → metadata: upstream deps and column lineage from SQL, `lakehouse sql import` of the seed's
statement applied through `metadata apply` and materialized through the Dagster job."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from lakehouse.lineage.columns import column_lineage
from lakehouse.lineage.sql_import import SqlImportError, import_sql
from lakehouse.metadata.loader import load_metadata
from lakehouse.sql.parse import SqlParseError, tables_in_sql

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "metadata" / "demo"

SEED_SQL = """CREATE TABLE analytics.daily_user_events AS
SELECT
  DATE(event_ts) AS event_date,
  COUNT(*)           AS total_events,
  COUNT(DISTINCT user_id) AS unique_users
FROM silver_user_events
WHERE event_ts >= CURRENT_DATE - INTERVAL '1 day'
GROUP BY DATE(event_ts);
"""


def test_seed_statement_column_lineage():
    cl = column_lineage(SEED_SQL)
    assert cl.upstream_columns("event_date") == ["event_ts"]
    assert cl.upstream_columns("unique_users") == ["user_id"]
    assert cl.upstream_columns("total_events") == []  # COUNT(*) reads no particular column
    assert cl.by_upstream() == {"silver_user_events": {"event_date": ["event_ts"], "unique_users": ["user_id"]}}
    assert tables_in_sql(SEED_SQL) == ["silver_user_events"]


def test_demo_sql_lineage_through_subquery_and_joins():
    silver = (DEMO / "sql" / "silver_user_events.sql").read_text()
    by = column_lineage(silver).by_upstream()["bronze.user_events"]
    assert by["event_type"] == ["event_type"] and by["device"] == ["device"]
    j = column_lineage("SELECT a.id, coalesce(p.country, a.country) AS country FROM s.a a "
                       "LEFT JOIN s.p p ON a.user_id = p.user_id").by_upstream()
    assert j == {"s.a": {"id": ["id"], "country": ["country"]}, "s.p": {"country": ["country"]}}


@pytest.mark.parametrize("sql, line, col", [
    ("SELECT a,\n  b FROM t WHERE (x = 1", 2, 23),
    ("CREATE TABLE a.b AS\nSELECT 'unterminated", 2, 8),
    ("SELECT 1 FROM", 1, 13),
])
def test_unparseable_sql_names_line_and_column(sql, line, col):
    with pytest.raises(SqlParseError) as err:
        import_sql(sql, load_metadata(DEMO).catalog, file_name="bad.sql")
    assert f"bad.sql: cannot parse SQL at line {line}, column {col}" in str(err.value)


def test_import_rejects_unknown_tables_and_other_statements():
    catalog = load_metadata(DEMO).catalog
    with pytest.raises(SqlImportError, match=r"statement 1: table 'nowhere' is not a lake table"):
        import_sql("CREATE TABLE x.y AS SELECT a FROM nowhere", catalog, file_name="f.sql")
    with pytest.raises(SqlImportError, match="only CREATE TABLE .* not DROP"):
        import_sql("DROP TABLE x", catalog, file_name="f.sql")
    # the demo already has asset gold/daily_user_events: a second one would break the graph
    with pytest.raises(SqlImportError, match="already the asset of stage user_events_etl.gold_aggregate"):
        import_sql(SEED_SQL, catalog, file_name="f.sql")


def demo_without_gold(tmp_path: Path) -> Path:
    """The demo up to silver: the seed's statement is its gold stage."""
    meta = tmp_path / "meta"
    shutil.copytree(DEMO, meta)
    doc = yaml.safe_load((meta / "user_events.yaml").read_text())
    doc["stages"] = [s for s in doc["stages"] if s["layer"] != "gold"]
    doc["targets"] = [t for t in doc["targets"] if t["target_id"] != "gold_daily_user_events"]
    doc["validation_rules"] = [r for r in doc["validation_rules"] if r["rule_set_id"] != "gold_daily_rules"]
    (meta / "user_events.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return meta


def lakehouse_cli(*argv: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).with_name("lakehouse")), *argv], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=300)


def test_sql_import_applies_and_materializes(platform, tmp_path, monkeypatch):
    import os

    from lakehouse.cli.demo import generate_user_events
    from tests.test_pipeline_e2e import pyiceberg_catalog, run_pipeline

    settings = platform.settings
    env = {**os.environ}
    meta = demo_without_gold(tmp_path)
    assert lakehouse_cli("metadata", "apply", str(meta), env=env).returncode == 0

    # landing data: the demo's history plus events from the last hours, which the seed's filter keeps
    landing = settings.landing_dir / "user_events"
    generate_user_events(landing, rows=1500, files=1, seed=5)
    now = datetime.now(UTC).replace(microsecond=0)
    recent = [{"event_id": f"r{i}", "user_id": i % 7 + 1, "event_type": "view",
               "event_ts": (now - timedelta(minutes=5 * i)).strftime("%Y-%m-%d %H:%M:%S"),
               "country": "DE", "context": {"device": "web", "app_version": "1"}} for i in range(40)]
    (landing / "recent.jsonl").write_text("\n".join(json.dumps(r) for r in recent) + "\n")

    sql_file = tmp_path / "daily.sql"
    sql_file.write_text(SEED_SQL)
    out = tmp_path / "imported.yaml"
    res = lakehouse_cli("sql", "import", str(sql_file), "-o", str(out), env=env)
    assert res.returncode == 0, res.stderr
    doc = yaml.safe_load(out.read_text())
    stage = doc["stages"][0]
    assert (stage["pipeline_id"], stage["layer"], stage["target_id"]) == (
        "user_events_etl", "gold", "analytics_daily_user_events")
    assert "FROM silver.user_events" in stage["transformation"]
    assert doc["targets"][0]["namespace"] == "analytics" and doc["targets"][0]["table"] == "daily_user_events"
    lin = doc["dataset_lineage"][0]
    assert (lin["from_dataset_id"], lin["to_dataset_id"]) == ("silver_user_events", "analytics_daily_user_events")
    assert lin["column_lineage"] == {"event_date": ["event_ts"], "unique_users": ["user_id"]}

    res = lakehouse_cli("metadata", "apply", str(out), env=env)
    assert res.returncode == 0, res.stderr
    catalog = platform.catalog()
    assert catalog.stage("user_events_etl", "daily_user_events").layer == "gold"

    result = run_pipeline(platform)
    assert result.success
    mats = {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}
    assert "gold/daily_user_events" in mats
    rows = pyiceberg_catalog(settings).load_table("analytics.daily_user_events").scan().to_arrow().to_pylist()
    # independent expectation: the recent events per day (the 1-day filter drops the demo's history)
    cutoff = (now - timedelta(days=1)).date()
    expected: dict[str, tuple[int, set]] = {}
    for r in recent:
        ts = datetime.strptime(r["event_ts"], "%Y-%m-%d %H:%M:%S")
        if ts.date() >= cutoff:
            tot, users = expected.setdefault(str(ts.date()), (0, set()))
            expected[str(ts.date())] = (tot + 1, users | {r["user_id"]})
    assert {str(r["event_date"]): (r["total_events"], r["unique_users"]) for r in rows} == {
        d: (t, len(u)) for d, (t, u) in expected.items()}


def test_cli_reports_parse_error_with_position(tmp_path, settings):
    import os

    bad = tmp_path / "bad.sql"
    bad.write_text("CREATE TABLE a.b AS\nSELECT x FROM (SELECT 1")
    res = lakehouse_cli("sql", "import", str(bad), "--metadata", str(DEMO), env={**os.environ})
    assert res.returncode == 2
    assert "line 2, column" in res.stderr and "bad.sql" in res.stderr
