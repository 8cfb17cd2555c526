"""A re-apply costs what changed (issue 22): the static checks of issue 17 run again only for the
stages whose answer can differ from the last apply's, and rows that are what they were are not
written again — without losing a guarantee: a change upstream that breaks a downstream stage's SQL,
a downstream rule, or a referential rule elsewhere is still refused, and nothing is applied.

Fast (no Spark, no server): SQLite control DBs under tmp_path.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

from lakehouse.metadata.loader import MetadataError, load_metadata
from lakehouse.metadata.store import MetadataStore
from tests.conftest import seed_control_db
from tests.test_derived_metadata import Watch, copies, derived_rows, store_of


@pytest.fixture
def home(tmp_path, monkeypatch, control_db_at_head) -> Path:
    seed_control_db(control_db_at_head, tmp_path)
    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path))
    for var in ("LAKEHOUSE_CONTROL_DB_URL", "LAKEHOUSE_CATALOG_URI", "LAKEHOUSE_WAREHOUSE", "LAKEHOUSE_CATALOG_NAME"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def with_readers(meta: Path) -> Path:
    """Three copies of the demo, plus in pipeline p2 two stages that read p0's silver table without
    SQL of their own: `copy` takes it whole (source_id naming the target) under a rule on `device`;
    `lookup` checks its keys exist in it (a referential rule, no dataflow edge)."""
    doc = yaml.safe_load((meta / "pipelines.yaml").read_text())
    doc["targets"] += [{"target_id": "copy_t", "namespace": "gold", "table": "events_copy"},
                       {"target_id": "lookup_t", "namespace": "gold", "table": "events_lookup"}]
    doc["stages"] += [
        {"pipeline_id": "p2", "stage_order": 10, "stage_name": "copy", "layer": "gold", "source_id": "silver_user_events0",
         "target_id": "copy_t", "validation_set_id": "copy_rules"},
        {"pipeline_id": "p2", "stage_order": 11, "stage_name": "lookup", "layer": "gold",
         "source_id": "silver_user_events2", "target_id": "lookup_t", "validation_set_id": "lookup_rules"}]
    doc["validation_rules"] += [
        {"rule_set_id": "copy_rules", "rules": [{"name": "device_known", "type": "not_null", "columns": ["device"]}]},
        {"rule_set_id": "lookup_rules", "rules": [
            {"name": "event_exists", "type": "referential_integrity", "columns": ["event_id"],
             "ref_dataset": "silver_user_events0", "ref_columns": ["event_id"]}]}]
    (meta / "pipelines.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return meta


def edit_sql(meta: Path, name: str, old: str, new: str) -> None:
    f = meta / "sql" / name
    text = f.read_text()
    assert old in text
    f.write_text(text.replace(old, new))


def refused(store: MetadataStore, meta: Path) -> list[str]:
    """apply refuses `meta` and the control DB keeps what it had."""
    before = derived_rows(store)
    with pytest.raises(MetadataError) as exc:
        store.apply(load_metadata(meta, check_refs=False))
    assert derived_rows(store) == before
    return exc.value.problems


@pytest.fixture
def applied(home) -> tuple[MetadataStore, Path]:
    meta = with_readers(copies(home / "meta", 3))
    store = store_of(home)
    store.apply(load_metadata(meta))
    return store, meta


def test_upstream_change_that_breaks_a_downstream_rule_is_refused(applied):
    store, meta = applied
    # p0's silver stops outputting `device`: its own SQL and rules are fine, p2's copy stage's rule is not
    edit_sql(meta, "silver0.sql", "country, device\n", "country\n")
    edit_sql(meta, "silver0.sql", "    device,\n", "")
    problems = refused(store, meta)
    assert any("device_known" in p and "'device'" in p and "stage p2.copy" in p for p in problems), problems
    assert len(problems) == 1, problems


def test_upstream_change_that_breaks_downstream_sql_is_refused(applied):
    store, meta = applied
    # p1's silver renames user_id: p1's gold SQL (COUNT(DISTINCT user_id)) reads a column that is gone
    edit_sql(meta, "silver1.sql", "SELECT event_id, user_id,", "SELECT event_id, user_id AS uid,")
    problems = refused(store, meta)
    assert any("gold1.sql" in p and "'user_id'" in p for p in problems), problems


def test_upstream_change_that_breaks_a_referential_rule_elsewhere_is_refused(applied):
    store, meta = applied
    # p0's silver renames event_id: p2's lookup (no dataflow edge to p0) looks it up there
    edit_sql(meta, "silver0.sql", "SELECT event_id, user_id,", "SELECT event_id AS id, user_id,")
    problems = refused(store, meta)
    assert any("event_exists" in p and "ref_columns ['event_id']" in p for p in problems), problems


def test_a_rule_change_is_checked_for_every_stage_using_it(applied):
    store, meta = applied
    doc = yaml.safe_load((meta / "pipelines.yaml").read_text())
    rs = next(r for r in doc["validation_rules"] if r["rule_set_id"] == "gold_daily_rules")
    rs["rules"].append({"name": "no_such", "type": "not_null", "columns": ["nope"]})
    (meta / "pipelines.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    problems = refused(store, meta)
    assert sorted(p.split("(stage ")[1].split(")")[0] for p in problems if "no_such" in p) == [
        f"p{i}.gold_aggregate" for i in range(3)]


def test_reapply_parses_only_the_changed_pipelines_sql_and_rewrites_nothing_unchanged(applied, monkeypatch):
    store, meta = applied
    edit_sql(meta, "silver1.sql", "WHERE rn = 1", "WHERE rn = 1 AND event_type <> 'test'")
    loaded = load_metadata(meta, check_refs=False)
    watch = Watch(monkeypatch, store.engine)
    try:
        assert store.apply(loaded)["derived_stages"] == 1
    finally:
        watch.close()
    parsed = {sql for sql in watch.parsed if "FROM" in sql.upper()}
    assert parsed and all("user_events1" in sql for sql in parsed), parsed  # p1's silver (and gold: downstream)
    # one stage row changed: one DELETE + INSERT of it, then its derived row; nothing else rewritten
    assert watch.statements.count("INSERT") == 2, watch.statements

    watch = Watch(monkeypatch, store.engine)
    try:
        assert store.apply(load_metadata(meta, check_refs=False))["derived_stages"] == 0
    finally:
        watch.close()
    assert "INSERT" not in watch.statements and "DELETE" not in watch.statements
    assert not [sql for sql in watch.parsed if "FROM" in sql.upper()]


def test_a_stage_changed_behind_applys_back_is_checked_again(applied):
    """Plain SQL that breaks a stage leaves its stored derivation out of date: the next apply of
    anything checks that stage again, instead of trusting the last apply."""
    store, meta = applied
    from lakehouse.metadata.store import TABLES

    stages, _ = TABLES["stages"]
    with store.engine.begin() as conn:
        conn.execute(sa.update(stages).where(stages.c.pipeline_id == "p2", stages.c.stage_name == "gold_aggregate")
                     .values(transformation="SELECT nope FROM silver.user_events2"))
    other = meta.parent / "other"
    other.mkdir()
    (other / "p.yaml").write_text(yaml.safe_dump({"pipelines": [{"pipeline_id": "extra"}]}))
    problems = refused(store, other)
    assert any("stages['p2', 3].transformation" in p and "'nope'" in p for p in problems), problems
