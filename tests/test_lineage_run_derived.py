"""A stage run's lineage comes from what `metadata apply` derived (issue 21): the DataHub proposals of
a SQL stage's run and the recovery check read the stored `derived_stages` row, so no SQL is parsed
at run time, and the proposals are the ones parsing the SQL gives. A stage changed behind apply's
back (plain SQL) has a stale row: its run parses the SQL as before and its lineage follows the new SQL.

Fast (no Spark, no server): a SQLite control DB under tmp_path; `run_mcps` builds the proposals
`emit_stage_run` sends (its delivery is covered by tests/test_datahub*.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import sqlalchemy as sa

from lakehouse.lineage import datahub, recovery
from lakehouse.metadata.derived import stored_derivations
from lakehouse.metadata.loader import load_metadata
from lakehouse.metadata.store import MetadataStore, derived_stages
from lakehouse.settings import load_settings
from lakehouse.stage.core import StageContext
from lakehouse.stage.runner import Platform
from tests.conftest import seed_control_db

DEMO = Path(__file__).resolve().parent.parent / "metadata" / "demo"
PIPELINE = "user_events_etl"


@pytest.fixture
def platform(tmp_path, monkeypatch, control_db_at_head) -> Platform:
    seed_control_db(control_db_at_head, tmp_path)
    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path))
    for var in ("LAKEHOUSE_CONTROL_DB_URL", "LAKEHOUSE_CATALOG_URI", "LAKEHOUSE_WAREHOUSE", "LAKEHOUSE_CATALOG_NAME"):
        monkeypatch.delenv(var, raising=False)
    p = Platform(load_settings(), MetadataStore(f"sqlite:///{tmp_path / 'control.db'}"))
    p.store.apply(load_metadata(DEMO))
    monkeypatch.setattr(datahub, "time", SimpleNamespace(time=lambda: 1_700_000_000.0))  # same stamps each call
    monkeypatch.setattr(datahub, "iceberg_columns", lambda _p, _ident: [])  # no catalog here: no schemas
    return p


def no_parsing(monkeypatch) -> list[str]:
    """Every way run-time lineage could parse SQL raises (sqlglot's parser itself, and the
    platform's entry points, whose results may be cached from earlier tests)."""
    import sqlglot.parser

    from lakehouse.lineage import columns
    from lakehouse.sql import parse as sqlparse

    calls: list[str] = []

    def forbidden(name):
        def f(*_a, **_k):
            calls.append(name)
            raise AssertionError(f"{name} called during a run")
        return f

    monkeypatch.setattr(sqlglot.parser.Parser, "parse", forbidden("sqlglot Parser.parse"))
    for mod, name in ((sqlparse, "parse_one"), (sqlparse, "tables_in_sql"), (sqlparse, "shared_query"),
                      (columns, "column_lineage"), (columns, "parse_one")):
        monkeypatch.setattr(mod, name, forbidden(f"{mod.__name__}.{name}"))
    return calls


def proposals(platform: Platform, stage: str) -> list[dict]:
    ctx = StageContext(platform, PIPELINE, stage, run_id="run1")
    return [m.to_obj() for m in datahub.run_mcps(ctx, None, success=True, started_ms=1)]


def parsed_proposals(platform: Platform, stage: str, monkeypatch) -> list[dict]:
    """The proposals as the run made them before: every stored derivation ignored, the SQL parsed."""
    with monkeypatch.context() as m:
        m.setattr(StageContext, "stored_derivation", lambda self: {})
        return proposals(platform, stage)


@pytest.mark.parametrize("stage", ["silver_clean", "gold_aggregate"])
def test_a_sql_stage_runs_lineage_is_read_not_parsed_and_unchanged(platform, stage, monkeypatch):
    before = parsed_proposals(platform, stage, monkeypatch)
    fine = [p for p in before if p["aspectName"] == "upstreamLineage"]
    assert fine and json.loads(fine[0]["aspect"]["value"])["fineGrainedLineages"], "the SQL stages have column lineage"
    calls = no_parsing(monkeypatch)
    after = proposals(platform, stage)
    assert after == before
    assert calls == []


def test_the_recovery_check_reads_the_stored_upstreams(platform, monkeypatch):
    ctx = StageContext(platform, PIPELINE, "gold_aggregate", run_id="run1")
    calls = no_parsing(monkeypatch)
    assert recovery.sql_table_overrides(ctx) == {}  # one route into gold: nothing probed, nothing parsed
    assert calls == []


def test_a_stage_changed_behind_applys_back_is_parsed_again(platform, monkeypatch):
    """The stored row is checked against the rows as stored now: after a plain-SQL edit of the
    stage its lineage follows the new SQL (and the stale row is not used)."""
    st_t = sa.table("stages", sa.column("pipeline_id"), sa.column("stage_name"), sa.column("transformation"))
    new_sql = "SELECT user_id, event_date, total_events AS n FROM gold.daily_user_events"
    with platform.store.engine.begin() as conn:
        conn.execute(sa.update(st_t).where(st_t.c.pipeline_id == PIPELINE, st_t.c.stage_name == "gold_aggregate")
                     .values(transformation=new_sql))
        assert conn.execute(sa.select(sa.func.count()).select_from(derived_stages)).scalar() == 3
    catalog = platform.catalog()
    gold = catalog.stage(PIPELINE, "gold_aggregate")
    assert stored_derivations(platform.store, catalog, [gold]) == {}
    assert set(stored_derivations(platform.store, catalog, [catalog.stage(PIPELINE, "silver_clean")])) == {
        (PIPELINE, "silver_clean")}
    assert StageContext(platform, PIPELINE, "gold_aggregate", catalog=catalog).stored_derivation() == {}
    lineage = [p for p in proposals(platform, "gold_aggregate") if p["aspectName"] == "upstreamLineage"][0]
    cols = {f["downstreams"][0].rsplit(",", 1)[1].rstrip(")")
            for f in json.loads(lineage["aspect"]["value"])["fineGrainedLineages"]}
    assert "n" in cols  # the new SQL's output column: parsed from the SQL as stored now
